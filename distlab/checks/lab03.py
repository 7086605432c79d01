"""Graded checks of Lab 3, "Tensor-parallel MLP".

Exercises, each run on real ranks (2 visible, 4 hidden) except the pure sharding functions:
1. ``shard_column(weight, bias, rank, world_size)`` and ``shard_row(...)``: rank r's contiguous
   slice of an nn.Linear's (out, in) weight: rows (output features) for column parallel, columns
   (input features) for row parallel, whose bias stays whole.
2. ``CopyToTensorParallel`` (identity forward, all-reduce backward) and
   ``ReduceFromTensorParallel`` (all-reduce forward, identity backward), ``.apply(x, group)``.
3. ``ColumnParallelLinear(dense, group)``, ``RowParallelLinear(dense, group)``,
   ``TensorParallelMLP(dense_mlp, group)`` and ``TensorParallelSwiGLU(dense_swiglu, group)``.
4. ``GatherFromSequenceParallel`` / ``ReduceScatterToSequenceParallel`` (``.apply(x, group)``,
   along the sequence dim 1) and ``SequenceParallelBlock(dense_block, group)``.

5. ``predict_ring_bytes``: the prediction, bytes per rank and pass on a ring (``lab03_prediction``).
References are the dense single-process modules of ``distlab.labs.tensor_parallel`` run on the full
input; a shard's gradient must equal the matching slice of the dense gradient. Tolerance: atol =
rtol = 1e-3 in float32: sums in another order (p partial sums) change results by about 1e-6 here,
any real mistake (a partial sum missing or counted twice, a wrong slice) by O(0.1); 1e-3 sits
between, with room for GPUs and the larger fan-ins of the hidden tests.
"""
from __future__ import annotations

import torch

from distlab.labs import tensor_parallel as tp
from distlab.checks.assertions import CheckFailed, assert_close
from distlab.checks.common import cut, nan_hint
from distlab.checks.ranks import run_each_backend
from distlab.checks.lab03_comms import expect_phase_comms
from distlab.checks.lab03_ranks import (blinded, blocks, dense_module, linears_on_rank,
                                        module_on_rank, op_on_rank, own)
from distlab.runtime.per_rank import PerRank, reference
from distlab.checks.lab03_problems import LAB, SHAPE, mlp_case, mlp_problem, mlp_shape  # noqa: F401 (LAB: the lab's name, read from here)
from distlab.checks import lab03_prediction as prediction

SEED = 3
# What this lab's checks' ranks import of PyTorch beyond torch.distributed (measured; distlab/checks/__init__.py)
RANK_IMPORTS = ()
ATOL = RTOL = 1e-3


def make_references() -> dict[str, dict]:
    """The stored reference sets of Lab 3 (see ``distlab.course.references``): default shapes, 2
    ranks; DTensor's runs of the lab's comparisons too (a handout has no DTensor plans)."""
    return {**tp.demos.dtensor_reference_sets(), "prediction": prediction.ring_bytes_set(),
            **{kind: mlp_problem(kind, SEED + i, **SHAPE)
               for i, kind in enumerate(["linear", "mlp", "swiglu", "block", "ops"])}}


def _close(got, expected, what: str, rank: int, hint: str = "") -> None:
    assert_close(got, expected, what=what, rank=rank, atol=ATOL, rtol=RTOL,
                 hint=nan_hint(got, expected, hint))


# Exercise 1: sharding (pure functions, checked in the kernel for every rank)

def _linear_from(ref: dict, prefix: str) -> tuple[torch.Tensor, torch.Tensor]:
    return ref[f"{prefix}param.weight"], ref[f"{prefix}param.bias"]


def check_shard_column(shard_column, world_size: int = 2, seed: int | None = None,
                       batch=2, seq=8, hidden=16, ffn=64) -> None:
    """Rank r's column shard of an (f, h) weight is rows [r f/p, (r+1) f/p) and the same bias
    slice; concatenated over ranks, x W_r^T + b_r must give the dense output."""
    ref, case = mlp_case("linear", seed, world_size, mlp_shape(batch, seq, hidden, ffn))
    weight, bias = _linear_from(ref, "col.")
    outputs = []
    for rank in range(world_size):
        w, b = shard_column(weight.clone(), bias.clone(), rank, world_size)
        hint = ("Column parallel splits the output features: nn.Linear's weight is (out, in), so "
                "take rows, dim 0, the contiguous block r of p; the bias is split the same way.")
        _close(w, cut(weight, 0, rank, world_size), f"shard_column weight on {case}", rank, hint)
        _close(b, cut(bias, 0, rank, world_size), f"shard_column bias on {case}", rank, hint)
        outputs.append(ref["x"] @ w.T + b)                     # (b, s, f/p)
    _close(torch.cat(outputs, dim=-1), ref["col.y"], f"concatenated column outputs on {case}", None)


def check_shard_row(shard_row, world_size: int = 2, seed: int | None = None,
                    batch=2, seq=8, hidden=16, ffn=64) -> None:
    """Rank r's row shard of an (h, f) weight is columns [r f/p, (r+1) f/p); the bias is whole.
    Summed over ranks, z_r W_r^T plus the bias once must give the dense output."""
    ref, case = mlp_case("linear", seed, world_size, mlp_shape(batch, seq, hidden, ffn))
    weight, bias = _linear_from(ref, "row.")
    total = 0
    for rank in range(world_size):
        w, b = shard_row(weight.clone(), bias.clone(), rank, world_size)
        hint = ("Row parallel splits the input features: columns of nn.Linear's (out, in) "
                "weight, dim 1, the contiguous block r of p.")
        _close(w, cut(weight, 1, rank, world_size), f"shard_row weight on {case}", rank, hint)
        _close(b, bias, f"shard_row bias on {case}", rank,
               "Keep the whole bias on every rank: it is added once, after the partial outputs "
               "are summed (splitting or scaling it gives a different layer).")
        total = total + cut(ref["z"], -1, rank, world_size) @ w.T   # (b, s, h) partial
    _close(total + bias, ref["row.y"], f"summed row outputs on {case}", None)


# Exercise 2: the conjugate operators f and g (and, in exercise 4, their sequence-parallel twins)

def _operator_check(op_cls, name, world_size, seed, shape, xs_of, gs_of, y_of, dx_of,
                    comms_of, hint) -> None:
    ref, case = mlp_case("ops", seed, world_size, shape)
    xs, gs = xs_of(ref), gs_of(ref)
    # Each rank gets its own x and g (copies: a view would carry the others' too); what they
    # should give is computed here, in the judge, from every rank's inputs.
    mine = lambda ts: PerRank([t.clone() for t in ts])   # noqa: E731
    for backend, out in run_each_backend(op_on_rank, world_size, op_cls, mine(xs), mine(gs)):
        where = f"{case}, {out.backend}"
        for rank, res in enumerate(out):
            if res["input_changed"]:
                raise CheckFailed(f"{name} on {where}: rank {rank}'s forward changed its input in "
                                  f"place (collectives write into the tensor you pass). Clone first.")
            _close(res["y"], reference(y_of(xs, rank)), f"{name} forward output on {where}", rank, hint)
            _close(res["dx"], reference(dx_of(gs, rank)), f"{name} input gradient on {where}", rank, hint)
        expect_phase_comms(out, comms_of(xs), name, where)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def check_copy_to_tp(op_cls, world_size: int = 2, seed: int | None = None,
                     batch=2, seq=8, hidden=16) -> None:
    """f: y = x on every rank; dL/dx = sum over ranks of dL/dy; forward silent, backward one
    all_reduce of x's size."""
    _operator_check(
        op_cls, "CopyToTensorParallel", world_size, seed, mlp_shape(batch, seq, hidden, 64),
        lambda r: r["xs"], lambda r: r["gs"],
        lambda xs, rank: xs[rank], lambda gs, rank: gs.sum(0),
        lambda xs: [[], [("all_reduce", _nbytes(xs[0]))]],
        "f is the identity forward; backward it all-reduces (sums) the gradient, because each "
        "rank's shard of the next layer produced only part of dL/dx.")


def check_reduce_from_tp(op_cls, world_size: int = 2, seed: int | None = None,
                         batch=2, seq=8, hidden=16) -> None:
    """g: y = sum over ranks of x; dL/dx = dL/dy (identity); forward one all_reduce, backward silent."""
    _operator_check(
        op_cls, "ReduceFromTensorParallel", world_size, seed, mlp_shape(batch, seq, hidden, 64),
        lambda r: r["xs"], lambda r: r["gs"],
        lambda xs, rank: xs.sum(0), lambda gs, rank: gs[rank],
        lambda xs: [[("all_reduce", _nbytes(xs[0]))], []],
        "g all-reduces (sums) the partial outputs forward; backward the gradient passes through "
        "unchanged: the output is replicated, so each rank's gradient is already the whole one.")


def check_gather_from_sp(op_cls, world_size: int = 2, seed: int | None = None,
                         batch=2, seq=8, hidden=16) -> None:
    """All-gather along the sequence (dim 1) forward, reduce-scatter backward.
    Rank r holds x_r = x[:, r-th block]; y = x on every rank; dL/dx_r = (sum_q g_q)[:, r-th block]."""
    p = world_size
    _operator_check(
        op_cls, "GatherFromSequenceParallel", world_size, seed, mlp_shape(batch, seq, hidden, 64),
        lambda r: torch.stack([cut(r["xs"][0], 1, q, p) for q in range(p)]),   # (p, b, s/p, h)
        lambda r: r["gs"],                                                       # (p, b, s, h)
        lambda xs, rank: torch.cat(list(xs), dim=1),
        lambda gs, rank: cut(gs.sum(0), 1, rank, p),
        lambda xs: [[("all_gather", p * _nbytes(xs[0]))], [("reduce_scatter", p * _nbytes(xs[0]))]],
        "Forward: concatenate the ranks' sequence blocks in rank order along dim 1. Backward: every "
        "rank used the whole sequence, so sum the gradients and give each rank its own block.")


def check_reduce_scatter_to_sp(op_cls, world_size: int = 2, seed: int | None = None,
                               batch=2, seq=8, hidden=16) -> None:
    """Reduce-scatter along the sequence (dim 1) forward, all-gather backward.
    y_r = (sum_q x_q)[:, r-th block]; dL/dx_r = concatenation of every rank's g_q."""
    p = world_size
    _operator_check(
        op_cls, "ReduceScatterToSequenceParallel", world_size, seed, mlp_shape(batch, seq, hidden, 64),
        lambda r: r["xs"],                                                        # (p, b, s, h)
        lambda r: torch.stack([cut(r["gs"][0], 1, q, p) for q in range(p)]),   # (p, b, s/p, h)
        lambda xs, rank: cut(xs.sum(0), 1, rank, p),
        lambda gs, rank: torch.cat(list(gs), dim=1),
        lambda xs: [[("reduce_scatter", _nbytes(xs[0]))], [("all_gather", _nbytes(xs[0]))]],
        "Forward: sum the partial (b, s, h) tensors and keep your sequence block. Backward: each "
        "rank needs the gradient of the whole sequence, so all-gather the blocks along dim 1.")


# Exercise 3: parallel linear layers and the tensor-parallel MLPs

# How each parameter of the tensor-parallel module relates to the dense one: (dense name,
# dim along which it is sliced, or None when every rank holds it whole).
_LAYOUT = {
    "mlp": {"fc1.weight": ("fc1.weight", 0), "fc1.bias": ("fc1.bias", 0),
            "fc2.weight": ("fc2.weight", 1), "fc2.bias": ("fc2.bias", None)},
    "swiglu": {"w1.weight": ("w1.weight", 0), "w3.weight": ("w3.weight", 0),
               "w2.weight": ("w2.weight", 1)},
    "block": {"fc1.weight": ("mlp.fc1.weight", 0), "fc1.bias": ("mlp.fc1.bias", 0),
              "fc2.weight": ("mlp.fc2.weight", 1), "fc2.bias": ("mlp.fc2.bias", "sum"),
              "norm.weight": ("norm.weight", "sum"), "norm.bias": ("norm.bias", "sum")},
}
_HOW = {0: "this rank's block of rows (output features)",
        1: "this rank's block of columns (input features)", None: "a whole copy"}


def _check_module(student_cls, kind: str, what: str, world_size: int, seed, shape: dict,
                  sequence_parallel: bool = False) -> None:
    ref, case = mlp_case(kind, seed, world_size, shape)
    layout = _LAYOUT[kind]
    dense = dense_module(kind, ref)
    weights = {name: tuple(p.shape) for name, p in dense.named_parameters() if p.dim() == 2}
    b, s, h = ref["x"].shape
    act = b * s * h * 4
    comms = ([[("all_gather", act), ("reduce_scatter", act)]] * 2 if sequence_parallel
             else [[("all_reduce", act)], [("all_reduce", act)]])
    # Each rank: the dense module NaN outside its shard, and its sequence block (sequence
    # parallel) or the replicated x and dy.
    shards = blinded(dense, dict(layout.values()), world_size)
    x, dy = ((blocks(ref["x"], 1, world_size), blocks(ref["dy"], 1, world_size))
             if sequence_parallel else (ref["x"], ref["dy"]))
    for backend, out in run_each_backend(module_on_rank, world_size, shards, x, dy, student_cls,
                                         list(layout)):
        where = f"{case}, {out.backend}"
        for rank, res in enumerate(out):
            mine = (lambda t: cut(t, 1, rank, world_size)) if sequence_parallel else (lambda t: t)
            _close(res["y"], mine(ref["y"]), f"{what} output on {where}", rank,
                   "The output must equal the dense module's" +
                   (" sequence block of this rank." if sequence_parallel else ", on every rank."))
        # Right outputs computed the wrong way (gathered weights) are a communication mistake:
        # say so before the gradients, which such shortcuts usually get wrong as well.
        expect_phase_comms(out, comms, what, where, weights)
        for rank, res in enumerate(out):
            mine = (lambda t: cut(t, 1, rank, world_size)) if sequence_parallel else (lambda t: t)
            _close(res["dx"], mine(ref["dx"]), f"{what} input gradient on {where}", rank,
                   "dL/dx sums the contributions of every rank's shards: is the backward "
                   "collective in place?")
        for name, (dense_name, dim) in layout.items():
            full = ref[f"grad.{dense_name}"]
            if dim == "sum":   # replicated, but applied to this rank's tokens only
                got = [res["grads"][name] for res in out]
                if any(g is None for g in got):
                    raise CheckFailed(f"{what} on {where}: {name} has no gradient on some rank.")
                _close(sum(got), full, f"{what}: {name} gradients summed over ranks on {where}",
                       None, "A replicated parameter applied to sequence shards (norm, fc2's bias) gets "
                             "a partial gradient on each rank, from its own tokens; do not all-reduce "
                             "it inside the block (that belongs to the optimizer step).")
                continue
            for rank, res in enumerate(out):
                got = res["grads"][name]
                want = full if dim is None else cut(full, dim, rank, world_size)
                if got is None:
                    raise CheckFailed(f"{what} on {where}: {name} on rank {rank} got no gradient; "
                                      f"is it an nn.Parameter used in forward?")
                _close(got, want, f"{what}: gradient of {name} on {where}", rank,
                       f"{name} should be {_HOW[dim]} of the dense {dense_name}, and so should "
                       f"its gradient.")


def check_parallel_linears(col_cls, row_cls, world_size: int = 2, seed: int | None = None,
                           batch=2, seq=8, hidden=16, ffn=64) -> None:
    """ColumnParallelLinear(dense h->f, group): output = rank's block of the dense output features,
    backward one all_reduce of dL/dx. RowParallelLinear(dense f->h, group) on the rank's block of
    input features: output = the dense output, forward one all_reduce."""
    ref, case = mlp_case("linear", seed, world_size, mlp_shape(batch, seq, hidden, ffn))
    p = world_size
    act_in, act_out = _nbytes(ref["x"]), _nbytes(ref["dy"])
    weights = {"the column layer's weight": tuple(ref["col.param.weight"].shape),
               "the row layer's weight": tuple(ref["row.param.weight"].shape)}
    col = blinded(dense_module("linear", ref, "col."), {"weight": 0, "bias": 0}, p).values
    row = blinded(dense_module("linear", ref, "row."), {"weight": 1}, p).values
    layers = PerRank([((col[r], ref["x"], own(ref["dy_col"], -1, r, p)),
                       (row[r], own(ref["z"], -1, r, p), ref["dy"])) for r in range(p)])
    for backend, out in run_each_backend(linears_on_rank, world_size, layers, col_cls, row_cls):
        where = f"{case}, {out.backend}"
        for rank, res in enumerate(out):
            c, r = res["col"], res["row"]
            _close(c["y"], cut(ref["col.y"], -1, rank, p), f"ColumnParallelLinear output on {where}",
                   rank, "Each rank outputs its own block of the output features (no gather).")
            _close(c["dx"], ref["col.dx"], f"ColumnParallelLinear input gradient on {where}", rank,
                   "dL/dx is the sum over ranks of each shard's contribution: all-reduce it backward.")
            _close(c["grads"]["weight"], cut(ref["col.grad.weight"], 0, rank, p),
                   f"ColumnParallelLinear weight gradient on {where}", rank)
            _close(c["grads"]["bias"], cut(ref["col.grad.bias"], 0, rank, p),
                   f"ColumnParallelLinear bias gradient on {where}", rank)
            _close(r["y"], ref["row.y"], f"RowParallelLinear output on {where}", rank,
                   "Sum the partial outputs over ranks, then add the bias once.")
            _close(r["dx"], cut(ref["row.dx"], -1, rank, p), f"RowParallelLinear input gradient on {where}", rank)
            _close(r["grads"]["weight"], cut(ref["row.grad.weight"], 1, rank, p),
                   f"RowParallelLinear weight gradient on {where}", rank)
            _close(r["grads"]["bias"], ref["row.grad.bias"], f"RowParallelLinear bias gradient on {where}", rank)
        expect_phase_comms(out, [[], [("all_reduce", act_in)], [("all_reduce", act_out)], []],
                     "ColumnParallelLinear / RowParallelLinear", where, weights,
                     labels=("column forward", "column backward", "row forward", "row backward"))


def check_tp_mlp(student_cls, world_size: int = 2, seed: int | None = None,
                 batch=2, seq=8, hidden=16, ffn=64) -> None:
    """TensorParallelMLP(dense MLP, group): output and dL/dx equal the dense MLP's on every rank,
    each shard's gradient equals the matching slice of the dense gradient, and the block issues
    exactly one all_reduce of b*s*h elements forward and one backward."""
    _check_module(student_cls, "mlp", "TensorParallelMLP", world_size, seed,
                  mlp_shape(batch, seq, hidden, ffn))


def check_tp_swiglu(student_cls, world_size: int = 2, seed: int | None = None,
                    batch=2, seq=8, hidden=16, ffn=64) -> None:
    """TensorParallelSwiGLU(dense SwiGLU, group): as check_tp_mlp, with w1 and w3 column parallel
    and w2 row parallel: still one all_reduce each way."""
    _check_module(student_cls, "swiglu", "TensorParallelSwiGLU", world_size, seed,
                  mlp_shape(batch, seq, hidden, ffn))


# Exercise 4: sequence parallelism

def check_sequence_parallel_block(student_cls, world_size: int = 2, seed: int | None = None,
                                  batch=2, seq=8, hidden=16, ffn=64) -> None:
    """SequenceParallelBlock(dense Block, group) on rank r's sequence block (b, s/p, h): output and
    dL/dx equal that block of the dense results; fc1/fc2 gradients are the dense slices; the
    norm's gradients summed over ranks equal the dense ones. Collectives each way: one all-gather
    and one reduce-scatter of b*s*h elements, no all-reduce."""
    _check_module(student_cls, "block", "SequenceParallelBlock", world_size, seed,
                  mlp_shape(batch, seq, hidden, ffn), sequence_parallel=True)


def check_predicted_ring_bytes(predict_ring_bytes, seed: int | None = None) -> None:
    """``predict_ring_bytes(batch, seq, hidden, world_size, variant)`` against the formula."""
    prediction.grade_ring_bytes(predict_ring_bytes, seed)


# The course code these exercises may not use (see distlab.checks.course_code).
from distlab.checks.course_code import LAB3_SHIPPED, CourseCode  # noqa: E402
COURSE_CODE = dict.fromkeys([
    "check_shard_column", "check_shard_row", "check_copy_to_tp", "check_reduce_from_tp",
    "check_gather_from_sp", "check_reduce_scatter_to_sp", "check_parallel_linears",
    "check_tp_mlp", "check_tp_swiglu", "check_sequence_parallel_block",
    "check_predicted_ring_bytes"], CourseCode(forbidden=LAB3_SHIPPED + prediction.CODE))
from distlab.checks.messenger import judge_module  # noqa: E402  (while grading, checks run in the judge)
judge_module(globals())
