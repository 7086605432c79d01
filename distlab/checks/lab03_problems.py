"""Lab 3's problems: inputs drawn from a seed and the dense single-process results every check
compares with (the stored set for visible tests, a fresh one for hidden tests)."""
from __future__ import annotations

import torch
import torch.nn as nn

from distlab.checks.common import dense_run
from distlab.labs import tensor_parallel as tp

LAB = "03_tensor_parallel_mlp"
SHAPE = dict(batch=2, seq=8, hidden=16, ffn=64)   # seq and ffn divisible by 2 and 4


def mlp_problem(kind: str, seed: int, batch: int, seq: int, hidden: int, ffn: int,
            world_size: int = 2) -> dict:
    """Inputs and dense results for one exercise family, all drawn from ``seed``.

    "mlp" / "swiglu" / "block": x, dy (b, s, h) and the dense module's y, dx, param.*, grad.*.
    "linear": a column layer h->f with input x and upstream dy_col (b, s, f), a row layer f->h
    with input z (b, s, f) and upstream dy (b, s, h); keys prefixed col. and row.
    "ops": per-rank tensors xs, gs of shape (p, b, s, h) for the communication operators.
    """
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, seq, hidden, generator=g)          # (b, s, h)
    dy = torch.randn(batch, seq, hidden, generator=g)         # (b, s, h)
    if kind == "ops":
        return {"seed": seed, "xs": torch.randn(world_size, batch, seq, hidden, generator=g),
                "gs": torch.randn(world_size, batch, seq, hidden, generator=g)}
    if kind == "linear":
        z = torch.randn(batch, seq, ffn, generator=g)          # (b, s, f)
        dy_col = torch.randn(batch, seq, ffn, generator=g)     # (b, s, f)
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            col, row = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)
        return {"seed": seed, "x": x, "dy_col": dy_col, "z": z, "dy": dy,
                **dense_run(col, x, dy_col, "col."), **dense_run(row, z, dy, "row.")}
    model = tp.dense_mlp(kind, hidden, ffn, seed)
    return {"seed": seed, "x": x, "dy": dy, **dense_run(model, x, dy)}



def mlp_case(kind: str, seed, world_size: int, shape: dict) -> tuple[dict, str]:
    """(problem, description): the stored set when seed is None, else a fresh one."""
    if seed is None:
        if world_size != 2 or any(shape[k] != SHAPE[k] for k in SHAPE):
            raise ValueError("stored references are for 2 ranks and the default shapes; "
                             "pass a seed to check other world sizes or shapes")
        from distlab.checks.stored import load
        return marked_mlp_problem(load(LAB, kind)), "the stored inputs (2 ranks)"
    s = shape
    return (marked_mlp_problem(mlp_problem(kind, seed, world_size=world_size, **shape)),
            f"fresh inputs (seed {seed}, {world_size} ranks, b={s['batch']} s={s['seq']} "
            f"h={s['hidden']} f={s['ffn']})")


def mlp_shape(batch, seq, hidden, ffn) -> dict:
    return dict(batch=batch, seq=seq, hidden=hidden, ffn=ffn)



def _is_expected(key: str) -> bool:
    """Whether a problem's key holds an expected result (the dense outputs and gradients, of the
    linear pair too: ``col.y``, ``row.grad.weight``), not an input (x, dy, z, param.*, xs, gs)."""
    base = key.split(".", 1)[1] if key.startswith(("col.", "row.")) else key
    return base in ("y", "dx") or base.startswith("grad.")


def marked_mlp_problem(problem: dict) -> dict:
    """``problem`` with its expected results marked (``distlab.runtime.per_rank.reference``):
    they stay in the judge; heading for a rank, they stop the launch."""
    from distlab.runtime.per_rank import reference
    return {k: reference(v) if _is_expected(k) else v for k, v in problem.items()}
