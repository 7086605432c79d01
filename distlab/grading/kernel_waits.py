"""jupyter_client's waits around a graded kernel, without the idle wall in them.

Two waits of jupyter_client pass a fixed time with nothing to do, once per graded notebook (a
timeline of one student's worker at --jobs 1: 0.28 s of its 0.37 s from the kernel's fork to its
first cell, and 0.1 s of its 0.12 s shutdown, with neither the worker nor the kernel on a core):
- ``wait_for_ready`` ends by reading IOPub until nothing came for 0.2 s (the status messages of
  its own ``kernel_info`` requests). nbclient reads IOPub by the parent message of each cell it
  runs and passes over any other, so what is already in is dropped at once instead;
- a kernel killed (``shutdown_kernel(now=True)``, nbclient's "immediate") is polled every 0.1 s
  until it is gone: here every 5 ms (a ``waitpid`` each), since SIGKILL ends it within
  milliseconds.
Everything else is jupyter_client's: the same requests, checks and time limits.
"""
from __future__ import annotations

import time
from queue import Empty

from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.manager import AsyncKernelManager
from traitlets import DottedObjectName, Type

KILL_POLL = 0.005   # seconds between checks that a killed kernel is gone (jupyter_client's: 0.1)


class ReadyClient(AsyncKernelClient):
    """jupyter_client's client, with ``wait_for_ready`` as jupyter_client's but its last 0.2 s."""

    async def _async_wait_for_ready(self, timeout: float | None = None) -> None:
        deadline = time.time() + (float("inf") if timeout is None else timeout)
        while not await self._kernel_info_answered():
            if not await self._async_is_alive():
                raise RuntimeError("Kernel died before replying to kernel_info")
            if time.time() > deadline:
                raise RuntimeError(f"Kernel didn't respond in {timeout:.0f} seconds")
        while await self.iopub_channel.msg_ready():   # what came in already, without a wait
            await self.iopub_channel.get_msg(timeout=0)

    wait_for_ready = _async_wait_for_ready

    async def _kernel_info_answered(self) -> bool:
        """Ask for the kernel's info: True once it answered on the shell channel and IOPub is
        connected (a message on it within 0.2 s), as jupyter_client checks both."""
        self.kernel_info()
        try:
            reply = await self.shell_channel.get_msg(timeout=1)
            if reply["msg_type"] != "kernel_info_reply":
                return False
            await self.iopub_channel.get_msg(timeout=0.2)
        except Empty:
            return False
        self._handle_kernel_info_reply(reply)
        return True


class QuickKernelManager(AsyncKernelManager):
    """jupyter_client's kernel manager with ``ReadyClient`` clients and a killed kernel's exit
    noticed within KILL_POLL."""
    client_class = DottedObjectName("distlab.grading.kernel_waits.ReadyClient", config=True)
    client_factory = Type(ReadyClient, klass=AsyncKernelClient, config=True)

    async def _async_wait(self, pollinterval: float = KILL_POLL) -> None:
        await super()._async_wait(pollinterval=min(pollinterval, KILL_POLL))
