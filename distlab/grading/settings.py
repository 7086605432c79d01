"""A grading run's settings, one immutable object made from the command line and handed to each
process that needs it: the orchestration (which hides folders and starts workers), each worker
(as JSON on its command line), and through ``CheckSettings`` the kernels and the judge.

What a rank may do (distrust, working folder, confinement) is the launcher's part of it
(``distlab.runtime.launch.LaunchSettings``), made per worker by ``launch_settings``.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from distlab.checks.ranks import CheckSettings

DEFAULT_MEMORY_GB = 6.0


@dataclasses.dataclass(frozen=True)
class GradingSettings:
    backend: str = "auto"               # the checks' ranks: gloo, nccl, auto or both
    rank_timeout: float = 60.0          # seconds before a check's ranks count as hung
    timeout: float = 300.0              # seconds per cell
    notebook_timeout: float = 900.0     # seconds for all cells of a notebook
    memory_limit: float = DEFAULT_MEMORY_GB   # GB for all of a student's processes
    hide: tuple[str, ...] = ()          # folders students' code may not read (grading, submissions, scores)
    views: str = ""                     # the folder of the student packages, one per lab (views/<lab>)

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_limit * 2**30)

    def checks(self) -> CheckSettings:
        return CheckSettings(backend=self.backend, rank_timeout=self.rank_timeout)

    def fingerprint(self) -> dict[str, str]:
        """What changes a grade: a recorded result made with other values is graded again."""
        return {k: str(v) for k, v in sorted(dataclasses.asdict(self).items())
                if k not in ("hide", "views")}

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "GradingSettings":
        fields = json.loads(text)
        fields["hide"] = tuple(fields.get("hide", ()))
        return cls(**fields)

    def view(self, lab: str) -> str | None:
        """The folder holding the student package for grading ``lab`` (None: no views made)."""
        return str(Path(self.views) / lab) if self.views else None

    def hidden_from_students(self) -> tuple[str, ...]:
        """What a process that runs a student's code may not read: the hidden folders and, once
        there are student packages to import instead, the instructor's package."""
        from distlab import paths
        return (*self.hide, str(paths.PACKAGE)) if self.views else self.hide

    def readable_to_students(self, lab: str) -> tuple[str, ...]:
        """What such a process may read inside the hidden folders: the lab's student package and
        the course's data (inside the package, for an installed course)."""
        from distlab import paths
        return (self.view(lab), str(paths.data().resolve())) if self.views else ()

    def launch_settings(self, scratch: str, confine: bool, labs: tuple[str, ...] = (),
                        student: bool = False, spawn=None):
        """How the judge's launcher treats ranks that run a student's code: read with
        safe_pickle only, started in ``scratch``, confined to it (where Landlock exists), kept
        out of the hidden folders; its zygote imports what ``labs``' checks need. ``student``:
        the ranks import distlab from the student package of the lab graded (the one lab in
        ``labs``) and cannot read the instructor's (their zygote is forked by ``spawn``, the
        kernels' server, which holds no answer, or else is a fresh interpreter: never forked
        from the worker, which holds answers); else, or without views, their zygote is forked
        from the worker, which has imported torch and the checks, or by ``spawn`` where the
        worker cannot fork (a reference run that a check starts from the judge's thread)."""
        from distlab.runtime.launch import LaunchSettings
        package = self.view(labs[0]) if student and self.views else None
        return LaunchSettings(distrust=True, cwd=scratch,
                              confine=(scratch,) if confine else (),
                              hide=self.hidden_from_students() if package else self.hide,
                              readable=self.readable_to_students(labs[0]) if package else (),
                              package=package,
                              preload=rank_modules(labs), fork_zygote=package is None,
                              spawn=spawn,
                              # a student's ranks reach no network but their own, on which
                              # every byte they send is counted (distlab.runtime.wire)
                              own_network=student)


def rank_modules(labs: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The course modules every rank of a check imports (the judge's call wrapper, the checks
    with their references and helpers), and the PyTorch modules the ``labs``' checks name in
    ``RANK_IMPORTS`` (all of ``TORCH_EXTRAS`` for a lab that names none): the judge's zygote
    imports them once, so that each of a check's ranks, forked from it, does not import them
    again (tens of runs per notebook). A lab whose ranks use none of PyTorch's parallel APIs
    saves its grading the second they take to import."""
    import pkgutil
    import distlab.checks
    from distlab.runtime.zygote import TORCH_EXTRAS
    torch_modules = dict.fromkeys(name for lab in labs for name in getattr(
        distlab.checks.checks_module(lab), "RANK_IMPORTS", TORCH_EXTRAS))
    return ("distlab.grading.judge", *(f"distlab.checks.{m.name}"
                                       for m in pkgutil.iter_modules(distlab.checks.__path__)),
            *torch_modules)
