"""The launches a check makes, counted: each ``distlab.run`` inside ``counted()`` noted with its
world size, so that a lab's stated cost (Lab 12's ``LAUNCHES``) is what its checks do."""
from __future__ import annotations

import contextlib


@contextlib.contextmanager
def counted():
    """Yields a list that receives the world size of each launch made inside (``distlab.run``,
    which every check's launch goes through), in order."""
    import distlab
    real, sizes = distlab.run, []

    def counting(fn, world_size, *args, **kwargs):
        sizes.append(world_size)
        return real(fn, world_size, *args, **kwargs)
    distlab.run = counting
    try:
        yield sizes
    finally:
        distlab.run = real


def launches_and_ranks(*runs: list[int]) -> tuple[int, int]:
    """(launches, rank processes) of the counted runs together."""
    return sum(len(r) for r in runs), sum(sum(r) for r in runs)
