"""The grader's small servers (the kernels' server, the workers' server) and their clients talk
in JSON lines over a socketpair: one line a request, with the file descriptors it hands over
(SCM_RIGHTS), and one line a reply. ``requests`` is the serving end, ``Client`` the asking end.
"""
from __future__ import annotations

import json
import socket
import threading


def requests(sock: socket.socket):
    """(request, file descriptors passed with it) for each JSON line until the client closes;
    each is answered with ``answer``."""
    buffer, fds = b"", []
    while True:
        data, got, _, _ = socket.recv_fds(sock, 1 << 20, 8)
        if not data:
            return
        buffer, fds = buffer + data, fds + got
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            yield json.loads(line), fds
            fds = []


def answer(sock: socket.socket, reply: dict) -> None:
    sock.sendall(_line(reply))


class Client:
    """One request in flight at a time (threads share a client). A failed exchange (a timeout, a
    dead server) closes the client: a reply that came late would be read as the next request's,
    so a client that failed asks no more, and each request after says so."""

    def __init__(self, sock: socket.socket, timeout: float):
        sock.settimeout(timeout)
        self.socket, self.replies = sock, sock.makefile("rb")
        self.lock = threading.Lock()
        self.unread = 0   # replies to ``tell`` not read yet

    @property
    def closed(self) -> bool:
        return self.socket is None

    def tell(self, request: dict) -> None:
        """Send ``request`` without waiting for its reply, which is read (and dropped) before the
        next request's: the caller goes on meanwhile."""
        with self.lock:
            if self.socket is None:
                return
            try:
                self.socket.sendall(_line(request))
                self.unread += 1
            except OSError:   # a dead server: the next request says so
                pass

    def ask(self, request: dict, fds=()) -> dict:
        """The reply to ``request``, or {"error": why} when there is none."""
        with self.lock:
            if self.socket is None:
                return {"error": "the server was closed"}
            try:
                while self.unread:
                    self.replies.readline()
                    self.unread -= 1
                socket.send_fds(self.socket, [_line(request)], list(fds))
                return json.loads(self.replies.readline() or b'{"error": "the server exited"}')
            except (OSError, ValueError) as exc:
                self._close()
                return {"error": f"{type(exc).__name__}: {exc}"}

    def close(self) -> None:
        """The server exits when it reads the end of its socket."""
        with self.lock:
            self._close()

    def _close(self) -> None:
        if self.socket is not None:
            self.replies.close()
            self.socket.close()
            self.socket = None


def _line(request: dict) -> bytes:
    return json.dumps(request).encode() + b"\n"
