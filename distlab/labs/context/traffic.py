"""What one context-parallel attention forward sends, read from the collective records
(``out.comms``), beside the formulas of Lab 10. Three ways to attend over a sequence cut into p
chunks of s/p tokens, on q, k, v of shape (batch, h, s/p, d) per rank, b bytes per element:

- **ring** (Liu et al., arXiv 2310.01889 §3): every rank passes the K/V block it holds to its right
  neighbour (isend/irecv); what that sends is the lab's prediction, so it is not written here;
- **all-gather** (Llama 3, arXiv 2407.21783 §3.3.2): every rank all-gathers K and V, then attends
  for its own queries; each rank receives what it lacks, 2·(p−1)/p·s·h·d·b·batch bytes;
- **Ulysses** (Jacobs et al., arXiv 2309.14509 §3): all-to-alls of q, k and v (sequence shards to
  head shards) and of the output back; each sends (p−1)/p of the rank's (s/p)·h·d·b·batch bytes
  to other ranks, so a rank sends 4·(p−1)/p·(s/p)·h·d·b·batch bytes.

Bytes are counted as ``distlab.Comm.bytes`` records them (nccl-tests' convention): the tensor
for a point-to-point message, the whole gathered buffer for an all-gather, the whole input for an
all-to-all. ``allgather_attention`` is the course's demonstration of Llama 3's scheme (not an
exercise: the lab's exercises are ring and Ulysses).
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from distlab.labs.context.dense import block_attention
from distlab.labs.context.stored import stored_set
from distlab.labs.tables import format_table

ITEMSIZE = 4                                   # float32 on these CPU ranks
SHAPE = dict(batch=2, heads=4, head_dim=8)     # heads divisible by p ∈ {2, 4} (Ulysses)
CASES = ((2, 16), (2, 32), (2, 64), (4, 32), (4, 64), (4, 128))   # (p, s): s/p from 8 to 32
METHODS = ("ring", "all-gather", "Ulysses")


def allgather_attention(q, k, v, positions=None, group=None):
    """This rank's (out, lse) as Llama 3 computes it (arXiv 2407.21783 §3.3.2): all-gather K and V
    of the whole sequence, then attend for this rank's queries only. ``positions`` as in
    ``ring_attention`` (None: not causal; else row r = global positions of rank r's tokens)."""
    p, me = dist.get_world_size(group), dist.get_rank(group)
    ks, vs = [torch.empty_like(k) for _ in range(p)], [torch.empty_like(v) for _ in range(p)]
    dist.all_gather(ks, k.contiguous(), group=group)
    dist.all_gather(vs, v.contiguous(), group=group)
    k_all, v_all = torch.cat(ks, dim=-2), torch.cat(vs, dim=-2)      # (b, h, s, d), rank order
    if positions is None:
        return block_attention(q, k_all, v_all)
    return block_attention(q, k_all, v_all, positions[me], positions.reshape(-1))


def qkv_chunk(rank: int, world_size: int, seq_len: int, batch: int, heads: int, head_dim: int,
              seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Rank ``rank``'s contiguous chunk (batch, h, s/p, d) of q, k, v drawn from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    full = torch.randn(3, batch, heads, seq_len, head_dim, generator=g)   # (3, b, h, s, d)
    return full.chunk(world_size, dim=3)[rank].unbind(0)


def _attend_cases_rank(rank, world_size, attend, seq_lens, batch, heads, head_dim):
    """One forward of ``attend`` per sequence length, each in a window of ``time.perf_counter()``
    (the collective record's clock) that selects its calls: one launch of p ranks serves every
    case of that p (a launch costs a few tenths of a CPU-second). The windows, per length."""
    windows = []
    for seq_len in seq_lens:
        q, k, v = qkv_chunk(rank, world_size, seq_len, batch, heads, head_dim)
        start = time.perf_counter()
        attend(q, k, v)
        windows.append((start, time.perf_counter()))
    return windows


def _in_window(comms, window) -> list:
    return [c for c in comms if window[0] <= c.start <= window[1]]


def formula_bytes(method: str, world_size: int, seq_len: int, batch: int, heads: int,
                  head_dim: int, itemsize: int = ITEMSIZE) -> float:
    """Bytes one rank moves in one forward by the formulas of the module's docstring: received
    (all-gather) or sent (Ulysses). The ring's is the lab's prediction, yours to write."""
    p, whole = world_size, seq_len * heads * head_dim * itemsize * batch      # (b, h, s, d)
    if method == "all-gather":
        return 2 * (p - 1) / p * whole
    if method == "Ulysses":
        return 4 * (p - 1) / p * whole / p
    raise ValueError(f"formula_bytes knows 'all-gather' and 'Ulysses', got {method!r}")


def recorded_bytes(method: str, comms, world_size: int) -> float:
    """The same quantity from one rank's records: the bytes of its isends (ring); (p−1)/p of its
    all-gathered buffers (what it lacked) and of its all-to-all inputs (what leaves it)."""
    ops = {"ring": ("isend", "send"), "all-gather": ("all_gather", "all_gather_into_tensor"),
           "Ulysses": ("all_to_all", "all_to_all_single")}[method]
    total = sum(c.bytes for c in comms if c.op in ops)
    return total if method == "ring" else total * (world_size - 1) / world_size


def _calls(comms) -> str:
    """The rank's ops, counted: "3 isend, 3 irecv"."""
    names = [c.op for c in comms]
    return ", ".join(f"{names.count(op)} {op}" for op in dict.fromkeys(names))


def measure_bytes(ring_attention, ulysses_attention, ring_formula=None, methods=METHODS,
                  cases=CASES, batch: int = SHAPE["batch"], heads: int = SHAPE["heads"],
                  head_dim: int = SHAPE["head_dim"]) -> list[dict]:
    """One forward of each of ``methods`` (``ring_attention`` and ``ulysses_attention``: yours;
    the all-gather is the course's) for every (p, s) of ``cases``; per method and case every
    rank's bytes from ``out.comms`` beside the formula (the ring's: ``ring_formula(seq_len,
    world_size, q_heads, kv_heads, head_dim, batch, itemsize)``, your prediction). A method not written yet
    (it raises NotImplementedError) shows the course's stored records instead. Returns the
    rows."""
    import distlab
    fns = {"ring": ring_attention, "all-gather": allgather_attention,
           "Ulysses": ulysses_attention}
    found = {}                          # (method's index, case's index) -> (per rank, calls, source)
    for m, method in enumerate(METHODS):
        for p in dict.fromkeys(p for p, _ in cases) if method in methods else ():
            index = [c for c, (q, _) in enumerate(cases) if q == p]
            try:
                out = distlab.run(_attend_cases_rank, p, fns[method],
                                  [cases[c][1] for c in index], batch, heads, head_dim)
                for i, c in enumerate(index):
                    comms = [_in_window(out.comms[r], out[r][i]) for r in range(p)]
                    found[m, c] = ([recorded_bytes(method, rc, p) for rc in comms],
                                   _calls(comms[0]), "measured")
            except distlab.RankError as err:
                if err.exc_type != "NotImplementedError" or tuple(cases) != CASES:
                    raise
                for c in index:
                    stored = stored_measurement("bytes")[m, c].tolist()
                    found[m, c] = ([b for b in stored if b >= 0],       # −1: past the last rank
                                   "-", "stored (the course's)")
    rows = []
    for m, method in enumerate(METHODS):
        for c, (p, s) in enumerate(cases):
            if (m, c) not in found:
                continue
            per_rank, calls, source = found[m, c]
            if method == "ring":
                formula = _predicted(ring_formula, s, p, heads, heads, head_dim, batch)
            else:
                formula = formula_bytes(method, p, s, batch, heads, head_dim)
            rows.append({"method": method, "p": p, "s": s, "s/p": s // p, "calls (rank 0)": calls,
                         "bytes per rank": per_rank, "formula": formula, "source": source})
    return rows


def _predicted(ring_formula, *sizes) -> float | None:
    """``ring_formula(seq_len, world_size, q_heads, kv_heads, head_dim, batch, itemsize)``; None
    when there is none, or it is not written yet."""
    try:
        return None if ring_formula is None else ring_formula(*sizes, ITEMSIZE)
    except NotImplementedError:
        return None


def bytes_set(ring_attention, ulysses_attention) -> torch.Tensor:
    """Every rank's bytes of ``measure_bytes``'s cases, (method, case, rank), −1 past the last
    rank: the stored records a handout shows until its functions are written."""
    rows = measure_bytes(ring_attention, ulysses_attention)
    table = torch.full((len(METHODS), len(CASES), max(p for p, _ in CASES)), -1.0,
                       dtype=torch.float64)
    for i, r in enumerate(rows):
        table[i // len(CASES), i % len(CASES), :len(r["bytes per rank"])] = \
            torch.tensor(r["bytes per rank"], dtype=torch.float64)
    return table


def stored_measurement(key: str):
    """Tensor ``key`` of the stored measurements (set "measured", written by ``distlab
    references 10_context_parallel`` from ``distlab.checks.lab10_plan.measured_set``)."""
    return stored_set("measured")[key]


def bytes_table(rows: list[dict]) -> str:
    """The rows as a table: does every rank's record equal the formula (✓ / ✗)?"""
    shown = []
    for r in rows:
        ranks, formula = r["bytes per rank"], r["formula"]
        same = "-" if formula is None else \
            "✓" if all(abs(b - formula) < 0.5 for b in ranks) else "✗"
        shown.append({"method": r["method"], "p": r["p"], "s": r["s"], "s/p": r["s/p"],
                      "calls (rank 0)": r["calls (rank 0)"],
                      "recorded B (rank 0)": f"{ranks[0]:,.0f}",
                      "formula B": "-" if formula is None else f"{formula:,.0f}",
                      "every rank = formula": same, "source": r["source"]})
    return format_table(shown)


def plot_bytes_scaling(rows: list[dict], tokens_per_rank: int = 16,
                       world_sizes=(2, 4, 8, 16, 32, 64)):
    """Bytes per rank against p with s = ``tokens_per_rank``·p (s and p grow together), by the
    formulas (lines) and the records of ``rows`` (markers, p = 2 and 4): ring and all-gather grow
    with p, Ulysses stays under 4·(s/p)·h·d·b (DeepSpeed-Ulysses §3: 4Nh/P per link)."""
    import matplotlib.pyplot as plt
    b, h, d = SHAPE["batch"], SHAPE["heads"], SHAPE["head_dim"]
    fig, ax = plt.subplots(figsize=(6.5, 4))
    lines = {"ring = all-gather": "all-gather", "Ulysses": "Ulysses"}
    for (label, method), colour in zip(lines.items(), ("C0", "C2")):
        ax.plot(world_sizes, [formula_bytes(method, p, tokens_per_rank * p, b, h, d)
                              for p in world_sizes], "-", color=colour, label=f"{label} (formula)")
    for method, marker in (("ring", "o"), ("all-gather", "s"), ("Ulysses", "^")):
        mine = [r for r in rows if r["method"] == method and r["s/p"] == tokens_per_rank]
        ax.plot([r["p"] for r in mine], [r["bytes per rank"][0] for r in mine], marker,
                color="C2" if method == "Ulysses" else "C0", fillstyle="none", markersize=9,
                label=f"{method} (recorded)")
    ax.axhline(4 * tokens_per_rank * h * d * b * ITEMSIZE, color="C2", ls=":", lw=1,
               label="4·(s/p)·h·d·b: Ulysses' bound")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xlabel(f"ranks p (s = {tokens_per_rank}·p tokens)")
    ax.set_ylabel("bytes per rank, one forward")
    ax.set_title("s/p fixed: what one rank moves")
    ax.legend(fontsize=7)
    plt.show()
    return fig


def ring_overlap(tokens_per_rank: int, heads: int, head_dim: int, tflops: float,
                 bandwidth_gbs: float, itemsize: int = 2, causal: bool = False) -> dict:
    """One ring step of one layer's forward on one rank (c = s/p tokens): compute 4·c²·h·d FLOPs
    (q kᵀ and the weights times v, 2·c²·d each per head) at ``tflops``, against sending
    2·c·h·d·itemsize bytes (K and V) at ``bandwidth_gbs`` (Liu et al. §3: a block of at least F/B
    tokens, in bf16). ``causal``: a causal split balanced on the ring's critical path, where every
    step's block is half full (half the score pairs of a c × c block), so half the compute."""
    c = tokens_per_rank
    share = 0.5 if causal else 1.0
    compute = share * 4 * c * c * heads * head_dim / (tflops * 1e12)
    transfer = 2 * c * heads * head_dim * itemsize / (bandwidth_gbs * 1e9)
    return {"s/p": c, "compute us": compute * 1e6, "transfer us": transfer * 1e6,
            "compute / transfer": compute / transfer,
            "crossover s/p": tflops * 1e12 * itemsize / (2 * share * bandwidth_gbs * 1e9)}


def ring_overlap_table(cluster, tokens_per_rank=(256, 1024, 4096, 8192, 16384), heads: int = 128,
                       head_dim: int = 128, causal: bool = True) -> str:
    """``ring_overlap`` on ``cluster``'s GPUs (peak × the course's kernel efficiency), over NVLink
    (inside a node) and over the network (between nodes), bf16; causal, balanced, by default."""
    tflops = cluster.peak_tflops * cluster.kernel_efficiency
    rows = []
    for link, gbs in (("NVLink", cluster.intra_node_gbs), ("network", cluster.inter_node_gbs)):
        for c in tokens_per_rank:
            r = ring_overlap(c, heads, head_dim, tflops, gbs, causal=causal)
            rows.append({"link": f"{link} {gbs:g} GB/s", "s/p": f"{c:,}",
                         "compute us": f"{r['compute us']:,.1f}",
                         "transfer us": f"{r['transfer us']:,.1f}",
                         "compute / transfer": f"{r['compute / transfer']:.2f}",
                         "hidden": "yes" if r["compute / transfer"] >= 1 else "no",
                         "crossover s/p": f"{r['crossover s/p']:,.0f}"})
    return format_table(rows)
