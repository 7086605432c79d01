"""What gloo puts on the wire per call, beyond the record's bytes: the figures behind
``distlab.checks.crossed``'s header allowances (P2P_HEADER, ``header_allowance``, RUN_SLACK).

    .venv/bin/python bench/wire_overhead.py

For each call, world size and size, the bytes each rank's sockets sent (``out.wire``, counted by
the kernel) for 5 calls, less a run with none, per call; beside it the record's bytes times the
wire factor that ``recorded_bound`` assumes, and the allowance left over.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

import distlab
from distlab.checks.crossed import P2P_HEADER, _wire_factor, header_allowance

CALLS = 5


def _calls(rank, world_size, numel, count, op):
    t = torch.ones(numel)
    for _ in range(count):
        if op == "send/recv":
            (dist.send(t, 1) if rank == 0 else dist.recv(t, 0)) if rank < 2 else None
        elif op == "all_reduce":
            dist.all_reduce(t)
        elif op == "reduce_scatter_tensor":
            dist.reduce_scatter_tensor(torch.empty(numel), torch.ones(numel * world_size))
        elif op == "reduce_scatter":      # the list form
            dist.reduce_scatter(torch.empty(numel), [torch.ones(numel)] * world_size)
        elif op == "all_gather":
            dist.all_gather_into_tensor(torch.empty(numel * world_size), t)
        elif op == "all_to_all":
            dist.all_to_all_single(torch.empty(numel), t)
        elif op == "broadcast":
            dist.broadcast(t, 0)
    return 0


def main() -> None:
    print(f"{'call':<22}{'ranks':>6}{'bytes':>8}{'wire/call (max rank)':>22}{'record x factor':>17}"
          f"{'allowance':>11}")
    for op, world_size in (("send/recv", 2), ("all_reduce", 2), ("all_reduce", 4),
                           ("all_reduce", 8), ("reduce_scatter_tensor", 4), ("reduce_scatter", 4),
                           ("all_gather", 4), ("all_to_all", 4), ("broadcast", 4)):
        for numel in (1, 13, 1000, 65536):
            base = distlab.run(_calls, world_size, numel, 0, op, backend="gloo").wire.ranks
            runs = distlab.run(_calls, world_size, numel, CALLS, op, backend="gloo").wire.ranks
            per_call = max(a.sent - b.sent for a, b in zip(runs, base)) / CALLS
            whole = op == "all_gather" or op.startswith("reduce_scatter")
            nbytes = 4 * numel * (world_size if whole else 1)
            factor = 1.0 if op == "send/recv" else _wire_factor(op, world_size)
            allowance = P2P_HEADER if op == "send/recv" else header_allowance(op, world_size)
            print(f"{op:<22}{world_size:>6}{nbytes:>8}{per_call:>22,.0f}{factor * nbytes:>17,.0f}"
                  f"{allowance:>11,}")


if __name__ == "__main__":
    main()
