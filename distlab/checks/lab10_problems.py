"""Lab 10's problems: q, k, v and an upstream gradient drawn from a seed, and what plain attention
on one process computes from them (the stored set for visible tests, a fresh one for hidden
tests). float64 throughout: a ring merges p partial results in another order than one softmax,
about 1e-15 apart; a wrong block or a missing rescale moves values by O(0.1).

Shapes: (b, h, s, d) for the whole sequence; rank r holds the tokens at ``positions[r]``.
"""
from __future__ import annotations

import torch

from distlab.checks.assertions import CheckFailed
from distlab.labs.context.dense import block_attention, dense_attention
from distlab.runtime.per_rank import PerRank, reference

LAB = "10_context_parallel"
SHAPE = dict(batch=2, heads=4, seq=16, dim=4)   # heads divisible by 2 and 4; s/p >= 2 d at p = 2
SEED = 10                                        # the stored set's seed
STORED_WORLD_SIZES = (2, 4)                      # s = 16 and h = 4 split over either
LARGE_LSE = 1000.0   # the largest score of the "large logits" merge case: exp(1000) overflows float64


def context_problem(seed: int, batch: int, heads: int, seq: int, dim: int) -> dict:
    """q, k, v, dout (b, h, s, d) float64; a random permutation ``perm`` (s,) of the positions
    (any split of the sequence must work); and for "full" and "causal" attention the plain
    result: out, lse, dq, dk, dv."""
    g = torch.Generator().manual_seed(seed)
    q, k, v, dout = (torch.randn(batch, heads, seq, dim, generator=g, dtype=torch.float64)
                     for _ in range(4))
    problem = {"seed": seed, "q": q, "k": k, "v": v, "dout": dout,
               "perm": torch.randperm(seq, generator=g)}
    for tag, causal in (("full", False), ("causal", True)):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out, lse = dense_attention(*leaves, causal=causal)
        (out * dout).sum().backward()
        problem.update({f"{tag}.out": out.detach(), f"{tag}.lse": lse.detach(),
                        **{f"{tag}.d{n}": t.grad for n, t in zip("qkv", leaves)}})
    return problem


MERGE_CASES = ("causal halves", "both blocks masked", "large logits")


def merge_problem(problem: dict) -> dict:
    """Three merges of two disjoint key blocks A and B, each block's (out, lse) from
    ``block_attention`` and the expected (out, lse) of their union:
    - "causal halves": causal, A the first half of the keys, B the second (rows of B fully masked
      for the early queries: lse = -inf, out = 0);
    - "both blocks masked": causal, A and B the third and fourth quarters (the first half of the
      queries sees neither: the union is masked too);
    - "large logits": not causal, q scaled so that the largest score is ``LARGE_LSE``."""
    q, k, v = problem["q"], problem["k"], problem["v"]
    s = q.shape[2]
    pos = torch.arange(s)
    halves = (slice(0, s // 2), slice(s // 2, s))
    quarters = (slice(s // 2, 3 * s // 4), slice(3 * s // 4, s))
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    big = q * (LARGE_LSE / scores.max())
    cases = {"causal halves": (q, halves, pos), "both blocks masked": (q, quarters, pos),
             "large logits": (big, halves, None)}
    out = {}
    for i, (name, (qq, (a, b), p)) in enumerate(cases.items()):
        kp = lambda cut: None if p is None else p[cut]                     # noqa: E731
        union = slice(a.start, b.stop)
        parts = [block_attention(qq, k[:, :, c], v[:, :, c], p, kp(c)) for c in (a, b, union)]
        for key, (o, lse) in zip(("a", "b", "want"), parts):
            out[f"{i}.out_{key}"], out[f"{i}.lse_{key}"] = o, lse
    return out


def problem_case(seed, world_size: int, shape: dict) -> tuple[dict, str]:
    """(problem, description): the stored set when seed is None, else a fresh one."""
    sizes = (f"{world_size} ranks, b={shape['batch']}, h={shape['heads']}, s={shape['seq']}, "
             f"d={shape['dim']}")
    if shape["seq"] % world_size:
        raise CheckFailed(f"s={shape['seq']} is not divisible by {world_size} ranks")
    if seed is None:      # the stored whole-sequence results serve any split of it
        if world_size not in STORED_WORLD_SIZES or shape != SHAPE:
            raise CheckFailed(f"the stored references are for {STORED_WORLD_SIZES} ranks and the "
                              f"default sizes; pass a seed to check other world sizes or sizes")
        from distlab.checks.stored import load
        return load(LAB, "attention"), f"the stored inputs ({sizes})"
    return context_problem(seed, **shape), f"fresh inputs (seed {seed}, {sizes})"


def shape_of(batch, heads, seq, dim) -> dict:
    return dict(batch=batch, heads=heads, seq=seq, dim=dim)


def layouts(problem: dict, world_size: int) -> dict[str, torch.Tensor]:
    """The splits a ring check runs: contiguous, and the problem's random permutation."""
    s = problem["q"].shape[2]
    return {"contiguous split": torch.arange(s).view(world_size, -1),
            "a random permutation of the positions": problem["perm"].view(world_size, -1)}


def at(t: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The tokens at ``positions`` of a (b, h, s, ...) tensor (the sequence is dim 2)."""
    return t[:, :, positions]


# What a check sends its ranks (their own tokens) and what it keeps (the marked references)

def with_expected(problem: dict, keys) -> dict:
    """``problem`` with the expected results of the check at hand (``keys``) marked as
    references: a marked tensor heading for a rank stops the launch (ReferenceLeak). Which keys
    are expected depends on the check: the forward's out and lse are the backward's inputs."""
    return {key: reference(t) if key in keys else t for key, t in problem.items()}


FORWARD_EXPECTED = ("full.out", "full.lse", "causal.out", "causal.lse")
BACKWARD_EXPECTED = tuple(f"{tag}.d{n}" for tag in ("full", "causal") for n in "qkv")


def _tag(causal: bool) -> str:
    return "causal" if causal else "full"


def rank_tokens(problem, cases, world_size: int, names) -> PerRank:
    """Each rank's own tokens of ``names`` ("{tag}" stands for the case's "full" or "causal")
    for every case, made here in the judge: rank r's list holds, per case, the tensors at
    ``positions[r]`` (copies) and nothing of the other ranks'."""
    return PerRank([[[at(problem[n.format(tag=_tag(causal))], positions[rank]) for n in names]
                     for positions, causal in cases] for rank in range(world_size)])
