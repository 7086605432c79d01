"""The graded checks, one module per lab (``lab01`` for ``01_collectives``), called from test cells.

Each module defines ``check_*`` functions (visible tests use the stored references in ``data/``,
hidden tests pass a fresh ``seed``) and ``make_references()``, which ``distlab references`` writes
to ``data/<lab>/``. A module may name in ``RANK_IMPORTS`` the PyTorch modules its checks' ranks
import beyond ``torch.distributed``, as measured by grading the solution with a judge that
preloads none and listing what each rank imported (not only the parallel APIs: the first
optimizer a rank builds imports ``torch._dynamo``, most of a second): the grader's judge imports
those once, before forking ranks, and one that names none gets all of
``distlab.runtime.zygote.TORCH_EXTRAS`` (about a second of CPU time).
"""
import importlib


def checks_module(lab: str):
    """``distlab.checks.lab01`` for lab ``01_collectives``."""
    return importlib.import_module(f"distlab.checks.lab{lab.split('_', 1)[0]}")
