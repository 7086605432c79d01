"""Confinement of a process and all it starts (Landlock, Linux 5.13+, no root needed), used by
the rank launcher (``distlab.runtime.zygote``) and the grader's kernels. Linux only: elsewhere
landlock_abi() is 0 and confine() returns False.

    landlock_abi() -> int          # Landlock ABI of this kernel; 0 when unavailable
    confine(writable, readable=None, hidden=(), max_file_bytes=None) -> bool   # this process
        # and all it starts, as below (readable=None: reads anywhere); False without Landlock
    sandbox_env(home) -> dict      # HOME, TMPDIR, caches of jupyter/matplotlib/torch under `home`
    private_shm(size) -> bool      # a fresh /dev/shm of `size` bytes for this process (root only)

    python -m distlab.runtime.landlock --write DIR [--read DIR ...] [--hide DIR ...] [--home DIR]
                                       [--max-file-size 200M] [--shm-size 2G] -- CMD ...
        confine, then exec CMD (for a kernelspec's argv: `--write .` is the notebook's folder,
        since kernels start there). Without Landlock: one warning line on stderr, CMD runs anyway.
        The module imports nothing from distlab: `python .../distlab/runtime/landlock.py` works too.

What confine() enforces. With `readable`, reading is an allow-list: files beneath `readable`
and `writable` can be read and executed, nothing else (another copy of the course, $HOME, other
students' folders), nor beneath a `hidden` folder inside a readable one. Every right that
modifies something and that the ABI knows (write, truncate, create, remove, rename/link across
folders, device ioctl) is denied except beneath `writable` and: /dev/null, zero, full, random,
urandom, tty, ptmx, pts, the GPU device files (/dev/nvidia*, dri, kfd, infiniband: write + ioctl
for CUDA, ROCm, NCCL) and /dev/shm (create and delete too: sem_open, torch's tensor sharing and
NCCL need it). /dev/shm is shared by the machine: a student could read, delete or fill another's
segments (unmapped tmpfs pages are in no PSS, MemoryWatch cannot see them); `private_shm`
(`--shm-size`) closes that as root. Device nodes are never created (mknod); every capability
is dropped (bounding set included): root cannot load modules, mount, use raw sockets. With ABI
>= 6 no signal to processes outside the sandbox nor connection to their abstract unix sockets.
Landlock forbids ptrace (attach) of processes outside and /proc/PID/mem; the capability drop
closes ptrace's read mode for the more privileged grader. `max_file_bytes` sets RLIMIT_FSIZE
(soft and hard), with or without Landlock: a write past it fails with EFBIG (Python ignores
SIGXFSZ).

What breaks unless pointed into the writable folder (sandbox_env does it): HOME (~/.cache,
~/.config, ~/.nv, ~/.triton), TMPDIR (tempfile, torch inductor), IPYTHONDIR, MPLCONFIGDIR. Writes
under /proc fail too (pthread_setname_np on another thread): harmless. Landlock confines the
calling thread only: confine() refuses to run in a process that already has several threads.
"""
from __future__ import annotations

import argparse
import ctypes
import glob
import os
import resource
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

# The modifying rights each ABI added (reading and executing: handled for an allow-list only).
_MODIFY_BY_ABI = {1: (_WRITE_FILE | _REMOVE_DIR | _REMOVE_FILE | _MAKE_CHAR | _MAKE_DIR | _MAKE_REG
                      | _MAKE_SOCK | _MAKE_FIFO | _MAKE_BLOCK | _MAKE_SYM),
                  2: _REFER, 3: _TRUNCATE, 5: _IOCTL_DEV}
_EXECUTE, _READ_FILE, _READ_DIR = 1 << 0, 1 << 2, 1 << 3   # handled for an allow-list of reads
_READ = _EXECUTE | _READ_FILE | _READ_DIR
_FILE_RIGHTS = _WRITE_FILE | _TRUNCATE | _IOCTL_DEV | _READ_FILE | _EXECUTE   # all a file may hold
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


def confine(writable: list[str | os.PathLike], *, readable: list[str | os.PathLike] | None = None,
            hidden: list[str | os.PathLike] = (), max_file_bytes: int | None = None,
            drop_capabilities: bool = True) -> bool:
    """Confine this process and all it starts later, irreversibly, as the module docstring says
    (paths that do not exist are skipped). Drops every capability unless `drop_capabilities=
    False`. True when confined, False without Landlock (the caller should then detect writes).
    Raises RuntimeError if the process has threads, OSError if Landlock refuses the ruleset."""
    return _confine(writable, drop_capabilities, True, readable=readable, hidden=hidden,
                    max_file_bytes=max_file_bytes)


@lru_cache(maxsize=None)   # once a process: a zygote's ranks reuse its work (~0.7 ms a rank)
def readable_roots(roots: tuple[str, ...], hidden: tuple[str, ...]) -> tuple[list, list]:
    """(folders readable whole, folders only listable): `roots` minus the `hidden` folders inside.
    A Landlock rule covers all beneath its folder, so a root holding a hidden folder is spelled
    out: walking toward each hidden folder, every entry beside the way is readable whole, the
    folders on the way listable (Python lists where it imports from: site-packages)."""
    hidden = [os.path.realpath(h) for h in hidden]

    def within(path: str, folder: str) -> bool:
        return path == folder or path.startswith(folder.rstrip("/") + "/")

    whole, listable = [], []

    def walk(folder: str) -> None:
        listable.append(folder)
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
                whole.append(entry.path)

    for root in dict.fromkeys(os.path.realpath(r) for r in roots):
        if root not in hidden:   # one named hidden too stays hidden; one inside a hidden is not
            walk(root) if any(within(h, root) for h in hidden) else whole.append(root)
    return whole, listable


def _confine(writable, drop_capabilities: bool, single_thread: bool, readable=None, hidden=(),
             max_file_bytes=None) -> bool:
    if max_file_bytes:   # before Landlock: a limit on file sizes needs no LSM
        resource.setrlimit(resource.RLIMIT_FSIZE, (int(max_file_bytes), int(max_file_bytes)))
    abi = landlock_abi()
    if abi == 0:
        return False
    if single_thread:
        _require_single_thread("confine()")
    handled = _handled_rights(abi) | (_READ if readable is not None else 0)
    scoped = _SCOPE_SIGNAL | _SCOPE_ABSTRACT_UNIX_SOCKET if abi >= 6 else 0
    attr = _RulesetAttr(handled, 0, scoped)
    ruleset = _syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(_attr_size(abi)),
                       ctypes.c_uint32(0))
    if ruleset < 0:
        raise _oserror(f"landlock_create_ruleset (ABI {abi})",
                       "Report this kernel (uname -r) with the error")
    try:
        if readable is not None:
            whole, listable = readable_roots(tuple(os.fspath(r) for r in readable),
                                             tuple(os.fspath(h) for h in hidden))
            for path in listable:
                _allow(ruleset, path, _READ_DIR)
            for path in whole:
                _allow(ruleset, path, _READ)
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
    """Empty every capability set: root with capabilities acts without paths (init_module, mount,
    raw sockets, mknod). With the bounding set empty, exec cannot give them back."""
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
    """Environment variables pointing every per-user cache and temp folder into `home` (created),
    so that IPython, matplotlib, torch and CUDA find writable places under confinement."""
    home = Path(home).resolve()
    env = {"HOME": home, "TMPDIR": home / "tmp", "XDG_CACHE_HOME": home / ".cache",
           "XDG_CONFIG_HOME": home / ".config", "XDG_DATA_HOME": home / ".local" / "share",
           "IPYTHONDIR": home / ".ipython", "MPLCONFIGDIR": home / ".config" / "matplotlib"}
    for folder in env.values():
        folder.mkdir(parents=True, exist_ok=True)
    return {name: str(folder) for name, folder in env.items()}


def private_shm(size_bytes: int) -> bool:
    """A fresh, empty /dev/shm of `size_bytes` for this process and what it starts, in a mount
    namespace of its own. Call before confine() (Landlock forbids mounting) and before any
    thread starts. False where not permitted (needs root or CAP_SYS_ADMIN)."""
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
        usage="%(prog)s --write DIR ... [--read DIR ...] [--hide DIR ...] [--home DIR] "
              "[--max-file-size SIZE] [--shm-size SIZE] -- COMMAND [ARGS...]",
        description="Run COMMAND confined (Landlock): see the module's docstring.")
    parser.add_argument("--write", action="append", default=[], metavar="DIR",
                        help="a folder the command may change (repeatable; relative to the cwd)")
    parser.add_argument("--read", action="append", metavar="DIR",
                        help="a folder the command may read (repeatable; none: it reads anywhere)")
    parser.add_argument("--hide", action="append", default=[], metavar="DIR",
                        help="a folder inside a --read one that the command may not read")
    parser.add_argument("--max-file-size", type=_size, metavar="SIZE",
                        help="no file the command writes grows past SIZE (RLIMIT_FSIZE)")
    parser.add_argument("--home", metavar="DIR",
                        help="writable too; HOME, TMPDIR and the caches go there")
    parser.add_argument("--shm-size", type=_size, metavar="SIZE",
                        help="a private /dev/shm of SIZE (e.g. 2G) for the command (needs root)")
    split = argv.index("--") if "--" in argv else len(argv)
    opts, command = parser.parse_args(argv[:split]), argv[split + 1:]   # (--help exits here)
    if split == len(argv):
        parser.error("put -- before the command to run, e.g. "
                     "python -m distlab.runtime.landlock --write . -- python script.py")
    if not command:
        parser.error("no command after --")
    if opts.hide and not opts.read:
        parser.error("--hide carves folders out of the --read ones: name those too")
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
    readable = None if opts.read is None else [os.path.abspath(p) for p in opts.read]
    confined = _confine(writable, True, single_thread, readable=readable,
                        hidden=[os.path.abspath(p) for p in opts.hide],
                        max_file_bytes=opts.max_file_size)
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
