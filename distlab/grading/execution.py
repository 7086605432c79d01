"""Executing a student's notebook under the grader's guards (nbgrader's Execute, extended).

- The judge (``distlab.grading.judge``) is told which test cell runs, so it can file each check's verdict
  under that cell.
- Output is capped: a cell that prints more than ``max_cell_output`` characters has the rest
  dropped and is interrupted; if the cell has not finished ``flood_grace`` seconds later (it
  caught the interrupt, or the interrupt landed inside ipykernel's own printing, which can leave
  the kernel stuck), or prints as much again meanwhile (it ignores the interrupt: every second
  of it is the grading machine's CPU time), its kernel is killed.
- A kernel that dies (``os._exit``, a segfault, killed for memory) does not end the notebook's
  grading: the cell it died in shows why, the cells after it are marked as not run (so their
  tests score zero), and the tests before it keep their scores.
- Cells that only teach (tagged ``teaching`` in the lab's source: sweeps, figures, scaling
  measurements that no check reads) are not run: which cells those are comes from the
  instructor's notebook (``Guards.teaching``, by grade id), never from the student's metadata,
  and never includes a test cell. tests/test_teaching_cells.py proves no later cell reads a name
  only a teaching cell defines.
"""
from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import time

from nbclient.exceptions import DeadKernelError
from nbformat.v4 import new_output
from nbgrader.preprocessors import Execute
from nbgrader.utils import is_grade
from traitlets import Any, Float, Integer

from distlab.grading.warm_kernels import WarmKernelManager


@dataclasses.dataclass(frozen=True, eq=False)
class Guards:
    """What a grading worker shares with the executor it configures (``GradedExecute.guards``):
    its judge (told which test cell runs), and the notes on why it killed a process (the memory
    limit, a flood), newest last, which explain a dead kernel."""
    judge: object = None
    death_notes: list = dataclasses.field(default_factory=list)
    teaching: set = dataclasses.field(default_factory=set)  # grade ids not run (the worker sets them per lab)
    # What each test cell cost ({grade id: {"seconds", "cpu_seconds"}}, the worker clears it per
    # lab), by ``cpu_clock`` (the CPU seconds of the worker and its descendants: the kernel, the
    # judge's ranks), for the grading budget's table (bench/grading_budget.py).
    test_costs: dict = dataclasses.field(default_factory=dict)
    cpu_clock: object = None

    def __deepcopy__(self, memo):
        return self  # traitlets deep-copies config values: the judge and the notes are shared


def _size(content: dict) -> int:
    """Characters an output message carries."""
    if "text" in content:
        return len(content["text"])
    data = content.get("data") or {}
    size = sum(len(v) if isinstance(v, str) else len(str(v)) for v in data.values())
    return size + len(content.get("evalue", "")) + sum(map(len, content.get("traceback", [])))


def _grade_id(cell) -> str | None:
    return cell.metadata.get("nbgrader", {}).get("grade_id")


TEACHING_TAG = "teaching"


def teaching_ids(nb) -> set[str]:
    """Grade ids of the cells ``nb`` (the instructor's notebook) tags as teaching only: locked
    cells that are neither tests nor answers."""
    ids = set()
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if (cell.cell_type == "code" and TEACHING_TAG in cell.metadata.get("tags", [])
                and meta.get("locked") and not meta.get("grade") and not meta.get("solution")):
            ids.add(meta.get("grade_id"))
    return ids - {None}


def _error(ename: str, evalue: str):
    return new_output("error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])


class GradedExecute(Execute):
    max_cell_output = Integer(1_000_000, help="characters a cell may print before the rest is "
                                               "dropped and the cell is interrupted").tag(config=True)
    guards = Any(None, allow_none=True, help="the worker's Guards (None: no judge)").tag(config=True)
    flood_grace = Float(15.0, help="seconds a flooding cell has to finish after its interrupt "
                                   "before its kernel is killed").tag(config=True)

    def __init__(self, *args, **kwargs):
        # Kernels forked warm from the worker's WarmKernels (cold without one).
        kwargs.setdefault("kernel_manager_class", WarmKernelManager)
        super().__init__(*args, **kwargs)

    def preprocess(self, nb, resources=None, km=None):
        self.dead: str | None = None
        if self.guards is None:
            self.guards = Guards()
        self.deaths_before = len(self.guards.death_notes)
        return super().preprocess(nb, resources, km)

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type != "code":
            return cell, resources
        if self.dead is not None:
            cell.outputs = [_error("NotRun", f"not run: {self.dead}")]
            return cell, resources
        self.printed, self.flood_timer, self.flood_stopped = 0, None, False
        if not is_grade(cell) and _grade_id(cell) in self.guards.teaching:
            cell.outputs = []  # teaching only: no check reads it (tests/test_teaching_cells.py)
            return cell, resources
        grade_id = _grade_id(cell) if is_grade(cell) else None
        judge = self.guards.judge
        if judge is not None:
            judge.enter(grade_id, cell.source if grade_id else "")
        started = self._clock() if grade_id else None
        try:
            return super().preprocess_cell(cell, resources, index)
        except DeadKernelError:
            self.dead = self._why_dead(cell)
            cell.outputs.append(_error("DeadKernelError", self.dead))
            return cell, resources
        finally:
            if self.flood_timer is not None:
                self.flood_timer.cancel()
            if judge is not None:
                judge.enter(None)
            if started is not None:
                ended = self._clock()
                self.guards.test_costs[grade_id] = {
                    "seconds": round(ended[0] - started[0], 2),
                    "cpu_seconds": None if started[1] is None else round(ended[1] - started[1], 2)}

    def _clock(self) -> tuple[float, float | None]:
        clock = self.guards.cpu_clock
        return time.monotonic(), clock() if clock is not None else None

    def _why_dead(self, cell) -> str:
        where = cell.metadata.get("nbgrader", {}).get("grade_id") or "a cell"
        notes = self.guards.death_notes[self.deaths_before:]
        if notes:
            return f"the kernel was stopped in {where}: {notes[-1]}"
        code = self._kernel_exit_code()
        how = (f"killed by signal {signal.Signals(-code).name}" if code is not None and code < 0
               else f"exit code {code}" if code is not None else "it stopped answering")
        return (f"the kernel died in {where} ({how}): the code called os._exit, crashed the "
                f"interpreter or killed its own process")

    def _kernel_process(self):
        """The kernel's Popen (jupyter_client's local provisioner), or its ForkedProcess, or None."""
        return getattr(getattr(self.km, "provisioner", None), "process", None)

    def _kernel_exit_code(self) -> int | None:
        process = self._kernel_process()
        return process.poll() if process is not None else None

    def output(self, outs, msg, display_id, cell_index):
        self.printed += _size(msg.get("content", {}))
        if self.printed <= self.max_cell_output:
            return super().output(outs, msg, display_id, cell_index)
        if self.flood_timer is None:
            outs.append(new_output("stream", name="stdout", text=(
                f"\n[the grader dropped the rest of this cell's output: more than "
                f"{self.max_cell_output:,} characters; the cell was interrupted]\n")))
            loop = asyncio.get_event_loop()
            loop.create_task(self.km.interrupt_kernel())
            self.flood_timer = loop.call_later(self.flood_grace, self._stop_flood,
                                               f"{self.flood_grace:g} s after")
        elif self.printed > 2 * self.max_cell_output and not self.flood_stopped:
            self.flood_timer.cancel()
            self._stop_flood(f"when it had printed {self.max_cell_output:,} more characters after")
        return None

    def _stop_flood(self, when: str) -> None:
        self.flood_stopped = True
        self.guards.death_notes.append(f"it printed more than {self.max_cell_output:,} characters "
                                       f"and had not stopped {when} the grader interrupted it")
        self._kill_kernel()

    def _kill_kernel(self) -> None:
        process = self._kernel_process()
        if process is not None and process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
