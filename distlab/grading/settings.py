"""A grading run's settings, one immutable object made from the command line and handed to each
process that needs it: the orchestration (which hides folders and starts workers), each worker
(as JSON on its command line), and through ``CheckSettings`` the kernels and the judge.

What a rank may do (distrust, working folder, confinement) is the launcher's part of it
(``distlab.runtime.launch.LaunchSettings``), made per worker by ``launch_settings``.
"""
from __future__ import annotations

import dataclasses
import json
import os
import site
import sys
from pathlib import Path

from distlab.checks.ranks import CheckSettings

DEFAULT_MEMORY_GB = 6.0
DEFAULT_DISK_MB = 200.0
# What the system needs a student's code to read, beside the Python installation, its lab's
# student package and its own folders (``GradingSettings.system_reads``): shared libraries and
# programs, configuration, devices, the kernel's views of processes and hardware.
SYSTEM_READS = ("/usr", "/lib", "/lib32", "/lib64", "/bin", "/sbin", "/etc", "/proc", "/sys",
                "/dev")


@dataclasses.dataclass(frozen=True)
class GradingSettings:
    backend: str = "auto"               # the checks' ranks: gloo, nccl, auto or both
    rank_timeout: float = 60.0          # seconds before a check's ranks count as hung
    timeout: float = 300.0              # seconds per cell
    notebook_timeout: float = 900.0     # seconds for all cells of a notebook
    memory_limit: float = DEFAULT_MEMORY_GB   # GB for all of a student's processes
    hide: tuple[str, ...] = ()          # never readable to students' code, even in a readable folder
    views: str = ""                     # the folder of the student packages, one per lab (views/<lab>)
    system_reads: tuple[str, ...] = SYSTEM_READS   # what else students' code may read (see above)
    disk_limit: float = DEFAULT_DISK_MB  # MB that all of a student's folders may hold while graded
    feedback_files: float = 20.0        # MB of a lab folder's files copied into its feedback

    @property
    def disk_bytes(self) -> int:
        return int(self.disk_limit * 2**20)

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_limit * 2**30)

    def checks(self) -> CheckSettings:
        return CheckSettings(backend=self.backend, rank_timeout=self.rank_timeout)

    def fingerprint(self) -> dict[str, str]:
        """What changes a grade: a recorded result made with other values is graded again."""
        return {k: str(v) for k, v in sorted(dataclasses.asdict(self).items())
                if k not in ("hide", "views", "system_reads", "feedback_files")}

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "GradingSettings":
        fields = json.loads(text)
        for name in ("hide", "system_reads"):
            if name in fields:
                fields[name] = tuple(fields[name])
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
        """What such a process may read besides its own folders (an allow-list): what the system
        needs, the Python installation, the lab's student package (the instructor's where no
        views were made) and the course's data."""
        from distlab import paths
        package = self.view(lab) or str(paths.PACKAGE)
        return (*self.system_reads, *python_installation(), package, str(paths.data().resolve()))

    def launch_settings(self, scratch: str, confine: bool, labs: tuple[str, ...] = (),
                        student: bool = False, spawn=None):
        """How the judge's launcher treats ranks that run a student's code: read with
        safe_pickle only, started in ``scratch``, writing only there (where Landlock exists); its
        zygote imports what ``labs``' checks need. ``student``: the ranks read only what
        ``readable_to_students`` allows, write no file past the disk limit, import distlab from
        the student package of the lab graded (the one lab in ``labs``) and cannot read the
        instructor's (their zygote is forked by ``spawn``, the kernels' server, which holds no
        answer, or else is a fresh interpreter: never forked from the worker, which holds
        answers); else (reference ranks, which run no student code: they read anywhere), or
        without views, their zygote is forked from the worker, which has imported torch and the
        checks, or by ``spawn`` where the worker cannot fork (a reference run that a check
        starts from the judge's thread)."""
        from distlab.runtime.launch import LaunchSettings
        package = self.view(labs[0]) if student and self.views else None
        return LaunchSettings(distrust=True, cwd=scratch,
                              confine=(scratch,) if confine else (),
                              hide=self.hidden_from_students() if student else (),
                              readable=self.readable_to_students(labs[0]) if student else None,
                              file_limit=self.disk_bytes if student else 0,
                              package=package,
                              preload=rank_modules(labs), guarded=guarded_names(labs),
                              fork_zygote=package is None,
                              spawn=spawn,
                              # a student's ranks reach no network but their own, on which
                              # every byte they send is counted (distlab.runtime.wire)
                              own_network=student)


def python_installation() -> tuple[str, ...]:
    """The folders of the Python that grades (and runs the kernels and ranks): its prefixes and
    the site-packages it imports from, those a ``.pth`` file names too (a virtual environment
    layered on another's packages). Not the other folders ``.pth`` files add to sys.path: an
    editable install of the course adds its checkout, answers included. (An installed course
    inside a site-packages is hidden separately: ``hidden_from_students``.)"""
    layered = [p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages")
               and os.path.isdir(p)]
    folders = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
               *site.getsitepackages(), *layered]
    user = site.getusersitepackages() if site.ENABLE_USER_SITE else None
    if user and user in sys.path:
        folders.append(user)
    return tuple(dict.fromkeys(folders))


def rank_modules(labs: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The course modules every rank of a check imports (the judge's call wrapper, the checks
    with their references and helpers), and the PyTorch modules the ``labs``' checks name in
    ``RANK_IMPORTS`` (``rank_torch_modules``): the judge's zygote imports them once, so that each
    of a check's ranks, forked from it, does not import them again (tens of runs per notebook)."""
    import pkgutil
    import distlab.checks
    return ("distlab.grading.judge", *(f"distlab.checks.{m.name}"
                                       for m in pkgutil.iter_modules(distlab.checks.__path__)),
            *rank_torch_modules(labs))


def rank_torch_modules(labs: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The PyTorch modules the ``labs``' checks name in ``RANK_IMPORTS`` (all of ``TORCH_EXTRAS``
    for a lab that names none). A lab whose ranks use none of PyTorch's parallel APIs saves its
    grading the second they take to import: in the judge's zygote, and in the kernels' server
    that forks it (``distlab.grading.warm_kernels``), which imports these for the zygotes. (It
    imports the checks modules, answers included: never call it in a process that is to fork
    one that runs a student's code.)"""
    import distlab.checks
    from distlab.runtime.zygote import TORCH_EXTRAS
    names = []
    for lab in labs:
        module = distlab.checks.checks_module(lab)
        names += [*getattr(module, "RANK_IMPORTS", TORCH_EXTRAS), *guarded_torch_modules(module)]
    return tuple(dict.fromkeys(names))


def guarded_names(labs: tuple[str, ...]) -> tuple[str, ...]:
    """Every name the ``labs``' checks guard, for their ranks' zygote to prepare the watch of
    once (``distlab.runtime.call_guard.prepare``)."""
    import distlab.checks
    return tuple(dict.fromkeys(name for lab in labs
                               for name in _guarded_by(distlab.checks.checks_module(lab))))


def _guarded_by(checks_module) -> tuple[str, ...]:
    """The names ("module:qualname") a checks module's course-code guards name (``COURSE_CODE``)."""
    entries = getattr(checks_module, "COURSE_CODE", {}).values()
    return tuple(dict.fromkeys(name for entry in entries
                               for name in (*entry.forbidden, *entry.watched)))


def guarded_torch_modules(checks_module) -> tuple[str, ...]:
    """The PyTorch modules a checks module's course-code guards name (``COURSE_CODE``: Lab 11's,
    PyTorch's own pipeline schedules): a guarded rank resolves every guarded name as it starts
    (``call_guard.Watch``), importing its module, and torch.distributed.pipelining imports
    torch._dynamo, 1.5-3 CPU-s on every rank of every run unless its zygote imported it."""
    return tuple(dict.fromkeys(name.partition(":")[0] for name in _guarded_by(checks_module)
                               if name.startswith("torch.")))
