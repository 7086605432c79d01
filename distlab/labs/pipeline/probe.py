"""Does a blocking send wait for its receiver? Lab 5's probe: the student's rank body times
rank 0's ``dist.send`` of each size while rank 1 posts its ``recv`` a set delay late; this runs it
on two ranks and says, size by size, whether the send returned before the recv was posted."""
from __future__ import annotations


def send_probe(send_times, sizes: list[int], delay: float = 0.2, backend: str = "auto") -> str:
    """Run ``send_times(rank, world_size, sizes, delay)`` on 2 ranks (rank 0 returns the seconds
    each send took) and tabulate them: a send that took about ``delay`` or more waited for the
    peer's recv; one far shorter returned at once (the backend buffered it)."""
    import distlab
    out = distlab.run(send_times, 2, list(sizes), delay, backend=backend, timeout=30 + 2 * delay
                      * len(sizes))
    took = out[0]
    rows = [f"{out.backend}: rank 1 posts each recv {delay * 1e3:.0f} ms late",
            f"{'bytes':>10}  {'send took ms':>12}  send returned"]
    for size, seconds in zip(sizes, took):
        waited = seconds >= 0.5 * delay            # far above a send's own time, near the delay
        rows.append(f"{size:>10}  {seconds * 1e3:>12.1f}  "
                    + ("after the peer's recv (blocked)" if waited else "at once (buffered)"))
    return "\n".join(rows)
