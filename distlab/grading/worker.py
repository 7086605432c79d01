"""The nbgrader worker: one student's labs, in a process of its own.

``python -m distlab.grading.worker ROOT STUDENT SETTINGS_JSON ROWS_FD LAB...`` is started by the
orchestration (``distlab.grading.orchestrate``) in the student's course folder. For each lab it
runs ``nbgrader autograde`` with the judge serving the test cells' checks
(``distlab.grading.judge``), scores the test cells from the judge's record
(``distlab.grading.scoring``), writes the feedback, and sends one result row (a JSON line) on
ROWS_FD, a pipe that no kernel or rank holds. It is a child subreaper: whatever the student's
code starts is reparented here and killed after each lab.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

from distlab.grading.settings import GradingSettings

# What a worker imports before it grades, in ``main`` (torch with the rank launcher, jupyter_client,
# nbgrader's stack): about 2 CPU-s that a worker forked from the run's server
# (``distlab.grading.worker_server``) finds paid. No checks module of a lab (their references):
# each worker imports its labs' after its kernels' server is forked. What the run's labs' ranks
# import of PyTorch (torch._dynamo, which the judge's references import too with every optimizer,
# 1.1-1.4 CPU-s) the server imports once the views name it (``WorkerServer.preload``).
START_MODULES = ("distlab.grading.sandbox", "distlab.grading.warm_kernels",
                 "distlab.runtime.landlock", "distlab.runtime.launch", "distlab.grading.disk",
                 "distlab.grading.course_dir", "distlab.grading.execution",
                 "distlab.grading.judge", "distlab.grading.nbgrader_plugins",
                 "distlab.grading.scoring", "nbformat", "nbgrader.utils", "psutil")


def main(argv: list[str]) -> int:
    start, cpu = time.monotonic(), _cpu_seconds()
    import gc
    gc.disable()   # the start imports, which make no garbage: collected from freeze_imported on
    root, student, settings_json, rows_fd, *labs = argv
    from distlab.grading.imports import skip_slow_imports
    skip_slow_imports()
    from distlab.grading import sandbox
    # What the kernels' server shares with this process, imported before it is forked: torch
    # (with the rank launcher) and jupyter_client. nbgrader's stack, which the server never
    # uses, comes after the fork, while the server imports the kernels' own modules.
    from distlab.grading.imports import freeze_imported
    from distlab.grading.warm_kernels import WarmKernels
    from distlab.runtime import landlock
    from distlab.runtime.launch import Launcher  # noqa: F401 - torch, before the fork
    freeze_imported(collect_after=False)   # the modules, here and in the kernels' server

    settings = GradingSettings.from_json(settings_json)
    root = Path(root)
    os.set_inheritable(int(rows_fd), False)  # no kernel or rank may write rows of its own
    reaper = sandbox.become_subreaper()  # orphans of the student's code come back here to be killed
    sandbox.die_with_parent()   # and this worker goes with a grader that is killed outright
    folders = _private_folders(root)
    # The server of this student's kernels is forked from this process, which has imported
    # torch, before any thread starts (distlab.runtime.forked), and before it imports a single
    # answer (the checks' references): the kernels run the student's code.
    kernels = WarmKernels({**os.environ, **_kernel_env(folders)},
                          cwd=str(folders["jupyter"])) if reaper else None
    if kernels is not None:   # after the fork: these import the checks modules, answers too
        from distlab.grading.settings import rank_torch_modules
        kernels.preload(rank_torch_modules(tuple(labs)))
    from distlab.grading import disk
    from distlab.grading.course_dir import nbgrader_api
    from distlab.grading.execution import Guards
    from distlab.grading.judge import Judge
    from distlab.grading.nbgrader_plugins import (FeedbackExporter, NotebookBudget, faster_nbgrader,
                                                  load_config)
    faster_nbgrader()
    # nbgrader's stack too: each lab's collections scan only its own objects. Collected again
    # from here on, before anything is forked from this process (the judge's zygote).
    freeze_imported()
    confine = landlock.landlock_abi() > 0
    scratch = str(folders["judge_scratch"])
    # The ranks of references a check computes on ranks (forked from here, with the instructor's
    # package), and the ranks of the student's code (the first lab's student package).
    spawn = kernels.spawn_zygote if kernels else None
    judge = Judge(settings.launch_settings(scratch, confine, labs=tuple(labs),
                                                             spawn=spawn),
                  student=settings.launch_settings(scratch, confine, (labs[0],), student=True,
                                                   spawn=spawn))
    _one_intra_op_thread()
    guards = Guards(judge=judge, cpu_clock=_cpu_seconds)
    watch = sandbox.MemoryWatch(os.getpid(), settings.memory_bytes,
                                on_kill=lambda event: _note_memory_kill(guards, event))

    def keep() -> set:   # the judge's zygotes and the kernels' server: each costs seconds to start
        return {*judge.launcher.zygote_pids(), kernels and kernels.pid}

    # All the student's folders together: the lab folders, the kernel's and the ranks' scratch.
    disk_watch = disk.DiskWatch(
        [root / "autograded" / student, root / "scratch", folders["kernel_sockets"]],
        settings.disk_bytes, stop=lambda: _stop_student_processes(keep()),
        on_stop=lambda event: guards.death_notes.append(str(event)))
    budget = NotebookBudget(settings.timeout, settings.notebook_timeout)
    config = load_config()
    config.Execute.timeout = int(settings.timeout)
    config.Execute.timeout_func = budget
    # How late the kernel itself may be, not the student's code (the budget bounds that): on a
    # busy machine nbclient's defaults, 4 s for a cell's last messages after its reply and 60 s
    # to start, fail the whole notebook's autograde, every test "missing" (a Lab 5 answer at
    # load 16, in bench/grading_scale.py run twice beside a test suite).
    config.Execute.iopub_timeout = 120
    config.Execute.startup_timeout = 300
    # Every cell's output is in by then: a graceful shutdown only waits for the kernel's atexit
    # (seconds); what it leaves behind is killed after the lab like any leftover.
    config.Execute.shutdown_kernel = "immediate"
    # Kernels talk to nbclient over Unix sockets in a folder of this worker's, not on TCP ports:
    # a port that jupyter_client picked free can be taken by another process before the kernel
    # binds it ("Address already in use"), and that kernel then hung on its way out while the
    # notebook waited startup_timeout and lost every test (a Lab 5 answer, two grading runs side
    # by side in bench/grading_scale.py).
    config.KernelManager.transport = "ipc"
    config.KernelManager.ip = str(folders["kernel_sockets"] / "kernel")
    config.GradedExecute.guards = guards
    config.GenerateFeedback.exporter_class = FeedbackExporter   # its templates compiled once
    config.WarmKernelManager.kernels = kernels
    # Each kernel's own channel to the judge, handed over as it starts (no address to connect to).
    config.WarmKernelManager.judge = judge
    api = nbgrader_api(root, config=config)
    started = {"seconds": round(time.monotonic() - start, 2),
               "cpu_seconds": round(_cpu_seconds() - cpu, 2)}
    with watch, disk_watch, os.fdopen(int(rows_fd), "w") as rows_out:
        for lab in labs:
            budget.reset()
            judge.reset()
            guards.test_costs.clear()
            _set_teaching(guards, root, lab)
            if lab != labs[0]:
                judge.use(settings.launch_settings(scratch, confine, (lab,), student=True,
                                                   spawn=spawn))
            lab_dir = root / "autograded" / student / lab
            _write_kernelspec(folders, lab_dir, settings, lab)
            row = _grade_lab(api, root, student, lab, judge, settings)
            _kill_leftovers(keep=keep())
            # What this notebook cost since the last one (the first: since the worker started).
            now = (time.monotonic(), _cpu_seconds())
            row["cost"] = {"seconds": round(now[0] - start, 2),
                           "cpu_seconds": round(now[1] - cpu, 2),
                           "tests": dict(guards.test_costs)}
            if lab == labs[0]:   # the first lab's cost holds the worker's start: said apart
                row["cost"]["worker_start"] = started
            start, cpu = now
            rows_out.write(json.dumps(row) + "\n")
            rows_out.flush()
        # Before the last row's pipe closes: the grader kills this worker as soon as it has
        # every row, which left a folder in /tmp for every student graded.
        shutil.rmtree(folders["kernel_sockets"], ignore_errors=True)
    if kernels is not None:
        kernels.close()
    judge.close()   # its zygote's exit: the grader does not wait for it
    return 0


def _one_intra_op_thread() -> None:
    """Every lab's checks' own torch work in the judge (references, comparisons) on one intra-op
    thread: tensors this small gain nothing from more, and on 2 shared cores the threads spin
    against each other (a hidden GPipe check's comparisons: 3.5 CPU-s at load 25, then 0.3;
    Lab 6's bucket-plan comparisons: 1.5 CPU-s, then 0.1). Called after this process's forks
    (the kernels' server, the judge's zygote): setting it may start and join torch's thread pool,
    and a fork needs a single thread. Torch hands the setting to every thread's first parallel
    op, the judge's thread's too; ranks set their own (``distlab.runtime.rank``)."""
    import torch
    torch.set_num_threads(1)


def _cpu_seconds() -> float:
    """CPU seconds (user + system) this worker and its descendants have used so far: its own,
    its reaped children's, and the descendants' with their reaped children (a zygote and the
    kernel server live across labs). A descendant that has exited but is not reaped yet (a
    killed kernel, a zombie until its parent waits) is counted too: its time moves to its
    parent's once reaped, and was lost in between (a lab's tests then cost more than the lab).
    The difference over a lab is what grading it cost."""
    import resource
    from distlab.grading.sandbox import descendants
    total = sum(getattr(resource.getrusage(who), field) for who in
                (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN) for field in ("ru_utime", "ru_stime"))
    ticks = os.sysconf("SC_CLK_TCK")
    for pid in descendants(os.getpid(), exited=True):
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:   # gone since it was listed: its parent counts it once reaped
            continue
        total += sum(int(x) for x in fields[11:15]) / ticks   # utime stime cutime cstime
    return total


def _set_teaching(guards, root: Path, lab: str) -> None:
    """The lab's teaching-only cells, from the instructor's source notebook (not the student's)."""
    import nbformat
    from distlab.grading.execution import teaching_ids
    guards.teaching.clear()
    source = root / "source" / lab / f"{lab}.ipynb"
    if source.exists():
        guards.teaching.update(teaching_ids(nbformat.read(source, as_version=4)))


def _note_memory_kill(guards, event) -> None:
    """Why the kernel died, for the cell it died in (distlab.grading.execution reads the notes)."""
    guards.death_notes.append(
        f"its processes used more than the grader's memory limit of {event.limit / 2**30:.1f} GiB "
        f"({event.total / 2**30:.1f} GiB; the largest, {event.command[:80]!r}, was killed)")


def _stop_student_processes(keep: set) -> int:
    """Kill the kernel and every rank (the zygotes in ``keep`` stay, their ranks go); how many."""
    import psutil
    from distlab.grading.sandbox import kill_tree
    return sum(kill_tree(child.pid, include_root=child.pid not in keep)
               for child in psutil.Process().children())


def _kill_leftovers(keep: set) -> None:
    """Kill everything the lab's kernel left behind (orphans were reparented to this worker)."""
    import psutil
    from distlab.grading.sandbox import kill_tree
    for child in psutil.Process().children():
        if child.pid not in keep:
            kill_tree(child.pid)


def _private_folders(root: Path) -> dict[str, Path]:
    """Folders of the worker: the kernel spec (the student's code may not write there), the
    kernel's sockets, and the scratch folders the kernel and the judge's ranks may write. (The
    judge has no folder: kernels reach it through descriptors, ``Judge.channel``.)"""
    # The kernel's sockets: a short path of their own (a Unix socket path holds at most 107
    # bytes, which a deep work directory or a long student name would pass).
    short = "/tmp" if os.path.isdir("/tmp") else None
    folders = {"kernel_sockets": Path(tempfile.mkdtemp(prefix="distlab-kernel-", dir=short)),
               "jupyter": root / "jupyter", "kernel_scratch": root / "scratch" / "kernel",
               "judge_scratch": root / "scratch" / "judge"}
    for folder in folders.values():
        folder.mkdir(parents=True, exist_ok=True)
    os.environ["JUPYTER_PATH"] = str(folders["jupyter"])
    # jupyter_client writes each kernel's connection file to a temporary folder: the kernel must
    # be able to read it, so it is the kernel's scratch folder (the judge's ranks get their own).
    for name in ("TMPDIR", "JUPYTER_RUNTIME_DIR", "MPLCONFIGDIR"):
        os.environ[name] = str(folders["kernel_scratch"])
    return folders


def _write_kernelspec(folders: dict[str, Path], lab_dir: Path, settings: GradingSettings,
                      lab: str) -> None:
    """The kernel nbgrader starts ("python3", found first on JUPYTER_PATH): it may write only the
    lab's folder, its scratch folder and its sockets' folder, no file past the disk limit, read
    only those and what ``settings.readable_to_students`` names (the system's folders, the
    Python installation, the lab's student package, which it imports distlab from). (Its judge
    channel comes with each start: ``WarmProvisioner``.)"""
    from distlab.runtime.zygote import PACKAGE_ENV
    scratch = folders["kernel_scratch"]
    writable = (lab_dir, scratch, folders["kernel_sockets"])
    view = settings.view(lab)
    argv = [sys.executable, "-m", "distlab.runtime.landlock",
            *[arg for folder in writable for arg in ("--write", str(folder))],
            "--max-file-size", str(settings.disk_bytes),
            *[arg for folder in settings.hidden_from_students() for arg in ("--hide", folder)],
            *[arg for folder in settings.readable_to_students(lab) for arg in ("--read", folder)],
            "--", sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    env = _kernel_env(folders)
    if view:   # a cold kernel finds it on PYTHONPATH, a warm one switches to it (warm_kernels)
        env.update({PACKAGE_ENV: view, "PYTHONPATH": os.pathsep.join(
            filter(None, [view, os.environ.get("PYTHONPATH")]))})
    spec = folders["jupyter"] / "kernels" / "python3"
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": argv, "env": env, "display_name": "Python 3 (graded)", "language": "python",
        "interrupt_mode": "signal"}))


def _kernel_env(folders: dict[str, Path]) -> dict[str, str]:
    """What the kernel spec adds to the worker's environment: every cache and temporary folder
    in the kernel's scratch folder."""
    scratch = folders["kernel_scratch"]
    return {"HOME": str(scratch), "TMPDIR": str(scratch), "JUPYTER_PATH": "",
            "MPLCONFIGDIR": str(scratch / "matplotlib"), "IPYTHONDIR": str(scratch / "ipython"),
            "XDG_CACHE_HOME": str(scratch / "cache")}


# nbgrader ends a failed autograde with this line, after the log records that say why
_GENERIC = "Please see the the above traceback"
_RAISED = re.compile(r"^\s*[\w.]+(Error|Exception|Exit|Interrupt)\b")


def nbgrader_cause(graded: dict) -> str:
    """The line of an nbgrader result (autograde's, feedback's) that says why it failed: the last
    exception in its log (where nbgrader's converter wrote the traceback), else its last ERROR
    record, never the closing "see the above traceback" of its own exception alone, which tells
    an instructor nothing (seen on an H100: bench/reports/gpu-2026-11-27-1813-vm.md)."""
    text = "\n".join(filter(None, [graded.get("log"), graded.get("error")]))
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    useful = [line for line in lines if _GENERIC not in line]
    causes = ([line for line in useful if _RAISED.match(line)]
              or [line for line in useful if line.startswith("[ERROR]")] or lines or ["no log"])
    return causes[-1][-300:]


def kernel_start_error() -> str:
    """Why the graded kernel dies at its start, from its own stderr: its spec's command (the
    confinement included) importing the kernel alone. A package the kernel needs outside the
    Python installation, on PYTHONPATH, is unreadable to it (``readable_to_students``)."""
    import subprocess
    spec = json.loads(Path(os.environ["JUPYTER_PATH"], "kernels", "python3",
                           "kernel.json").read_text())
    argv = spec["argv"][:spec["argv"].index("ipykernel_launcher") - 1]
    try:
        done = subprocess.run([*argv, "-c", "import ipykernel_launcher"], capture_output=True,
                              text=True, timeout=120, env={**os.environ, **spec["env"]})
    except subprocess.TimeoutExpired:
        return " (its start, tried again alone, took over 120 s)"
    last = [line for line in done.stderr.splitlines() if line.strip()][-1:]
    if done.returncode == 0 or not last:
        return ""
    return (f" (tried alone, the kernel's start says: {last[0].strip()[:200]}; the graded kernel "
            f"reads only the Python installation's folders, not PYTHONPATH's others)")


def _grade_lab(api, root: Path, student: str, lab: str, judge, settings) -> dict:
    """nbgrader autograde, then the judge's record overrides what the kernel showed, then
    feedback (the lab folder's files up to its limit); one result row."""
    import nbformat
    from nbformat.v4 import new_markdown_cell
    from nbgrader.utils import is_grade
    from distlab.grading import disk
    from distlab.grading.scoring import annotate, read_flags, score_tests
    row = {"student": student, "lab": lab, "score": 0.0, "max_score": None, "tests": {},
           "messages": {}, "points": {}, "flags": [], "feedback": ""}
    graded = api.autograde(lab, student, force=True, create=True)
    if not graded["success"]:
        cause = nbgrader_cause(graded)
        if "Kernel died" in cause:
            cause += kernel_start_error()
        row["flags"].append("nbgrader autograde failed: " + cause)
    nb_path = root / "autograded" / student / lab / f"{lab}.ipynb"
    nb = nbformat.read(nb_path, as_version=4) if nb_path.exists() else None
    cells = {c.metadata.nbgrader["grade_id"]: c for c in (nb.cells if nb else [])
             if c.cell_type == "code" and is_grade(c)}
    overrides = score_tests(root, student, lab, cells, judge, row)
    limit = int(settings.feedback_files * 2**20)
    skips = disk.feedback_skips(nb_path.parent, limit)
    if nb is not None:
        annotate(nb, cells, overrides, read_flags(root, lab))
        if skips:
            nb.cells.insert(0, new_markdown_cell(disk.skipped_note(skips, limit)))
        nbformat.write(nb, nb_path)
    with disk.left_out(api.coursedir, skips):
        feedback = api.generate_feedback(lab, student, force=True) if graded["success"] else graded
    html = root / "feedback" / student / lab / f"{lab}.html"
    if html.exists():
        row["feedback"] = str(html)
    elif feedback.get("success") is False:
        row["flags"].append("feedback not generated: " + nbgrader_cause(feedback))
    return row


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
