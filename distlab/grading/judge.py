"""The judge: graded checks run in the grader's process, never in the student's kernel.

A student's kernel runs the student's code, so anything in it can be replaced: the checking
functions, ``torch.allclose``, the seed a hidden test draws. Grades therefore never depend on what
the kernel computes or prints. During grading (``distlab grade``) every ``check_*`` function of
``distlab.checks`` is a thin messenger in the kernel: it sends the objects the test names (the
student's functions and classes as cloudpickle bytes, data as ``torch.save`` bytes) to the judge, a
server thread in the grader's worker process, and shows the judge's verdict. A kernel reaches
its judge through a socketpair the worker made for that kernel (``Judge.channel``), handed to it
as it starts: no path, no name, nothing another student's process can connect to
(``distlab.grading.judge_channels``).

The judge

- never unpickles the student's code itself: ``Submitted`` carries the bytes into ranks forked
  from the judge's own zygote, which is confined to a scratch folder (``distlab.grading.sandbox``), and
  everything the ranks send back is read with ``distlab.runtime.safe_pickle``;
- takes each check's keyword arguments (seeds, sizes, world sizes) from the instructor's source of
  the test cell, evaluated in its own process: ``seed=fresh_seed()`` draws the judge's seed, so
  hidden inputs and references exist nowhere before the test runs, and only in the judge and its
  ranks; only the positional arguments (the student's objects) come from the kernel;
- computes references and makes every comparison in its own process;
- takes one word from the kernel: that a function is still the handout's stub (its body only
  raises NotImplementedError), and then fails its check without starting ranks (a lie can only
  cost the student's own points);
- records a verdict per check, attributed to the test cell the grader is executing.

The grader then scores a test cell from the judge's record: a cell whose checks never reached the
judge (replaced or skipped in the kernel), or whose kernel showed success while the judge failed
it, scores zero with a message that says so.

The collective record (``Results.comms``) is kept by the rank process that runs the student's
code, so a student could skip or forge it; a check that grades it first compares it with the
bytes the kernel counted leaving each rank (``Results.wire``, ``distlab.checks.crossed``). Where
a check's ranks legitimately use collectives the record never sees (DDP, DTensor, FSDP2), the
record alone is graded: that much of *how* the judge cannot vouch for (never the values).
"""
from __future__ import annotations

import ast
import collections
import contextlib
import contextvars
import dataclasses
import importlib
import io
import os
import pickle
import re
import socket
import threading

from distlab.checks.course_code import guard_of
from distlab.checks.messenger import ENV, _recv, _send, run_check
from distlab.checks.ranks import SubmittedError
from distlab.runtime import call_guard
from distlab.runtime.launch import Launcher
from distlab.grading.judge_channels import Channels
from distlab.grading.statuses import status_of_exception

READ_TIMEOUT = 60             # seconds a kernel may take to send its request once connected
VERDICT_LINE = 4000            # characters of a passing check's returned line sent back
OUTPUT_TAIL = 8000            # characters of rank output sent back to the kernel with a verdict


# ---------------------------------------------------------------------------------------------
# The student's objects inside the judge

class Submitted:
    """A student's function or class, kept as cloudpickle bytes. The judge never unpickles it:
    pickled into a rank's task it becomes ``cloudpickle.loads(data)`` there, and calling it in the
    judge runs it on one confined rank and returns what it returned (plain data only)."""

    def __init__(self, data: bytes, name: str, stub: bool = False):
        """``stub``: the kernel said the object is still the handout's stub (``is_stub``)."""
        self.data, self.name, self.stub = data, name, stub

    def __reduce__(self):
        # Unpickled on a rank, where the check's guard looks at what the student handed in.
        from distlab.runtime.call_guard import load_submitted
        _CARRIED.set(True)   # the run carries student code: it goes to the student's ranks
        return (load_submitted, (self.data, self.name))

    def __repr__(self) -> str:
        return f"<submitted {self.name}>"

    def __call__(self, *args, **kwargs):
        import distlab
        from distlab.checks.ranks import rank_timeout
        from distlab.runtime.outcome import RankError
        try:
            out = distlab.run(_call, 1, self, args, kwargs, backend="gloo", timeout=rank_timeout())
        except RankError as exc:
            raise SubmittedError(exc.exc_type, f"{self.name} raised {exc.exc_type}:\n"
                                 f"{exc.rank_traceback.rstrip()}") from None
        return out[0]


def _call(rank: int, world_size: int, fn, args, kwargs):
    return fn(*args, **kwargs)


# ---------------------------------------------------------------------------------------------
# Two kinds of ranks: the student's, which import the student package, and the references'

_CARRIED: contextvars.ContextVar[bool] = contextvars.ContextVar("distlab_carried", default=False)


def carries_submitted(payload) -> bool:
    """Whether pickling ``payload`` (a run's function and arguments) packs a student's object.
    A ``PerRank`` argument never pickles whole (each rank gets its own value): its values are
    looked into, every rank's."""
    import cloudpickle
    from distlab.runtime.per_rank import PerRank
    fn, args, kwargs = payload

    def each(value):
        return value.values if isinstance(value, PerRank) else value
    token = _CARRIED.set(False)
    try:
        cloudpickle.dumps((fn, [each(a) for a in args], {k: each(v) for k, v in kwargs.items()}))
        return _CARRIED.get()
    finally:
        _CARRIED.reset(token)


class Ranks:
    """The judge's ranks, as ``distlab.run`` sees them inside ``active()``: a run that carries a
    student's function or class runs on the ``student`` launcher (ranks that import the student
    package of the lab graded and cannot read the instructor's); any other run, a reference the
    check computes on ranks, on the ``reference`` launcher, made on first use (ranks with the
    instructor's package, their zygote forked by the kernels' server since the judge's thread
    cannot fork): student code never runs where the answers are, and the answers are computed
    where no student code runs."""

    def __init__(self, student, reference_settings):
        self.student = student
        self.reference_settings = reference_settings
        self.reference: Launcher | None = None

    def run(self, fn, world_size: int, *args, **kwargs):
        if carries_submitted((fn, args, kwargs)):
            return self.student.run(fn, world_size, *args, **kwargs)
        if self.reference is None:
            self.reference = Launcher(self.reference_settings)
        return self.reference.run(fn, world_size, *args, **kwargs)

    @contextlib.contextmanager
    def active(self):
        from distlab.runtime import launch
        token = launch._ACTIVE.set(self)
        try:
            yield self
        finally:
            launch._ACTIVE.reset(token)

    def warm_up(self):
        return self.student.warm_up()

    def zygote_pids(self) -> set:
        return {launcher.zygote_pid() for launcher in (self.student, self.reference)
                if launcher is not None} - {None}

    def close(self) -> None:
        for launcher in (self.student, self.reference):
            if launcher is not None:
                launcher.close()


# ---------------------------------------------------------------------------------------------
# The judge's side

@dataclasses.dataclass
class Verdict:
    check: str
    status: str         # pass, fail, hang, crash, not-done, error
    message: str
    seed: int | None


class Judge:
    """Serves check requests on the channels it made for kernels (``channel``) and records a
    verdict for each, under the test cell set with ``enter``. The checks run their ranks on the
    judge's own launcher, made with ``ranks`` (a ``LaunchSettings`` that distrusts them: see
    ``GradingSettings.launch_settings``)."""

    def __init__(self, ranks, student=None):
        """``ranks``: the settings of ranks that run references; ``student``: of ranks that run
        the student's code (None: the same)."""
        # Checks run here as plain calls: never as messages to this very judge.
        os.environ.pop(ENV, None)
        self.reference_settings = ranks
        self.launcher = self._ranks(student or ranks)
        # Its zygote imports torch and the checks while nbgrader starts and the first cells run;
        # started before this judge's thread, so that it can be forked (LaunchSettings.fork_zygote).
        self.launcher.warm_up()
        self.channels = Channels()
        self.cell: str | None = None
        self.calls: dict[str, list[ast.Call]] = {}
        self.verdicts: dict[str, list[Verdict]] = collections.defaultdict(list)
        self.lock = threading.Lock()
        threading.Thread(target=self.channels.serve, args=(self._answer,), name="judge",
                         daemon=True).start()

    def __deepcopy__(self, memo):
        return self   # traitlets deep-copies config values (WarmKernelManager.judge): one judge

    def channel(self) -> socket.socket:
        """A new kernel's way to this judge: the kernel's end of a socketpair whose other end
        this judge serves. The caller hands it to the kernel as it starts (``pass_fds``, or
        SCM_RIGHTS to the warm kernels' server) and then closes its own copy."""
        return self.channels.new()

    def _ranks(self, student) -> Ranks:
        return Ranks(Launcher(student), self.reference_settings)

    def use(self, student) -> None:
        """The student's ranks from now on (a lab's student package: ``LaunchSettings.package``);
        its zygote starts now, while nbgrader starts the kernel."""
        with self.lock:
            self.launcher.student.close()
            self.launcher.student = Launcher(student)
            self.launcher.warm_up()

    # -- the grader's executor tells the judge which test cell runs
    def enter(self, cell: str | None, source: str = "") -> None:
        """The grader starts test cell ``cell`` (None: a cell that is not a test), whose source
        is the instructor's (nbgrader restored it)."""
        with self.lock:
            self.cell, self.calls = cell, _calls(source)

    def reset(self) -> None:
        with self.lock:
            self.cell, self.calls = None, {}
            self.verdicts = collections.defaultdict(list)

    # -- requests
    def _answer(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(READ_TIMEOUT)  # a peer that connects and stalls must not
            request = _recv(conn)          # block every later check
            conn.settimeout(None)
            reply = self._handle(request)
            _send(conn, pickle.dumps(reply))
        except (ConnectionError, OSError):
            pass

    def _handle(self, data: bytes) -> dict:
        try:
            name, check, args, sent = self._unpack(data)
        except Exception as exc:  # a malformed request: nothing to record
            return {"status": "error", "ename": "JudgeRequestError", "message": str(exc)}
        with self.lock:
            cell = self.cell
            call = self.calls.get(name, []).pop(0) if self.calls.get(name) else None
        if cell is None or call is None:
            return {"status": "skipped", "message": "checks run only as test cells call them"}
        kwargs = _keywords(call, check, sent)
        seed = kwargs.get("seed")
        output = io.StringIO()
        try:
            _refuse_stubs(args, kwargs)
            with contextlib.redirect_stdout(output), self.launcher.active(), \
                    call_guard.guarding(guard_of(check)):
                _, line = run_check(check, *args, **kwargs)
            status, ename, message = "pass", "", str(line)[:VERDICT_LINE]
        except Exception as exc:  # noqa: BLE001 - every failure is a verdict
            status, ename, message = status_of_exception(exc), type(exc).__name__, str(exc)
            if isinstance(exc, SubmittedError) and status == "error":
                ename = exc.exc_type
            used = _course_code_used(exc)
            if used is not None:   # the answer is the course's own: nothing else matters
                status, ename, message = "fail", "CourseCodeUsed", used
        with self.lock:
            self.verdicts[cell].append(Verdict(name, status, message, seed))
        tail = output.getvalue()[-OUTPUT_TAIL:]
        return {"status": status, "ename": ename, "message": message, "output": tail}

    def _unpack(self, data: bytes):
        from distlab.runtime.safe_pickle import loads_message, loads_value
        target, args, kwargs = loads_message(data)
        module_name, _, name = str(target).partition(":")
        if not re.fullmatch(r"distlab\.checks\.lab\d\d", module_name) or not name.startswith("check_"):
            raise ValueError(f"{target!r} is not a graded check")
        check = getattr(getattr(importlib.import_module(module_name), name, None), "__judged__", None)
        if check is None:
            raise ValueError(f"{target!r} is not a graded check")

        def unpack(item):
            kind, blob, label = item
            if kind == "data":
                return loads_value(blob)
            return Submitted(bytes(blob), str(label)[:100], stub=kind == "stub")
        args = [unpack(a) for a in args]
        kwargs = {str(k): unpack(v) for k, v in dict(kwargs).items()}
        return name, check, args, kwargs

    def close(self) -> None:
        self.launcher.close()
        self.channels.close()


def _refuse_stubs(args: list, kwargs: dict) -> None:
    """A check given nothing of the student's but stubs, functions whose body only raises
    NotImplementedError, fails without starting ranks: each would only raise it (an untouched
    notebook's every test cell starts some; about a second of CPU a notebook). Its status is the
    one that raise gives, not done. A check given one written answer runs as ever."""
    submitted = [v for v in (*args, *kwargs.values()) if isinstance(v, Submitted)]
    if submitted and all(s.stub for s in submitted):
        names = list(dict.fromkeys(s.name for s in submitted))
        it, is_ = ("them", "are") if len(names) > 1 else ("it", "is")
        raise SubmittedError("NotImplementedError", (
            f"{' and '.join(names)} raised NotImplementedError: {'they' if it == 'them' else it} "
            f"{is_} still the handout's stub, whose body only raises it, so the check ran nothing. "
            f"Write {it} in {'their cells' if it == 'them' else 'its cell'}, run "
            f"{'them' if it == 'them' else 'that cell'}, then run this test again."))


def _course_code_used(exc: BaseException) -> str | None:
    """The guard's report when a rank found the answer to be course code (``CourseCodeUsed``),
    however the check passed the rank's error on (as is, wrapped, or quoted in its message)."""
    seen, found = set(), []
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        for text in (str(exc), getattr(exc, "rank_traceback", "") or ""):
            used = call_guard.used_course_code(text)
            if used is not None:
                found.append(used)
        exc = exc.__cause__ or exc.__context__
    # The fullest report: a check may quote only the first line of the rank's error.
    return max(found, key=len) if found else None


def _calls(source: str) -> dict[str, list[ast.Call]]:
    """The check calls in a test cell's source, per check, in order."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    calls = collections.defaultdict(list)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id.startswith("check_"):
            calls[node.func.id].append(node)
    for found in calls.values():
        found.sort(key=lambda node: (node.lineno, node.col_offset))
    return calls


def _keywords(call: ast.Call, check, sent: dict) -> dict:
    """A check's keyword arguments as the instructor's source gives them, evaluated here (with
    this process's ``fresh_seed`` and the checks module's names: the kernel could have rebound
    ``fresh_seed`` or ``HIDDEN_MESH``); only a name the source takes from the notebook itself
    comes from what the kernel sent."""
    import sys
    from distlab.checks.assertions import fresh_seed
    namespace = {**vars(sys.modules[check.__module__]), "fresh_seed": fresh_seed}
    kwargs = {}
    for keyword in call.keywords:
        if keyword.arg is None:  # **mapping: nothing the source pins down
            continue
        try:
            kwargs[keyword.arg] = eval(compile(ast.Expression(keyword.value), "<test cell>", "eval"),
                                       namespace)
        except Exception:  # a name the notebook defines: the kernel's value is all there is
            if keyword.arg in sent:
                kwargs[keyword.arg] = sent[keyword.arg]
    return kwargs


# ---------------------------------------------------------------------------------------------
# Scoring a test cell from the record

def expected_checks(source: str) -> collections.Counter:
    """The checks a test cell's (instructor's) source calls, with how often: the same calls the
    judge matches requests against (a check named in a comment or a string is no call)."""
    return collections.Counter({name: len(found) for name, found in _calls(source).items()})


def review(source: str, verdicts: list[Verdict]) -> tuple[str, str] | None:
    """(status, message) for a test cell from the judge's record; None for a cell with no check
    (scored by nbgrader alone)."""
    expected = expected_checks(source)
    if not expected:
        return None
    failed = [v for v in verdicts if v.status != "pass"]
    if failed:
        first = failed[0]
        seed = f" (hidden test, seed {first.seed})" if first.seed is not None else ""
        return first.status, f"{first.check}{seed}: {first.message}"
    received = collections.Counter(v.check for v in verdicts)
    missing = expected - received
    if missing:
        names = ", ".join(f"{n} x{c}" if c > 1 else n for n, c in sorted(missing.items()))
        return "tampered", (
            f"the grader received {sum(received.values())} of this cell's {sum(expected.values())} "
            f"checks (missing: {names}): something in the notebook replaced or bypassed the "
            f"checking functions, so this test scores zero. Do not redefine check_* functions, "
            f"distlab, torch's comparison functions or the DISTLAB_JUDGE setting.")
    return "pass", ""
