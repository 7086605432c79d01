"""Submissions that attack the grader or break down in ways it must survive (Lab 1 throughout).

Each sample is the Lab 1 student notebook with some answers filled in and some code added to a
solution cell, as a student could hand it in. ``attack_samples()`` gives each with the status
every test must get; tests/test_grader_attacks.py grades them all in one run beside an honest
``bystander`` and checks the rest (feedback, files, processes).
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import nbformat
import psutil

from distlab.runtime.landlock import landlock_abi

from . import replace_cell, solved, student

LAB = "01_collectives"
TESTS = ("test_all_reduce_rs_ag", "test_ring_all_reduce", "test_bandwidths", "test_alpha_beta")
# In the command line of every process the sample leaves; this test process's own, so that a
# second copy of the suite running beside this one (its orphans alive while it grades them) is
# not taken for this one's.
ORPHAN_MARK = f"distlab-test-orphan-{os.getpid()}"
MEMORY_LIMIT_GB = 3                         # the grading run's --memory-limit
# A second copy of the course on the grading machine (an instructor's other checkout, a later
# week's handout unpacked), where any process may read it: planted by the test before grading.
COURSE_COPY = Path(tempfile.gettempdir()) / f"distlab-test-course-copy-{os.getpid()}"


def _append(nb: nbformat.NotebookNode, grade_id: str, code: str) -> nbformat.NotebookNode:
    """``nb`` with ``code`` added at the end of solution cell ``grade_id``."""
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == grade_id:
            cell.source = cell.source.rstrip() + "\n\n" + code
            return nb
    raise KeyError(grade_id)


def _statuses(*statuses: str) -> dict[str, str]:
    return dict(zip(TESTS, statuses))


# 1. Replace every checking function and comparison, and turn the judge off, in the kernel.
PATCH_CHECKS = '''\
import numpy, torch, torch.testing, distlab.checks.assertions, distlab.checks.lab01 as lab01
torch.allclose = lambda *args, **kwargs: True
torch.testing.assert_close = lambda *args, **kwargs: None
numpy.allclose = lambda *args, **kwargs: True
distlab.checks.assertions.assert_close = lambda *args, **kwargs: None
for name in lab01.__all__:
    setattr(lab01, name, lambda *args, **kwargs: None)
check_all_reduce_rs_ag = check_ring_all_reduce = check_bandwidths = check_alpha_beta = \\
    check_bus_factor = check_ring_model = lambda *args, **kwargs: None
import os
os.environ.pop("DISTLAB_JUDGE", None)
'''

# 2. Read the stored references, and fix the hidden tests' seed to one whose answers it knows.
READ_REFERENCES = '''\
def all_reduce_rs_ag(tensor):
    """Calls the right collectives for show, then returns an answer read from disk (the stored
    references) or rebuilt from a seed it fixed in the kernel."""
    n = dist.get_world_size()
    flat = tensor.reshape(-1)
    padded = torch.cat([flat, flat.new_zeros((-flat.numel()) % n)])
    shard = padded.new_empty(padded.numel() // n)
    dist.reduce_scatter_single(shard, padded)
    dist.all_gather_single(torch.empty_like(padded), shard)
    from distlab.course.references import load
    from distlab.checks.lab01 import all_reduce_inputs
    stored = load("01_collectives", f"all_reduce_ws{n}")
    if stored["inputs"].shape[1] == tensor.numel():
        return stored["expected"].clone()
    return all_reduce_inputs(n, tensor.numel(), 4321).sum(0)

import distlab.checks.assertions
distlab.checks.assertions.fresh_seed = fresh_seed = lambda: 4321
'''

# 3. Skip the work (issue 41). Route 3: the ring's sum by a ProcessGroup's own all-reduce, which
# the in-rank record does not see, and a ring of chunk-sized messages of zeros for the record;
# caught by the bytes the kernel counted (distlab.checks.crossed). Route 1: Lab 1's frame walk
# (tests/submissions/frame_walk.py) to every rank's row on the rank body's stack, where a rank
# now holds its own row only. Both passed their test when the ranks held every row and the
# record alone was graded (tests/test_lab01.py shows the search finding a planted row).
HIDES_ALL_REDUCE = '''\
def ring_all_reduce(tensor):
    """The sum by one all-reduce outside the record, then the ring's messages for show."""
    n, r = dist.get_world_size(), dist.get_rank()
    out = tensor.clone()
    dist.distributed_c10d._get_default_group().allreduce([out]).wait()
    chunks = list(torch.tensor_split(torch.zeros_like(out).reshape(-1), n))
    for phase in ("reduce", "gather"):
        for step in range(n - 1):
            send_c = (r - step) % n if phase == "reduce" else (r + 1 - step) % n
            work = dist.isend(chunks[send_c].contiguous(), (r + 1) % n)
            dist.recv(torch.empty_like(chunks[(send_c - 1) % n]), (r - 1) % n)
            work.wait()
    return out
'''


def frame_walk_cell() -> str:
    """Lab 1's frame-walk answer as a student's cell: the functions' own source."""
    import inspect
    from . import frame_walk
    parts = [inspect.getsource(f) for f in (frame_walk._frames, frame_walk._values,
                                             frame_walk.steal_rows, frame_walk.all_reduce_rs_ag)]
    return "import sys\n\n\n" + "\n\n".join(parts)


# 4. The kernel dies: by os._exit, by a segfault, by killing itself.
EXIT = "import os\nos._exit(0)\n"
SEGFAULT = "import ctypes\nctypes.string_at(0)\n"
KILL_KERNEL = "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n"

# 5. A rank that sleeps forever; a function the check calls that never returns.
SLEEPS = '''\
def ring_all_reduce(tensor):
    """Rank 1 never comes back."""
    import time
    if dist.get_rank() == 1:
        time.sleep(10**6)
    out = tensor.clone()
    dist.all_reduce(out)
    return out
'''
ENDLESS = '''\
def bus_factor(comms, nbytes):
    return sum(c.bytes for c in comms if c.op in ("send", "isend")) / nbytes

def bandwidths(nbytes, seconds, factor):
    """Loops forever, outside any collective."""
    while True:
        pass
'''

# 6. Floods: memory far beyond the limit; output without end.
MEMORY = "hog = [torch.ones(2**27) for _ in range(64)]   # 32 GiB, touched\n"
OUTPUT = '''\
while True:                          # 1.2 MB a line, for ever
    try:
        print('flood ' * 200_000)
    except KeyboardInterrupt:        # ignores the grader's interrupt: the kernel must be killed
        pass
'''

# 7. Processes left behind: a double-forked daemon from the kernel and one from a rank, and a
# thread that never ends.
ORPHANS = f'''\
import subprocess, sys, threading, time
DAEMON = "import os, sys, time\\nif os.fork():\\n    sys.exit(0)\\nos.setsid()\\ntime.sleep(3600)"
subprocess.Popen([sys.executable, "-c", DAEMON, "{ORPHAN_MARK}"], start_new_session=True)
threading.Thread(target=time.sleep, args=(3600,)).start()

def _leave_a_daemon(rank, world_size):
    subprocess.Popen([sys.executable, "-c", DAEMON, "{ORPHAN_MARK}"], start_new_session=True)

distlab.run(_leave_a_daemon, 2)
'''

# 8. Writes outside its folder: its own gradebook (full marks), the scores, another student's
# submission, the references, the grader's folder; from the kernel and from a rank. And reads of
# what is not its own: another student's submission, the grader's template.
WRITES = '''\
import os, sqlite3
from pathlib import Path
here = Path.cwd()                       # <work>/students/<me>/autograded/<me>/<lab>
course = here.parents[4].parent         # where the test keeps submitted/ and scores.csv
TARGETS = {
    "own gradebook": here.parents[2] / "gradebook.db",
    "scores": course / "scores.csv",
    "another submission": course / "submitted" / "bystander" / "01_collectives" / "01_collectives.ipynb",
    "references": Path(distlab.__file__).resolve().parents[1] / "data" / "01_collectives" / "manifest.json",
    "grader folder": here.parents[2] / "jupyter" / "planted.txt",   # the kernel spec's
}
refused = []
for name, path in TARGETS.items():
    try:
        with open(path, "a") as f:
            f.write("WRITTEN-BY-A-STUDENT")
    except OSError:
        refused.append(name)
try:
    db = sqlite3.connect(TARGETS["own gradebook"])
    db.execute("update grade set manual_score = 100")
    db.commit()
except Exception:
    refused.append("own gradebook (sql)")
print("refused:", refused)
unreadable = []
for name, path in {"another submission": TARGETS["another submission"],
                   "the grader's template": here.parents[4] / "template"}.items():
    try:   # neither its names nor its files' text can be read (rglob skips what it cannot list)
        files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
        open(files[0], "rb").read(1)
    except (OSError, IndexError):
        unreadable.append(name)
print("unreadable:", unreadable)

def _write_from_rank(rank, world_size, path):
    try:
        with open(path, "a") as f:
            f.write("WRITTEN-BY-A-STUDENT")
        return "written"
    except OSError:
        return "refused"

print("from ranks:", list(distlab.run(_write_from_rank, 2, str(TARGETS["scores"]))))
'''

# 9. Copy the lab's own solution out of the instructor's course at grading time (the solutions,
# the git history, the grader's source notebooks): it would be graded as the student's code.
COPIES_SOLUTION = '''\
import ast, json, subprocess
from distlab import paths

def _answer_from(text):
    tree = ast.parse(text)
    keep = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "all_reduce_rs_ag"]
    exec(compile(ast.Module(body=keep, type_ignores=[]), "copied", "exec"), globals())
    return bool(keep)

def _notebook_code(path):
    cells = json.loads(path.read_text())["cells"]
    return "\\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")

SOURCES = {
    "the lab's source": lambda: paths.lab_source("01_collectives").read_text(),
    "the git history": lambda: subprocess.run(
        ["git", "-C", str(paths.root()), "show", "HEAD:solutions/01_collectives/01_collectives.py"],
        capture_output=True, text=True, check=True).stdout,
    "the grader's source notebook": lambda: _notebook_code(
        paths.root() / "build" / "source" / "01_collectives" / "01_collectives.ipynb"),
}
copied = []
for where, read in SOURCES.items():
    try:
        if _answer_from(read()):
            copied.append(where)
    except Exception:
        pass
print("copied from:", copied)
'''


# 10. Read the lab's answers from other copies of the course on the grading machine: a second
# copy in the temporary folder and the instructor's own checkout; from the kernel and a rank.
READS_COURSE_COPY = '''\
import ast

def _answer_from(path):
    tree = ast.parse(open(path).read())
    keep = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "all_reduce_rs_ag"]
    exec(compile(ast.Module(body=keep, type_ignores=[]), "copied", "exec"), globals())
    return bool(keep)

def _read_on_rank(rank, world_size, path):
    try:
        open(path).read(1)
        return "read"
    except OSError as exc:
        return type(exc).__name__

copied = []
for where, path in @COPIES@.items():
    try:
        if _answer_from(path):
            copied.append(where)
    except OSError as exc:
        print(f"{where}: {type(exc).__name__}")
print("copied from other copies:", copied)
print("other copy from ranks:", list(distlab.run(_read_on_rank, 2, @COPY@)))
'''

# 11. Fill the disk: 300 MB into the lab's folder, in files of 50 MB (each under the size limit
# of one file), then wait for the grader to notice.
FILLS_DISK = '''\
import time
for i in range(6):
    with open(f"filler{i}.bin", "wb") as f:
        for _ in range(50):
            f.write(bytes(2**20))
time.sleep(60)
'''


def plant_course_copy() -> Path:
    """Put a copy of Lab 1's solution at COURSE_COPY, readable by every process; the folder."""
    from distlab import paths
    source = paths.lab_source(LAB)
    target = COURSE_COPY / "solutions" / LAB / source.name
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(source, target)
    return COURSE_COPY


def _course_copies() -> dict[str, str]:
    from distlab import paths
    source = paths.lab_source(LAB)
    return {"a second copy": str(COURSE_COPY / "solutions" / LAB / source.name),
            "the instructor's checkout": str(source.resolve())}


# Answers in memory: a process that imported the instructor's package (or was forked from one)
# holds the course's implementations, whatever its sys.modules says; the kernel and the judge's
# ranks must hold none of Lab 1's (they import its student package).
SEEKS_ANSWERS = '''\
import gc, types
_LAB1_ANSWERS = @ANSWERS@

def _answers_held():
    return sorted({f.__qualname__ for f in gc.get_objects() if isinstance(f, types.FunctionType)
                   and f.__qualname__ in _LAB1_ANSWERS
                   and "is yours to write" not in repr(f.__code__.co_consts)})

print("answers held in the kernel:", _answers_held())
_own_bandwidths = bandwidths

def bandwidths(nbytes, seconds, factor):
    print("answers held on the rank:", _answers_held())
    return _own_bandwidths(nbytes, seconds, factor)
'''


def _answers_of(lab: str) -> set[str]:
    """The qualnames of ``lab``'s answers, as the checks modules declare them."""
    from distlab.grading.student_package import answers_by_lab
    return {name.partition(":")[2] for name, owner in answers_by_lab().items() if owner == lab}


def orphans() -> list[psutil.Process]:
    """The processes the orphans sample left that are still running."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if ORPHAN_MARK in " ".join(proc.info["cmdline"] or []):
            found.append(proc)
    return found


def attack_samples() -> dict[str, tuple[nbformat.NotebookNode, dict[str, str]]]:
    """{student: (Lab 1 notebook, {test: status it must get})}."""
    ok = _statuses("pass", "pass", "pass", "pass")
    deleted = solved(LAB)
    deleted.cells = [c for c in deleted.cells
                     if c.metadata.get("nbgrader", {}).get("grade_id") != "test_ring_all_reduce"]
    return {
        "bystander": (solved(LAB), ok),
        "patched_checks": (_append(student(LAB), "all_reduce_rs_ag", PATCH_CHECKS),
                           _statuses("tampered", "tampered", "tampered", "tampered")),
        "reads_references": (replace_cell(solved(LAB), "all_reduce_rs_ag", READ_REFERENCES),
                             {**ok, "test_all_reduce_rs_ag": "fail"}),
        "deleted_test": (deleted, {**ok, "test_ring_all_reduce": "missing"}),
        # Both routes in one notebook (one grading, not two): each fails its own test only.
        "skips_the_work": (replace_cell(replace_cell(solved(LAB), "ring_all_reduce", HIDES_ALL_REDUCE),
                                        "all_reduce_rs_ag", frame_walk_cell()),
                           {**ok, "test_all_reduce_rs_ag": "fail", "test_ring_all_reduce": "fail"}),
        "exits": (_append(solved(LAB), "ring_all_reduce", EXIT),
                  _statuses("pass", "not-run", "not-run", "not-run")),
        "segfaults": (_append(solved(LAB), "bandwidths", SEGFAULT),
                      _statuses("pass", "pass", "not-run", "not-run")),
        "kills_kernel": (_append(solved(LAB), "alpha_beta", KILL_KERNEL),
                         _statuses("pass", "pass", "pass", "not-run")),
        "sleeps": (replace_cell(solved(LAB), "ring_all_reduce", SLEEPS),
                   {**ok, "test_ring_all_reduce": "hang"}),
        "endless_loop": (replace_cell(solved(LAB), "bandwidths", ENDLESS),
                         {**ok, "test_bandwidths": "hang"}),
        "memory_flood": (_append(solved(LAB), "bandwidths", MEMORY),
                         _statuses("pass", "pass", "not-run", "not-run")),
        "output_flood": (_append(solved(LAB), "alpha_beta", OUTPUT),
                         _statuses("pass", "pass", "pass", "not-run")),
        "orphans": (_append(solved(LAB), "bandwidths", ORPHANS), ok),
        "writes_outside": (_append(student(LAB), "bandwidths", WRITES),
                           _statuses("not-done", "not-done", "not-done", "not-done")),
        "seeks_answers": (_append(solved(LAB), "bandwidths", SEEKS_ANSWERS.replace(
            "@ANSWERS@", repr(sorted(_answers_of(LAB))))), ok),
        "copies_solution": (_append(student(LAB), "all_reduce_rs_ag", COPIES_SOLUTION),
                            _statuses("not-done", "not-done", "not-done", "not-done")),
        # Without Landlock nothing stops the read: the grader warns that it cannot confine.
        "reads_course_copy": (_append(student(LAB), "all_reduce_rs_ag", READS_COURSE_COPY.replace(
            "@COPIES@", repr(_course_copies())).replace("@COPY@", repr(_course_copies()[
                "a second copy"]))), _statuses("pass" if not landlock_abi() else "not-done",
                                               "not-done", "not-done", "not-done")),
        "fills_disk": (_append(solved(LAB), "bandwidths", FILLS_DISK),
                       _statuses("pass", "pass", "not-run", "not-run")),
    }


__all__ = ["attack_samples", "orphans", "plant_course_copy", "COURSE_COPY", "ORPHAN_MARK",
           "MEMORY_LIMIT_GB", "LAB", "TESTS", "HIDES_ALL_REDUCE", "frame_walk_cell"]
