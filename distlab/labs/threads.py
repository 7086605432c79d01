"""Intra-op threads for the labs' tiny-tensor work."""
from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def one_thread():
    """Run tiny-tensor work on one intra-op thread (restored after). Tensors this small gain
    nothing from more, and on a busy 2-core machine the threads spin against each other: Lab 9's
    toy training measured 70 s with 2 threads and 7.6 s with 1 (load average 15-20)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
