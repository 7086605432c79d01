"""The judge's channels: how each graded kernel, and nothing else, reaches its judge.

A judge listening on a path would answer any process that can connect to it: another student's
kernel graded beside this one (``--jobs 2``) included, since Landlock does not confine connecting
to a path socket, and a secret in the environment or the command line is readable through
``/proc``. So there is no address. For each kernel the worker asks ``Channels.new()`` for a
socketpair (SOCK_SEQPACKET) and hands the kernel its end as the kernel starts (SCM_RIGHTS to the
warm kernels' server, ``pass_fds`` to a cold start); a descriptor cannot be opened through
``/proc/PID/fd``, and a confined kernel cannot take one from another process (``pidfd_getfd``
needs the right to trace it).

Over its channel the kernel passes, for each check, one end of a fresh socketpair
(``distlab.checks.messenger.connect``): the judge answers one request on that connection as it
would on an accepted one, so a check interrupted halfway leaves nothing in the way of the next.
"""
from __future__ import annotations

import os
import selectors
import socket

from distlab.checks.messenger import DOORBELL


class Channels:
    """The judge's ends of its kernels' channels, served by one thread (``serve``)."""

    def __init__(self):
        self.selector = selectors.DefaultSelector()
        # A new channel, or close(), wakes the serving thread out of select().
        self.wake, self.waker = socket.socketpair()
        self.selector.register(self.wake, selectors.EVENT_READ)

    def new(self) -> socket.socket:
        """A kernel's end of a new channel; the caller hands it over, then closes its copy."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.selector.register(mine, selectors.EVENT_READ)
        self.waker.send(b"+")
        return theirs

    def serve(self, answer) -> None:
        """Call ``answer(conn)`` for each connection a kernel passes, one at a time, until
        ``close``."""
        while True:
            try:
                ready = self.selector.select()
            except (OSError, ValueError):   # closed
                return
            for key, _ in ready:
                if key.fileobj is self.wake:
                    if not self.wake.recv(64):
                        return
                    continue
                for conn in self._connections(key.fileobj):
                    with conn:
                        answer(conn)

    def _connections(self, channel: socket.socket) -> list[socket.socket]:
        """The connection a kernel passed over ``channel``; none when the kernel is gone (the
        channel is then dropped) or sent something else."""
        try:   # closed on exec from the start: nothing this process starts may hold them
            data, fds, _, _ = socket.recv_fds(channel, 16, 4, socket.MSG_CMSG_CLOEXEC)
        except OSError:
            data, fds = b"", []
        if not data:
            self.selector.unregister(channel)
            channel.close()
        conns = []
        for fd in fds:
            try:
                conn = socket.socket(fileno=fd)
            except OSError:   # not a socket
                os.close(fd)
                continue
            if data != DOORBELL or conns or conn.type != socket.SOCK_STREAM:
                conn.close()
            else:
                conns.append(conn)
        return conns

    def close(self) -> None:
        self.waker.close()   # the serving thread sees end of file and stops
