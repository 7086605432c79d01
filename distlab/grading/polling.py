"""A guard that checks something every few tenths of a second on a daemon thread, as a context
manager: the memory watch (sandbox.MemoryWatch) and the disk watch (disk.DiskWatch)."""
from __future__ import annotations

import threading


class PollingWatch:
    """Calls ``self.poll()`` every ``self.interval`` seconds between ``start`` and ``stop``
    (or within ``with``), until ``finished()`` says there is nothing left to watch. An exception
    a poll raises is kept in ``.error`` and the watch goes on: one bad read must not end the
    guard."""

    name = "distlab-watch"
    interval: float
    error: BaseException | None = None
    _thread: threading.Thread | None = None

    def poll(self):
        raise NotImplementedError

    def finished(self) -> bool:
        return False

    def start(self):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=30)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.poll()
            except Exception as exc:   # noqa: BLE001 - kept for the caller to read
                self.error = exc
            if self.finished():
                return
