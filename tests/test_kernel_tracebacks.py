"""distlab.grading.kernel_tracebacks: a graded kernel's failing cells show exactly the traceback
they showed before; only IPython's second copy (its history's, for ``%notebook``) is plain, and the
first traceback's one-time costs are paid in the warm kernels' server.

Each side runs in a fresh interpreter (the change patches IPython's shell class): the same failing
cells, once in a plain IPython shell, once in a shell of a process that ran ``prepare_server`` and
forked (as the warm kernels' server forks each kernel).
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

CELLS = [
    "import json\njson.loads('{')",                                  # deep in a module's frames
    "def answer(x):\n    # YOUR CODE HERE\n    raise NotImplementedError()\nanswer(1)",
    "from distlab.checks.assertions import CheckFailed\n"
    "def check(f):\n    raise CheckFailed('rank 1 was wrong: expected 3, got 4')\ncheck(len)",
    "undefined_name + 1",
    "raise ValueError('outer') from KeyError('inner')",
]

SHELL = textwrap.dedent("""\
    import json, os, sys
    cells = json.loads(sys.argv[2])
    if sys.argv[1] == "prepared":
        from distlab.grading import kernel_tracebacks
        kernel_tracebacks.prepare_server()
        pid = os.fork()           # a kernel forked from the server
        if pid:
            _, status = os.waitpid(pid, 0)
            sys.exit(os.waitstatus_to_exitcode(status))
    from IPython.core.interactiveshell import InteractiveShell
    shell = InteractiveShell.instance()
    shown = []
    shell._showtraceback = lambda etype, evalue, stb: shown.append(stb)
    for cell in cells:
        shell.run_cell(cell, store_history=True)
    stored = {str(k): v for k, v in shell.history_manager.exceptions.items()}
    print(json.dumps({"shown": shown, "stored": stored}))
    sys.stdout.flush()
    os._exit(0)
""")


def _run(mode: str) -> dict:
    return _run_cells(mode, CELLS)


def _run_cells(mode: str, cells: list[str]) -> dict:
    done = subprocess.run([sys.executable, "-c", SHELL, mode, json.dumps(cells)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_failing_cells_show_the_same_traceback_and_store_a_plain_one():
    before, after = _run("plain"), _run("prepared")
    assert len(before["shown"]) == len(CELLS)
    assert after["shown"] == before["shown"]   # the error outputs, byte for byte
    assert any("\x1b[" in line for stb in before["shown"] for line in stb)  # coloured, with context
    assert after["stored"].keys() == before["stored"].keys() and len(after["stored"]) == len(CELLS)
    for count, stored in after["stored"].items():
        assert (stored["ename"], stored["evalue"]) == \
            (before["stored"][count]["ename"], before["stored"][count]["evalue"])
        text = "".join(stored["traceback"])
        assert text.startswith("Traceback (most recent call last)") or "Error" in text
        assert "\x1b[" not in text and stored["evalue"] in text


def test_the_judges_failures_show_a_plain_traceback_with_the_same_name_and_message():
    """A check the judge failed raises in the test cell through the messenger: IPython shows
    Python's plain traceback of it (every frame with its line, no colours), with the name and
    message the error output always had, which is all the feedback shows of a test cell."""
    cell = ("from distlab.checks.messenger import _exception\n"
            "def check_shard(f):\n    raise _exception('CheckFailed', 'rank 1 was wrong')\n"
            "check_shard(len)")
    shown = _run_cells("plain", [cell])["shown"][0]
    assert "\x1b[" not in "".join(shown)
    assert shown[0] == "Traceback (most recent call last):"
    assert "<module>" in shown[1] and shown[2].strip() == "check_shard(len)"   # the cell's line first
    assert shown[-1] == "distlab.checks.assertions.CheckFailed: rank 1 was wrong"
