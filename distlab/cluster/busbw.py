"""Lab 1's bandwidth sweep, as nccl-tests runs it, on a laptop or across the nodes of a cluster.

    python -m distlab.cluster.busbw                          # 2 local ranks (distlab.run)
    torchrun --standalone --nproc-per-node=4 -m distlab.cluster.busbw
    sbatch --nodes=2 cluster/slurm/busbw.sbatch --compare     # srun + torchrun, one agent a node

all-reduce, all-gather, reduce-scatter and all-to-all over message sizes from ``--min-bytes``
(8 B) to ``--max-bytes`` in steps of ``--factor`` (2), each size ``--warmup`` untimed then
``--iters`` timed calls (nccl-tests' -w 5 -n 20); the time of a size is the slowest rank's mean.
Sizes count as nccl-tests counts them: the buffer of an all-reduce and all-to-all, the whole
gathered buffer of an all-gather, the whole input of a reduce-scatter; float32 where the ranks
divide a size into whole floats, bytes (uint8) below that, so every size is exact. algbw = S / t;
busbw = algbw x nccl-tests' bus factor: 2(n-1)/n for all-reduce, (n-1)/n for the others. Then
the alpha-beta fit t(S) = alpha + S / B of each op (Lab 1's relative least squares).

``--compare`` runs the sweep twice on k ranks, k = min(processes per node, nodes): k ranks of
the first node (within a node: NVLink on a GPU cluster) and one rank of each of k nodes (across
nodes: the network), and prints busbw side by side: the reason Lab 7 keeps TP inside a node.
"""
from __future__ import annotations

import argparse
import re

import torch
import torch.distributed as dist

from distlab.checks.lab01 import BUS_FACTOR, reference_bandwidths
from distlab.cluster.group import choose_backend, guarded, launch, placement, printer, \
    SettingsError
from distlab.labs.collectives import bandwidth_table, reference_fit, time_calls, timings
from distlab.runtime.devices import device as rank_device

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
WARMUP, ITERS = 5, 20                      # nccl-tests' -w 5 -n 20
MAX_BYTES = {"nccl": "1G", "gloo": "4M"}   # default --max-bytes: a GPU's sweep reaches 1 GiB


def parse_size(text: str) -> int:
    """'8', '64K', '1M', '1G' (binary multiples, as nccl-tests reads -b and -e) -> bytes."""
    found = re.fullmatch(r"\s*(\d+)\s*([KMGkmg]?)(i?B)?\s*", str(text))
    if not found:
        raise SettingsError(f"a size is a number of bytes with K, M or G after it (64K), "
                            f"not {text!r}")
    return int(found.group(1)) * 1024 ** " KMG".index((found.group(2) or " ").upper())


def message_sizes(min_bytes: int, max_bytes: int, factor: int = 2) -> list[int]:
    if min_bytes < 1 or max_bytes < min_bytes or factor < 2:
        raise SettingsError(f"sizes from {min_bytes} B to {max_bytes} B in steps of x{factor}: "
                            f"need 1 <= --min-bytes <= --max-bytes and --factor >= 2")
    sizes, s = [], min_bytes
    while s <= max_bytes:
        sizes.append(s)
        s *= factor
    return sizes


def bus_factor(op: str, n: int) -> float:
    """busbw / algbw of ``op`` on n ranks, nccl-tests' (Lab 1's table; all-to-all (n-1)/n)."""
    return (n - 1) / n if op == "all_to_all" else BUS_FACTOR[op](n)


# ---------------------------------------------------------------------------------------------
# On each rank

def _buffers(op: str, nbytes: int, n: int):
    """(input, output) holding ``nbytes`` as nccl-tests counts them, on the rank's device."""
    if nbytes % (4 * n) == 0:
        dtype, numel = torch.float32, nbytes // 4
    else:                                   # too small for whole floats on every rank
        dtype, numel = torch.uint8, -(-nbytes // n) * n
    dev = rank_device()
    zeros = lambda k: torch.zeros(k, dtype=dtype, device=dev)   # noqa: E731  sums stay 0
    if op == "all_gather":
        return zeros(numel // n), zeros(numel)
    if op == "reduce_scatter":
        return zeros(numel), zeros(numel // n)
    return zeros(numel), (zeros(numel) if op == "all_to_all" else None)


def _call(op: str, x, y, group) -> None:
    if op == "all_reduce":
        dist.all_reduce(x, group=group)
    elif op == "all_gather":
        dist.all_gather_single(y, x, group=group)
    elif op == "reduce_scatter":
        dist.reduce_scatter_single(y, x, group=group)
    elif op == "all_to_all":
        dist.all_to_all_single(y, x, group=group)
    else:
        raise ValueError(f"unknown op {op!r}; one of {OPS}")


def _time_ops(ops, sizes, warmup: int, iters: int, group, n: int) -> list[dict]:
    rows = []
    for op in ops:
        for nbytes in sizes:
            x, y = _buffers(op, nbytes, n)
            seconds = time_calls(lambda: _call(op, x, y, group), x, warmup, iters, group)
            counted = (y if op == "all_gather" else x).numel() * x.element_size()
            rows.append({"op": op, "nbytes": counted, "seconds": seconds,
                         "dtype": str(x.dtype).removeprefix("torch."), "world_size": n})
    return rows


def sweep_rank(rank: int, world_size: int, ops, sizes, warmup: int, iters: int,
               groups: list) -> dict:
    """Rank body: {label: rows} of every group (label, ranks or None for all) this rank is in.
    Every rank makes every group (``new_group`` is collective), in the same order."""
    made = [(label, ranks, dist.new_group(ranks) if ranks else None) for label, ranks in groups]
    out = {}
    for label, ranks, group in made:
        if ranks is None or rank in ranks:
            out[label] = _time_ops(ops, sizes, warmup, iters, group, len(ranks or
                                                                        range(world_size)))
        dist.barrier()
    return out


# ---------------------------------------------------------------------------------------------
# In the process that prints

def compare_groups(where) -> list[tuple[str, list[int]]]:
    """k ranks of the first node and one rank of each of k nodes, k = min(per node, nodes)."""
    k = min(where.per_node, where.nodes)
    if k < 2:
        raise SettingsError(
            f"--compare needs at least 2 nodes of at least 2 processes ({where.describe()}): "
            f"on one machine pretend with --nproc 4 --nproc-per-node 2")
    return [(f"within a node ({k} ranks of node 0)", list(range(k))),
            (f"across nodes (1 rank on each of {k} nodes)",
             [node * where.per_node for node in range(k)])]


def _bandwidths():
    """Lab 1's (algbw, busbw) formula; a note instead where a handout stubs it (Lab 1's answer)."""
    try:
        reference_bandwidths(1.0, 1.0, 1.0)
        return reference_bandwidths
    except NotImplementedError as exc:
        print(f"note: no algbw/busbw here: {exc}")
        return lambda nbytes, seconds, factor: (float("nan"), float("nan"))


def print_sweep(label: str, rows: list[dict], ops, backend: str, warmup: int,
                iters: int) -> list[dict]:
    n = rows[0]["world_size"]
    print(f"\n# {label}: {n} ranks, {backend}, {warmup} warm-up + {iters} timed calls per size")
    rows = bandwidth_table(rows, _bandwidths(), {op: bus_factor(op, n) for op in ops})
    print(f"{'alpha-beta fit':<16}{'alpha (us)':>12}{'B (GB/s)':>12}   t(S) = alpha + S / B, "
          f"relative least squares")
    for op in ops:
        try:
            alpha, bandwidth = reference_fit(*timings(rows, op))
        except NotImplementedError as exc:
            print(f"{op:<16}not fitted: {exc}")
            continue
        print(f"{op:<16}{alpha * 1e6:>12.2f}{bandwidth / 1e9:>12.3f}")
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m distlab.cluster.busbw",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS))
    parser.add_argument("--min-bytes", default="8", help="smallest message (8, 64K, 1M)")
    parser.add_argument("--max-bytes", default=None,
                        help=f"largest message (default {MAX_BYTES['nccl']} on NCCL, "
                             f"{MAX_BYTES['gloo']} on gloo)")
    parser.add_argument("--factor", type=int, default=2, help="size step (nccl-tests' -f)")
    parser.add_argument("--warmup", type=int, default=WARMUP, help="untimed calls per size")
    parser.add_argument("--iters", type=int, default=ITERS, help="timed calls per size")
    parser.add_argument("--compare", action="store_true",
                        help="the sweep within a node and across nodes, side by side")
    parser.add_argument("--backend", default="auto", help="auto (NCCL on GPUs), gloo or nccl")
    parser.add_argument("--nproc", type=int, default=None,
                        help="ranks to start without torchrun (default 2; 4 with --compare)")
    parser.add_argument("--nproc-per-node", type=int, default=None,
                        help="without torchrun: ranks per pretend node (default all; half "
                             "with --compare)")
    args = parser.parse_args(argv)
    nproc = args.nproc or (4 if args.compare else 2)
    per_node = args.nproc_per_node or (nproc // 2 if args.compare and nproc > 1 else None)
    where = placement(nproc, per_node)
    backend = choose_backend(args.backend, where)
    sizes = message_sizes(parse_size(args.min_bytes),
                          parse_size(args.max_bytes or MAX_BYTES[backend]), args.factor)
    groups = compare_groups(where) if args.compare else [(f"all {where.world_size} ranks", None)]
    if printer():
        print(f"distlab.cluster.busbw: {where.describe()}, backend {backend}; "
              f"{len(sizes)} sizes from {sizes[0]} B to {sizes[-1]} B")
    out = launch(sweep_rank, where, backend, args.ops, sizes, args.warmup, args.iters, groups)
    if not printer():
        return 0
    tables = {label: print_sweep(label, out[0][label], args.ops, backend, args.warmup, args.iters)
              for label, _ in groups}
    if args.compare:
        (inside, rows_in), (across, rows_out) = tables.items()
        print(f"\n# busbw at {rows_in[-1]['nbytes']} B: within a node vs across nodes")
        for op in args.ops:
            a = [r for r in rows_in if r["op"] == op][-1]["busbw"]
            b = [r for r in rows_out if r["op"] == op][-1]["busbw"]
            print(f"{op:<16}{a:>10.3f} GB/s within {b:>10.3f} GB/s across  ratio {a / b:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(guarded("distlab.cluster.busbw", main))
