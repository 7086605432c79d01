"""Confinement of a process and all it starts (Landlock, Linux 5.13+, no root needed), used by
the rank launcher (``distlab.runtime.zygote``) and the grader's kernels. Linux only: elsewhere
landlock_abi() is 0 and confine() returns False.

    landlock_abi() -> int          # Landlock ABI of this kernel; 0 when unavailable
    confine(writable) -> bool      # this process and all it starts later: writes only beneath
                                   # `writable` (+ a few /dev files); False if Landlock is missing
    sandbox_env(home) -> dict      # HOME, TMPDIR, caches of jupyter/matplotlib/torch under `home`
    private_shm(size) -> bool      # a fresh /dev/shm of `size` bytes for this process (root only)

    python -m distlab.runtime.landlock --write DIR [--write DIR ...] [--home DIR] [--shm-size 2G] -- CMD ...
        confine, then exec CMD (for a kernelspec's argv: `--write .` is the notebook's folder,
        since kernels start there). Without Landlock: one warning line on stderr, CMD runs anyway.
        The module imports nothing from distlab: `python .../distlab/runtime/landlock.py` works too.

What confine() enforces. Reading and executing stay allowed everywhere. Every filesystem right
that *modifies* something and that the kernel's ABI knows (write, truncate, create, remove,
rename/link across folders, device ioctl) is denied except beneath the writable paths, and
beneath: /dev/null, zero, full, random, urandom, tty, ptmx, pts (write + ioctl only), the GPU
device files (/dev/nvidia*, /dev/dri, /dev/kfd, /dev/infiniband: write + ioctl, needed by CUDA,
ROCm and NCCL) and /dev/shm (create and delete too). /dev/shm has to stay writable: Python's
multiprocessing locks and queues (sem_open), torch tensor sharing and NCCL's shared-memory
transport all create files there. It is shared by every process on the machine, so by default
a student could delete another student's segments or fill it (tmpfs pages that nobody maps are
in no process's PSS, so MemoryWatch cannot see them); `private_shm(size)` (CLI `--shm-size`)
closes both holes where we run as root. Not the rest of /dev: as root, /dev holds the disk
(/dev/vda) with write permission. For the same reason device nodes can never be created (mknod)
even inside the writable folders, and confine() drops every capability (bounding set included,
so exec cannot regain them): root keeps uid 0 but cannot load modules, mount, mknod, use raw
sockets or change the clock. With ABI >= 6 the process also cannot signal processes outside
its sandbox (it cannot kill the grader) nor connect to abstract unix sockets created outside.
Landlock always forbids ptrace (attach) of processes outside the sandbox, and /proc/PID/mem:
a student cannot read or change the grader's memory. Landlock leaves ptrace's "read" mode
(/proc/PID/environ, maps) open on Linux 6.18; the capability drop closes it for processes
with more capabilities (the grader). /proc/PID/cmdline stays readable, as for any process.

What breaks under confine() unless pointed into the writable folder (sandbox_env does it):
HOME (~/.cache, ~/.config, ~/.nv, ~/.triton), TMPDIR (tempfile, torch inductor), IPYTHONDIR
(IPython history), MPLCONFIGDIR (matplotlib's font cache). Writes under /proc also fail (e.g.
naming another thread with pthread_setname_np): harmless. Landlock confines the calling thread
only, so confine() refuses to run in a process that already has several threads.

Memory: MemoryWatch (distlab.grading.sandbox) measures PSS, not RSS: ranks forked from the
zygote share its torch pages copy-on-write, and RSS would count them once per rank.
"""
from __future__ import annotations

import argparse
import ctypes
import glob
import os
import stat
import sys
import threading
from functools import lru_cache
from pathlib import Path

# ---------------------------------------------------------------------------------------------
# Landlock (linux/landlock.h). Syscall numbers are the same on every architecture but alpha.

_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
REFUSED = "distlab.runtime.landlock: could not confine the command, so it was not run: {}"
_CREATE_RULESET_VERSION = 1 << 0
_RULE_PATH_BENEATH = 1

_WRITE_FILE, _REMOVE_DIR, _REMOVE_FILE = 1 << 1, 1 << 4, 1 << 5
_MAKE_CHAR, _MAKE_DIR, _MAKE_REG, _MAKE_SOCK = 1 << 6, 1 << 7, 1 << 8, 1 << 9
_MAKE_FIFO, _MAKE_BLOCK, _MAKE_SYM = 1 << 10, 1 << 11, 1 << 12
_REFER, _TRUNCATE, _IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15          # ABI 2, 3, 5
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1         # ABI 6

# The modifying rights each ABI added (reading and executing are never handled: allowed).
_MODIFY_BY_ABI = {1: (_WRITE_FILE | _REMOVE_DIR | _REMOVE_FILE | _MAKE_CHAR | _MAKE_DIR | _MAKE_REG
                      | _MAKE_SOCK | _MAKE_FIFO | _MAKE_BLOCK | _MAKE_SYM),
                  2: _REFER, 3: _TRUNCATE, 5: _IOCTL_DEV}
_READ_FILE, _READ_DIR = 1 << 2, 1 << 3                # handled only when something is hidden
_FILE_RIGHTS = _WRITE_FILE | _TRUNCATE | _IOCTL_DEV | _READ_FILE   # all a rule on a file may hold
_DEVICE_NODES = _MAKE_CHAR | _MAKE_BLOCK              # never granted: mknod of a disk = the disk

# Device files a process needs to write (or ioctl); directories cover what is beneath them.
_DEV_FILES = ["/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty",
              "/dev/ptmx", "/dev/pts", "/dev/dri", "/dev/kfd", "/dev/infiniband"]
_DEV_SHM = "/dev/shm"


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # __attribute__((packed)): 12 bytes
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


@lru_cache(maxsize=None)
def libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def _syscall(number: int, *args) -> int:
    return libc().syscall(ctypes.c_long(number), *args)


def _oserror(what: str, advice: str = "") -> OSError:
    code = ctypes.get_errno()
    return OSError(code, f"{what}: {os.strerror(code)}" + (f". {advice}" if advice else ""))


@lru_cache(maxsize=None)
def landlock_abi() -> int:
    """The Landlock ABI version of this kernel; 0 when unavailable (old kernel, Landlock not in
    the boot's LSM list, a seccomp filter that blocks the syscall, not Linux)."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        abi = _syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0),
                       ctypes.c_uint32(_CREATE_RULESET_VERSION))
    except Exception:  # no libc, no syscall(): nothing to confine with
        return 0
    return max(int(abi), 0)


def _handled_rights(abi: int) -> int:
    return sum(bits for since, bits in _MODIFY_BY_ABI.items() if abi >= since)


def _attr_size(abi: int) -> int:
    # Older kernels know a shorter struct; give each exactly the fields it knows.
    return 8 if abi < 4 else 16 if abi < 6 else 24


def _allow(ruleset_fd: int, path: str, rights: int) -> None:
    """Allow `rights` beneath `path` (a file gets only the rights a file can have)."""
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # a folder that does not exist (or a dangling link) has nothing to allow
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            rights &= _FILE_RIGHTS
        rule = _PathBeneathAttr(rights, fd)
        if _syscall(_SYS_ADD_RULE, ctypes.c_int(ruleset_fd), ctypes.c_int(_RULE_PATH_BENEATH),
                    ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
            raise _oserror(f"landlock_add_rule for {path}")
    finally:
        os.close(fd)


def _dev_rules(handled: int) -> list[tuple[str, int]]:
    files = _DEV_FILES + sorted(glob.glob("/dev/nvidia*"))   # nvidiactl, nvidia0, -uvm, -caps ...
    return [(p, handled & _FILE_RIGHTS) for p in files] + [(_DEV_SHM, handled & ~_DEVICE_NODES)]


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def _require_single_thread(what: str) -> None:
    # Landlock, capabilities and mount namespaces apply to the calling thread only (and to what
    # it starts later): other threads would stay free.
    n = _threads()
    if n > 1:
        raise RuntimeError(
            f"{what} must run before this process starts any thread: it applies to the calling "
            f"thread only, and {n - 1} other thread(s) exist here (importing torch starts one). "
            f"Call it first thing, or start the code under `python -m distlab.runtime.landlock`.")


def confine(writable: list[str | os.PathLike], *, hidden: list[str | os.PathLike] = (),
            readable: list[str | os.PathLike] = (), drop_capabilities: bool = True) -> bool:
    """Confine this process and everything it starts later, irreversibly: no filesystem change
    outside `writable` (paths that do not exist are skipped) and the few /dev files listed in
    the module docstring; with Landlock ABI >= 6 no signal to, and no abstract unix socket of, a
    process outside. Drops every capability unless `drop_capabilities=False`. No file beneath a
    `hidden` folder can be read, except beneath the `writable` and `readable` ones it holds.
    True when confined, False without Landlock (the caller should then detect writes). Raises
    RuntimeError if the process already has threads, OSError if Landlock refuses the ruleset."""
    return _confine(writable, drop_capabilities, True, hidden=hidden, readable=readable)


def readable_roots(hidden: list[str]) -> list[str]:
    """Landlock only allows, so "everything but the hidden folders" is spelled out: walking down
    from / toward each hidden folder, every entry beside the way (whole subtrees). Folders on the
    way stay traversable and listable; files created there later are not readable."""
    hidden = [os.path.realpath(h) for h in hidden]

    def within(path: str, folder: str) -> bool:
        return path == folder or path.startswith(folder.rstrip("/") + "/")

    roots: list[str] = []

    def walk(folder: str) -> None:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            return
        for entry in entries:
            real = os.path.realpath(entry.path)  # a symlink into a hidden folder is hidden too
            if any(within(real, h) for h in hidden):
                continue
            if entry.is_symlink() and any(within(h, real) for h in hidden):
                continue  # a link to a folder on the way: its real path is walked instead
            if entry.is_dir(follow_symlinks=False) and any(within(h, entry.path) for h in hidden):
                walk(entry.path)
            else:
                roots.append(entry.path)

    walk("/")
    return roots


def _confine(writable, drop_capabilities: bool, single_thread: bool, hidden=(), readable=()) -> bool:
    abi = landlock_abi()
    if abi == 0:
        return False
    if single_thread:
        _require_single_thread("confine()")
    handled = _handled_rights(abi) | (_READ_FILE | _READ_DIR if hidden else 0)
    scoped = _SCOPE_SIGNAL | _SCOPE_ABSTRACT_UNIX_SOCKET if abi >= 6 else 0
    attr = _RulesetAttr(handled, 0, scoped)
    ruleset = _syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(_attr_size(abi)),
                       ctypes.c_uint32(0))
    if ruleset < 0:
        raise _oserror(f"landlock_create_ruleset (ABI {abi})",
                       "Report this kernel (uname -r) with the error")
    try:
        if hidden:
            # Any folder may be listed (Python lists those it imports from, site-packages among
            # them, which may hold a hidden package); no file beneath a hidden folder is read.
            _allow(ruleset, "/", _READ_DIR)
            for path in [*readable_roots([os.fspath(h) for h in hidden]),
                         *(os.fspath(r) for r in readable)]:
                _allow(ruleset, path, _READ_FILE | _READ_DIR)
        for path in writable:
            _allow(ruleset, os.fspath(path), handled & ~_DEVICE_NODES)
        for path, rights in _dev_rules(handled):
            _allow(ruleset, path, rights)
        # Landlock requires no_new_privs (or CAP_SYS_ADMIN): no setuid binary can escape it.
        if libc().prctl(ctypes.c_int(38), ctypes.c_ulong(1), ctypes.c_ulong(0),
                         ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0:
            raise _oserror("prctl(PR_SET_NO_NEW_PRIVS)")
        if drop_capabilities:
            _drop_capabilities()
        if _syscall(_SYS_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            raise _oserror("landlock_restrict_self")
    finally:
        os.close(ruleset)
    return True


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def _drop_capabilities() -> None:
    """Empty the bounding, ambient, effective, permitted and inheritable sets. Why: Landlock
    guards paths, but root with capabilities can act without paths (init_module, mount, raw
    sockets, settimeofday, mknod). With the bounding set empty, exec cannot give them back."""
    c = libc()
    try:
        last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    except (OSError, ValueError):
        last = 63
    for cap in range(last + 1):  # PR_CAPBSET_DROP; EPERM without CAP_SETPCAP: none to drop then
        c.prctl(ctypes.c_int(24), ctypes.c_ulong(cap), ctypes.c_ulong(0), ctypes.c_ulong(0),
                   ctypes.c_ulong(0))
    c.prctl(ctypes.c_int(47), ctypes.c_ulong(4), ctypes.c_ulong(0), ctypes.c_ulong(0),
               ctypes.c_ulong(0))  # PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL
    header = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3: two 32-bit data words
    data = (_CapData * 2)()
    if c.capset(ctypes.byref(header), data) != 0:
        raise _oserror("capset (dropping capabilities)")


def sandbox_env(home: str | os.PathLike) -> dict[str, str]:
    """Environment variables that point every per-user cache and temp folder into `home`
    (created, with its subfolders): set them for a confined process so that IPython, matplotlib,
    torch and CUDA find writable places. `home` must be among the writable paths."""
    home = Path(home).resolve()
    env = {"HOME": home, "TMPDIR": home / "tmp", "XDG_CACHE_HOME": home / ".cache",
           "XDG_CONFIG_HOME": home / ".config", "XDG_DATA_HOME": home / ".local" / "share",
           "IPYTHONDIR": home / ".ipython", "MPLCONFIGDIR": home / ".config" / "matplotlib"}
    for folder in env.values():
        folder.mkdir(parents=True, exist_ok=True)
    return {name: str(folder) for name, folder in env.items()}


def private_shm(size_bytes: int) -> bool:
    """Give this process (and what it starts later) a fresh, empty /dev/shm of `size_bytes`, in
    a mount namespace of its own: students graded side by side cannot touch each other's shared
    memory, and shared memory cannot grow past `size_bytes`. Call before confine() (Landlock
    forbids mounting) and before any thread starts. False where not permitted (needs root or
    CAP_SYS_ADMIN)."""
    if not sys.platform.startswith("linux"):
        return False
    _require_single_thread("private_shm()")
    return _private_shm(size_bytes)


def _private_shm(size_bytes: int) -> bool:
    c = libc()
    if c.unshare(ctypes.c_int(0x00020000)) != 0:  # CLONE_NEWNS
        return False
    # MS_REC | MS_PRIVATE on /: our mount must not propagate back to the machine's namespace.
    if c.mount(None, b"/", None, ctypes.c_ulong(16384 | (1 << 18)), None) != 0:
        raise _oserror("making the mount namespace private")
    options = f"size={int(size_bytes)},mode=1777".encode()
    if c.mount(b"tmpfs", _DEV_SHM.encode(), b"tmpfs", ctypes.c_ulong(2 | 4), options) != 0:
        raise _oserror("mounting a private tmpfs on /dev/shm")   # MS_NOSUID | MS_NODEV
    return True


# ---------------------------------------------------------------------------------------------
# Command line

def _size(text: str) -> int:
    units, text = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}, text.strip().upper().removesuffix("B")
    text = text.removesuffix("I")
    return int(float(text[:-1]) * units[text[-1]]) if text and text[-1] in units else int(text)


def parse(argv: list[str]):
    """(options, command) of ``python -m distlab.runtime.landlock OPTIONS -- COMMAND``."""
    parser = argparse.ArgumentParser(
        prog="python -m distlab.runtime.landlock",
        usage="%(prog)s --write DIR [--write DIR ...] [--hide DIR] [--read DIR] [--home DIR] "
              "[--shm-size SIZE] -- COMMAND [ARGS...]",
        description="Run COMMAND unable to change files outside the --write folders (Landlock), "
                    "to signal processes outside, or to use capabilities.")
    parser.add_argument("--write", action="append", default=[], metavar="DIR",
                        help="a folder the command may change (repeatable; relative to the cwd)")
    parser.add_argument("--hide", action="append", default=[], metavar="DIR",
                        help="a folder the command may not read (repeatable), except the --write "
                             "folders inside it")
    parser.add_argument("--read", action="append", default=[], metavar="DIR",
                        help="a folder inside a --hide one that the command may read (repeatable)")
    parser.add_argument("--home", metavar="DIR",
                        help="writable too; HOME, TMPDIR and the caches of IPython, matplotlib, "
                             "torch go there")
    parser.add_argument("--shm-size", type=_size, metavar="SIZE",
                        help="a private /dev/shm of SIZE (e.g. 2G) for the command (needs root)")
    split = argv.index("--") if "--" in argv else len(argv)
    opts, command = parser.parse_args(argv[:split]), argv[split + 1:]   # (--help exits here)
    if split == len(argv):
        parser.error("put -- before the command to run, e.g. "
                     "python -m distlab.runtime.landlock --write . -- python script.py")
    if not command:
        parser.error("no command after --")
    return opts, command


def confine_as(opts, single_thread: bool = False) -> bool:
    """Confine this process as ``python -m distlab.runtime.landlock OPTS -- ...`` would (``opts``
    from ``parse``): True when confined, False without Landlock (warned on stderr); OSError when
    Landlock refuses. The grader's warm kernels call it in a fork, which has one thread."""
    writable = [os.path.abspath(p) for p in opts.write]
    if opts.home:
        os.environ.update(sandbox_env(opts.home))
        writable.append(os.path.abspath(opts.home))
    if opts.shm_size and not _private_shm(opts.shm_size):
        print("distlab.runtime.landlock: warning: no private /dev/shm (needs root or CAP_SYS_ADMIN); "
              "the command shares the machine's.", file=sys.stderr)
    confined = _confine(writable, drop_capabilities=True, single_thread=single_thread,
                        hidden=[os.path.abspath(p) for p in opts.hide],
                        readable=[os.path.abspath(p) for p in opts.read])
    if not confined:
        print("distlab.runtime.landlock: warning: this kernel has no Landlock (needs Linux >= 5.13 with "
              "landlock in its LSM list); running the command unconfined.", file=sys.stderr)
    return confined


def main(argv: list[str] | None = None) -> int:
    opts, command = parse(sys.argv[1:] if argv is None else argv)
    try:
        # No single-thread check here (nor in _private_shm): whatever threads an import may have
        # started vanish at exec, and only this thread lives on, confined.
        confine_as(opts)
    except OSError as exc:
        print(REFUSED.format(exc), file=sys.stderr)
        return 126
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"distlab.runtime.landlock: cannot run {command[0]!r}: {exc}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())
