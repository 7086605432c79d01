"""The graded kernel's tracebacks: what IPython shows of a failing cell stays exactly as it is; what
it computed twice, or again in every kernel, is computed once.

An untouched notebook fails every test cell, and each failure cost its kernel about 0.2 CPU-s of
traceback formatting (bench/grading_phases.py, profiled), in two parts:

- IPython (9.x) formats a failing cell's traceback twice: once for the error output the notebook
  gets, then the same way again into ``history_manager.exceptions``, which only the ``%notebook``
  magic reads (an export of the session to a file, nothing the grader or the feedback sees). In a
  graded kernel that second copy is Python's plain traceback (``cheap_stored_tracebacks``).
- The first traceback a process formats pays for what every later one reuses: pygments compiling
  its Python lexers' regular expressions, stack_data's imports, ``inspect``'s map from files to
  modules (a scan of every loaded module, torch's included). The warm kernels' server
  (``distlab.grading.warm_kernels``) formats one before it forks any kernel
  (``warm_tracebacks``), so each kernel starts with them done.

Both leave the error output of every cell, test or not, byte for byte what it was
(tests/test_kernel_tracebacks.py compares them). What a test cell shows of a check the judge
failed is Python's plain traceback, by the exception's own ``_render_traceback_``
(``distlab.checks.messenger``): the feedback shows only its name and message.
"""
from __future__ import annotations


def prepare_server() -> None:
    """In the warm kernels' server, before it forks a kernel: both of the above."""
    cheap_stored_tracebacks()
    warm_tracebacks()


def cheap_stored_tracebacks() -> None:
    """IPython's copy of each failing cell's traceback for its history (``%notebook``) as Python's
    plain traceback, not formatted a second time with source context and colours."""
    from IPython.core.interactiveshell import InteractiveShell
    if not hasattr(InteractiveShell, "_format_exception_for_storage"):
        return   # an IPython that does not format it twice

    def stored(self, exception, filename=None, running_compiled_code=False):
        import traceback
        return {"ename": type(exception).__name__, "evalue": str(exception),
                "traceback": traceback.format_exception(exception)}
    InteractiveShell._format_exception_for_storage = stored


def warm_tracebacks() -> None:
    """Format one traceback the way a kernel's shell formats a failing cell's (its default mode
    and colours), so that what the first one costs is paid here, once, not in every kernel."""
    from IPython.core import ultratb
    from IPython.core.interactiveshell import InteractiveShell
    formatter = ultratb.AutoFormattedTB(mode=InteractiveShell.xmode.default_value,
                                        theme_name=InteractiveShell.colors.default_value)
    try:
        _raise_here()
    except ValueError as exc:
        formatter.structured_traceback(type(exc), exc, exc.__traceback__)


def _raise_here() -> None:
    raise ValueError("a traceback formatted once in the warm kernels' server")
