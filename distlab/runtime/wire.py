"""Bytes that crossed the network, counted from outside the ranks.

A rank's collective record (``distlab.runtime.comms``) is kept inside the rank, by code that a
student's function runs beside: it can be skipped (``ProcessGroup.allreduce`` called directly,
functional collectives) or rewritten. The kernel's own count cannot: for every TCP socket a
process holds, Linux keeps the bytes it sent and received (``struct tcp_info``'s
``tcpi_bytes_sent`` and ``tcpi_bytes_received``, RFC 4898). The zygote that forked the ranks
(a process that runs no student code) reads them for each rank's processes over the
``sock_diag`` netlink interface (what ``ss -ti`` prints), after every rank has returned and
before their sockets close. gloo, on one machine or several, moves every
byte of a collective over TCP, so a rank's count is what its collectives sent, whatever called
them, plus a few bytes per message of gloo's headers.

That count misses a socket a rank closed before the end (a group it made and destroyed). So the
grader's ranks also get a network of their own where Linux allows it: the zygote that forks them
moves into a new network namespace (``own_network``), whose only interface is its loopback, and
the launcher reads that loopback's counters (``/proc/PID/net/dev``) before and after each run.
Every byte any rank sent, over any socket, TCP or not, open or closed, is in them, with its
headers; ``Wire.total`` is that count less a TCP/IP header per packet.

Linux only; elsewhere (or where netlink is refused) ``count`` returns None and nothing is known.
"""
from __future__ import annotations

import dataclasses
import os
import socket
import struct

OWN_NETWORK_ENV = "DISTLAB_OWN_NETWORK"   # set for a zygote that should call own_network()
_SOCK_DIAG_BY_FAMILY, _NETLINK_SOCK_DIAG = 20, 4
_NLM_F_REQUEST, _NLM_F_DUMP = 0x1, 0x300
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_INET_DIAG_INFO = 2
_MSG_HEADER, _DIAG_MSG = struct.Struct("=IHHII"), 72      # nlmsghdr, struct inet_diag_msg
_INODE_AT = 68                                            # inet_diag_msg.idiag_inode
_RECEIVED_AT, _SENT_AT, _RETRANS_AT = 128, 200, 208     # in struct tcp_info (Linux >= 4.19)


@dataclasses.dataclass(frozen=True)
class Wire:
    """What one rank's processes sent and received over TCP during a run, in bytes."""
    sent: int
    received: int
    sockets: int


@dataclasses.dataclass(frozen=True)
class RunWire:
    """What crossed in one run: ``ranks[r]``, what rank r's sockets open at the end carried
    (None where unreadable); ``total``, the payload bytes every rank sent on the run's own
    network, over any socket, closed ones included (None where the ranks share the machine's
    network); ``store``, the size of the run's rendezvous store, a file every write to it
    (``dist.distributed_c10d._get_default_store().set``, a group's addresses) appends to."""
    ranks: list[Wire] | None
    total: int | None
    store: int | None = None   # bytes the ranks wrote into their rendezvous store (a file)
    retransmitted: int = 0     # TCP segments sent again on the run's own network (in ``total``)


# Bytes of headers a loopback packet carries besides its payload: Ethernet (14), IPv4 (20) and
# TCP with the timestamps option Linux sets by default (32).
HEADER_BYTES = 66
MAX_SEGMENT = 65_536    # the most one TCP segment carries on a loopback (its MSS is 65,483 B)
_CLONE_NEWUSER, _CLONE_NEWNET = 0x10000000, 0x40000000
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1


def own_network() -> bool:
    """Move this process (a zygote, before it forks any rank) into a network namespace of its
    own with its loopback up; False, changing nothing, where the kernel refuses (no user
    namespaces for a user without CAP_SYS_ADMIN, not Linux)."""
    import ctypes
    import fcntl
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        flags = _CLONE_NEWNET | (0 if os.geteuid() == 0 else _CLONE_NEWUSER)
        if libc.unshare(flags) != 0:
            return False
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            request = struct.Struct("16sH14s")
            now = request.unpack(fcntl.ioctl(s, _SIOCGIFFLAGS, request.pack(b"lo", 0, b"")))[1]
            fcntl.ioctl(s, _SIOCSIFFLAGS, request.pack(b"lo", now | _IFF_UP, b""))
    except (OSError, AttributeError):
        return False
    # NCCL's bootstrap skips the loopback unless told: it is the only interface here.
    os.environ["NCCL_SOCKET_IFNAME"] = "lo"
    return True


def in_own_network(pid: int) -> bool:
    """Whether process ``pid`` lives in another network namespace than this process."""
    try:
        return os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net")
    except OSError:
        return False


def loopback(pid: int) -> tuple[int, int, int] | None:
    """(bytes, packets, TCP segments retransmitted) sent so far in ``pid``'s network namespace:
    its loopback's transmit counters, and TCP's RetransSegs (a busy machine retransmits, and the
    loopback counts each transmission)."""
    try:
        with open(f"/proc/{pid}/net/dev") as dev:
            sent = next(line.partition(":")[2].split() for line in dev
                        if line.partition(":")[0].strip() == "lo")
        with open(f"/proc/{pid}/net/snmp") as snmp:
            names, values = (line.split() for line in snmp if line.startswith("Tcp:"))
        return int(sent[8]), int(sent[9]), int(values[names.index("RetransSegs")])
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def payload(before, after) -> tuple[int, int] | None:
    """(payload bytes, segments retransmitted) between two ``loopback`` readings: the bytes less
    a header per packet, retransmissions included (what they add is at most a segment each:
    ``MAX_SEGMENT``)."""
    if before is None or after is None:
        return None
    return (max(0, (after[0] - before[0]) - HEADER_BYTES * (after[1] - before[1])),
            after[2] - before[2])


def _tcp_info_by_inode(family: int) -> dict[int, tuple[int, int]]:
    """{socket inode: (bytes sent once, bytes received)} for every TCP socket of ``family``."""
    found = {}
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_SOCK_DIAG) as nl:
        request = struct.pack("=BBBBI48s", family, socket.IPPROTO_TCP, 1 << (_INET_DIAG_INFO - 1),
                              0, 0xFFFFFFFF, bytes(48))           # every state, every socket
        nl.sendall(_MSG_HEADER.pack(_MSG_HEADER.size + len(request), _SOCK_DIAG_BY_FAMILY,
                                    _NLM_F_REQUEST | _NLM_F_DUMP, 1, 0) + request)
        while True:
            data = nl.recv(1 << 20)
            offset = 0
            while offset + _MSG_HEADER.size <= len(data):
                length, kind = _MSG_HEADER.unpack_from(data, offset)[:2]
                if kind == _NLMSG_DONE:
                    return found
                if kind == _NLMSG_ERROR:
                    raise OSError("sock_diag refused the request")
                body = data[offset + _MSG_HEADER.size: offset + length]
                info = _attribute(body, _INET_DIAG_INFO)
                if info is not None and len(info) >= _RETRANS_AT + 8:
                    inode = struct.unpack_from("=I", body, _INODE_AT)[0]
                    sent, retransmitted = struct.unpack_from("=QQ", info, _SENT_AT)
                    found[inode] = (sent - retransmitted,
                                    struct.unpack_from("=Q", info, _RECEIVED_AT)[0])
                offset += (length + 3) & ~3
            if not data:
                return found


def _attribute(body: bytes, wanted: int) -> bytes | None:
    """The payload of netlink attribute ``wanted`` after an inet_diag_msg, if present."""
    at = _DIAG_MSG
    while at + 4 <= len(body):
        length, kind = struct.unpack_from("=HH", body, at)
        if length < 4:
            return None
        if kind == wanted:
            return body[at + 4: at + length]
        at += (length + 3) & ~3
    return None


def _socket_inodes(pid: int) -> set[int]:
    """The inodes of the sockets process ``pid`` holds open (empty if it is gone)."""
    inodes = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return inodes
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def _with_descendants(pid: int) -> list[int]:
    """``pid`` and every process it started that still runs (a rank may start its own)."""
    import psutil
    try:
        return [pid] + [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return [pid]


def count(pids: list[int]) -> list[Wire] | None:
    """For each pid (a rank), the TCP bytes its processes' open sockets have sent and received;
    None where the kernel's counters cannot be read (not Linux, netlink refused)."""
    try:
        counters = {}
        for family in (socket.AF_INET, socket.AF_INET6):
            counters.update(_tcp_info_by_inode(family))
    except (OSError, AttributeError):
        return None
    wires = []
    for pid in pids:
        inodes = set().union(*(_socket_inodes(p) for p in _with_descendants(pid)))
        mine = [counters[i] for i in inodes if i in counters]
        wires.append(Wire(sent=sum(s for s, _ in mine), received=sum(r for _, r in mine),
                          sockets=len(mine)))
    return wires
