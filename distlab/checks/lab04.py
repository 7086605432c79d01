"""Graded checks of Lab 4, "Tensor-parallel attention".

Exercises (each on real ranks, 2 visible, 4 hidden, except the pure split function):
1. ``split_qkv(weight, bias, rank, world_size, n_heads, n_kv_heads)``: rank r's rows of a fused
   ((nh + 2 nkv) hs, h) QKV weight, laid out [q heads | k heads | v heads]: its nh/p query heads,
   then its nkv/p key heads, then the same value heads.
2. ``TensorParallelAttention(dense_attention, group)`` forward: output equal to the dense
   attention on every rank, one all_reduce of (b, s, h) forward.
3. the same module's backward: dL/dx on every rank, and every shard's gradient equal to the
   matching rows/columns of the dense gradient; one all_reduce of (b, s, h) backward.
4. ``TensorParallelTransformerBlock(dense_block, group)``: attention + Lab 3's MLP, exactly two
   all_reduces of (b, s, h) forward and two backward.
5. ``vocab_parallel_cross_entropy(logits_shard, target, group)``: the mean cross-entropy from
   logits sharded over the vocabulary, with small all_reduces (one number per token) only.

References are the dense single-process modules of ``distlab.labs.attention`` (``Attention``,
``TransformerBlock``) and ``F.cross_entropy`` on the full logits.

Tolerance: atol = rtol = 1e-3 in float32, as in Lab 3: the ranks sum the same products in another
order (about 1e-6 here); a wrong head, a missing partial sum or a double count moves values by
O(0.1). The vocabulary logits carry per-token offsets up to 150, so exp() without subtracting the
global max overflows float32 (exp(89) > 3.4e38) and the check says so.
"""
from __future__ import annotations

import torch

from distlab.labs import attention as att
from distlab.checks.assertions import CheckFailed, assert_close
from distlab.checks.common import cut, describe_comms, nan_hint, rank_device, split_phases
from distlab.checks.crossed import assert_crossed_as_recorded
from distlab.checks.ranks import run_each_backend
from distlab.checks.lab04_problems import (LAB, MAX_OFFSET, SHAPE, VOCAB_SHAPE,  # noqa: F401 (LAB: read here)
                                          attention_case, attention_problem, blinded_modules,
                                          decoded, dense_module_of, qkv_layout_of)  # noqa: F401 (dense_module_of: read here)
from distlab.runtime.per_rank import PerRank

SEED = 4
# What this lab's checks' ranks import of PyTorch beyond torch.distributed (measured; distlab/checks/__init__.py)
RANK_IMPORTS = ()
ATOL = RTOL = 1e-3


def make_references() -> dict[str, dict]:
    """The stored reference sets of Lab 4 (see ``distlab.course.references``): default shapes, 2
    ranks; and the scaling exercise's visible cases."""
    from distlab.checks.lab04_scaling import reference_set
    return {"attention": attention_problem("attention", SEED, **SHAPE),
            "block": attention_problem("block", SEED + 1, **SHAPE),
            "vocab": attention_problem("vocab", SEED + 2, **VOCAB_SHAPE),
            "scaling": reference_set()}



def _close(got, expected, what: str, rank, hint: str = "") -> None:
    assert_close(got, expected, what=what, rank=rank, atol=ATOL, rtol=RTOL,
                 hint=nan_hint(got, expected, hint))


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


# ---------------------------------------------------------------------------------------------
# Heads: say which heads a rank got, when it got the wrong ones

def _heads_message(got_rows: torch.Tensor, weight: torch.Tensor, layout: att.QKVLayout,
                   rank: int, world_size: int) -> str | None:
    """None when `got_rows` are exactly the rank's head rows; else a sentence naming the heads."""
    want = layout.rank_heads(rank, world_size)
    if got_rows.shape == (len(want) * layout.head_dim, weight.shape[1]) and \
            torch.allclose(got_rows, weight[layout.rank_rows(rank, world_size)], atol=1e-6):
        return None
    got = att.identify_heads(got_rows, weight, layout)
    unknown = ' ("?" = rows that are no head of the dense weight)' if "?" in got else ""
    text = (f"rank {rank}'s shard holds the head blocks [{' '.join(got)}]{unknown} but should hold "
            f"[{' '.join(want)}]: its {layout.n_heads // world_size} of {layout.n_heads} query heads, "
            f"then its {layout.n_kv_heads // world_size} of {layout.n_kv_heads} key heads and the "
            f"same value heads.")
    names, per = layout.heads(), len(layout.heads()) // world_size
    count = {kind: sum(n.startswith(kind) for n in got) for kind in "qkv"}
    if got == names[rank * per:(rank + 1) * per]:
        text += (" You cut the fused weight into one contiguous block of rows per rank: that gives "
                 "rank 0 only queries and the last rank only values. Split Q, K and V separately, "
                 "take this rank's heads from each, and concatenate them [q | k | v].")
    elif "?" not in got and (count["k"], count["v"]) != (layout.n_kv_heads // world_size,) * 2:
        text += (f" It has {count['q']} query, {count['k']} key and {count['v']} value blocks. Q has "
                 f"{layout.n_heads} heads but K and V have {layout.n_kv_heads} each (grouped-query "
                 f"attention): cut each of Q, K and V into {world_size} equal parts of its own size.")
    return text


# ---------------------------------------------------------------------------------------------
# Exercise 1: split_qkv (pure function, checked in the kernel for every rank)

def check_split_qkv(split_qkv, world_size: int = 2, seed: int | None = None, batch=2, seq=8,
                    hidden=32, n_heads=4, n_kv_heads=2) -> None:
    """For each rank r: the weight rows and bias entries of its heads, in [q | k | v] order; the
    ranks' local attentions, concatenated over ranks, equal the dense attention before proj."""
    shape = _attention_shape(batch, seq, hidden, n_heads, n_kv_heads)
    ref, case = attention_case("attention", seed, world_size, shape)
    layout, p = qkv_layout_of(ref), world_size
    weight, bias = ref["param.qkv.weight"], ref["param.qkv.bias"]
    outputs = []
    for rank in range(p):
        w, b = split_qkv(weight.clone(), bias.clone(), rank, p, layout.n_heads, layout.n_kv_heads)
        message = _heads_message(w, weight, layout, rank, p)
        if message:
            raise CheckFailed(f"split_qkv weight on {case}: {message}")
        _close(b, bias[layout.rank_rows(rank, p)], f"split_qkv bias on {case}", rank,
               "The bias entries belong to the same rows as the weight: split it by heads too.")
        local = ref["x"] @ w.T + b                                           # (b, s, (nh+2nkv) hs/p)
        outputs.append(att.attend(local, layout.n_heads // p, layout.n_kv_heads // p))
    dense = att.attend(ref["x"] @ weight.T + bias, layout.n_heads, layout.n_kv_heads)  # (b, s, h)
    _close(torch.cat(outputs, dim=-1), dense, f"attention of the concatenated head shards on {case}",
           None)


# ---------------------------------------------------------------------------------------------
# Exercises 2-4: modules on real ranks

def _grads(module, names) -> dict:
    out = {}
    for name in names:
        try:
            p = module.get_parameter(name)
        except AttributeError:
            raise AttributeError(f"{type(module).__name__} has no parameter {name!r}: the check "
                                 f"finds the shards by name; keep the names of the exercise "
                                 f"({', '.join(names)}).") from None
        out[name] = None if p.grad is None else p.grad.detach()
    return out


def _module_on_rank(rank, world_size, dense, x, dy, student_cls, names, qkv_name):
    """Rank body: wrap this rank's dense module (NaN outside its shard), forward x, barrier,
    backward with dy; return what the student's module produced (the judge compares)."""
    import torch.distributed as dist

    dev = rank_device()
    model = student_cls(dense.to(dev), None).to(dev)
    x = x.to(dev).clone().requires_grad_(True)
    y = model(x)
    dist.barrier()
    (y * dy.to(dev)).sum().backward()
    try:
        qkv = model.get_parameter(qkv_name).detach()
    except AttributeError:
        qkv = None
    return {"y": y.detach(), "dx": x.grad, "grads": _grads(model, names), "qkv": qkv}


# Parameter name -> (dense name, how rank r's shard relates to the dense tensor):
# "heads" = rows of r's heads in the fused QKV, 0 = r's block of rows, 1 = of columns, None = whole.
_ATTENTION = {"qkv.weight": ("qkv.weight", "heads"), "qkv.bias": ("qkv.bias", "heads"),
              "proj.weight": ("proj.weight", 1), "proj.bias": ("proj.bias", None)}
_LAYOUT = {
    "attention": _ATTENTION,
    "block": {**{f"attn.{k}": (f"attn.{d}", how) for k, (d, how) in _ATTENTION.items()},
              "norm1.weight": ("norm1.weight", None), "norm1.bias": ("norm1.bias", None),
              "norm2.weight": ("norm2.weight", None), "norm2.bias": ("norm2.bias", None),
              "mlp.fc1.weight": ("mlp.fc1.weight", 0), "mlp.fc1.bias": ("mlp.fc1.bias", 0),
              "mlp.fc2.weight": ("mlp.fc2.weight", 1), "mlp.fc2.bias": ("mlp.fc2.bias", None)},
}
_HOW = {"heads": "this rank's head rows ([q | k | v]) of the dense",
        0: "this rank's block of rows of the dense",
        1: "this rank's block of columns of the dense",
        None: "a whole copy of the dense"}


def _expected_slice(full, how, layout, rank, p):
    if how == "heads":
        return full[layout.rank_rows(rank, p)]
    return full if how is None else cut(full, how, rank, p)


def _run_module(kind: str, student_cls, world_size: int, seed, shape: dict):
    ref, case = attention_case(kind, seed, world_size, shape)
    qkv_layout_of(ref).check_degree(world_size)
    prefix = "attn." if kind == "block" else ""
    # Each rank: the dense module with what its shard must not read NaN; x and dy replicated.
    dense = PerRank(blinded_modules(kind, ref, dict(_LAYOUT[kind].values()), world_size))
    runs = run_each_backend(_module_on_rank, world_size, dense, ref["x"], ref["dy"], student_cls,
                            list(_LAYOUT[kind]), f"{prefix}qkv.weight")
    return ref, case, runs


def _check_comms(out, n_all_reduce: int, act: int, what: str, where: str, phase: int) -> None:
    """Rank r's `phase` (0 forward, 1 backward) must issue exactly n all_reduces of `act` bytes;
    and what crossed must be within what the record says (``distlab.checks.crossed``)."""
    assert_crossed_as_recorded(out, f"{what} on {where}")
    label = ("forward", "backward")[phase]
    for rank, comms in enumerate(out.comms):
        issued = split_phases(comms, 2, what, rank)[phase]
        got = sorted((c.op, c.bytes) for c in issued)
        if got == [("all_reduce", act)] * n_all_reduce:
            continue
        hint = ("An all_gather means something is being assembled that tensor parallelism keeps "
                "split (heads, weights or features)." if any("gather" in c.op for c in issued) else
                "Each row-parallel projection sums its partial outputs with one all_reduce forward; "
                "each f in front of a column-parallel projection all-reduces dL/dx backward.")
        raise CheckFailed(f"{what} on {where}: rank {rank}'s {label} should issue exactly "
                          f"{n_all_reduce} all_reduce of {act} bytes (b*s*h float32); it issued "
                          f"{describe_comms(issued)}.\n{hint}")


def _diagnose_output(res, ref, rank, p, prefix="") -> str:
    """The forward's hint: the heads the rank's qkv holds, when they are the wrong ones."""
    layout, weight = qkv_layout_of(ref), ref[f"param.{prefix}qkv.weight"]
    # The rank's qkv rows outside its heads were coded NaNs: decoded, they name the heads it took.
    message = (_heads_message(decoded(res["qkv"], weight), weight, layout, rank, p)
               if res["qkv"] is not None else None)
    return message or ("The qkv shard holds the right heads; look at the local head counts "
                       "(nh/p and nkv/p) given to the attention, and at the output projection: "
                       "row parallel, partial outputs summed by one all_reduce, bias added once.")


def _check_outputs(out, ref, what, where, prefix="") -> None:
    p = len(out)
    for rank, res in enumerate(out):
        if res["y"].shape != ref["y"].shape or not torch.allclose(res["y"], ref["y"], atol=ATOL, rtol=RTOL):
            _close(res["y"], ref["y"], f"{what} output on {where}", rank,
                   _diagnose_output(res, ref, rank, p, prefix))


def _check_gradients(out, ref, kind, what, where) -> None:
    layout, p = qkv_layout_of(ref), len(out)
    for rank, res in enumerate(out):
        _close(res["dx"], ref["dx"], f"{what} input gradient on {where}", rank,
               "dL/dx sums every rank's heads' contributions: an f (copy_to_tp) in front of the "
               "qkv projection all-reduces it backward.")
        for name, (dense_name, how) in _LAYOUT[kind].items():
            got = res["grads"][name]
            if got is None:
                raise CheckFailed(f"{what} on {where}: {name} on rank {rank} got no gradient; is it "
                                  f"an nn.Parameter used in forward?")
            want = _expected_slice(ref[f"grad.{dense_name}"], how, layout, rank, p)
            _close(got, want, f"{what}: gradient of {name} on {where}", rank,
                   f"{name} should be {_HOW[how]} {dense_name}, and so should its gradient.")


def _attention_shape(batch, seq, hidden, n_heads, n_kv_heads) -> dict:
    return dict(batch=batch, seq=seq, hidden=hidden, n_heads=n_heads, n_kv_heads=n_kv_heads,
                ffn=SHAPE["ffn"])


def check_tp_attention_forward(student_cls, world_size: int = 2, seed: int | None = None,
                               batch=2, seq=8, hidden=32, n_heads=4, n_kv_heads=2) -> None:
    """TensorParallelAttention(dense Attention, group): output equal to the dense attention's on
    every rank (atol 1e-3), and exactly one all_reduce of b*s*h floats in the forward."""
    shape = _attention_shape(batch, seq, hidden, n_heads, n_kv_heads)
    ref, case, runs = _run_module("attention", student_cls, world_size, seed, shape)
    act = _nbytes(ref["x"])
    for backend, out in runs:
        where = f"{case}, {out.backend}"
        _check_outputs(out, ref, "TensorParallelAttention", where)
        _check_comms(out, 1, act, "TensorParallelAttention", where, phase=0)


def check_tp_attention_backward(student_cls, world_size: int = 2, seed: int | None = None,
                                batch=2, seq=8, hidden=32, n_heads=4, n_kv_heads=2) -> None:
    """TensorParallelAttention backward: dL/dx equal to the dense one on every rank; qkv.weight
    and qkv.bias gradients equal the dense gradient's rows of the rank's heads, proj.weight's its
    block of columns, proj.bias's the whole; exactly one all_reduce of b*s*h floats backward."""
    shape = _attention_shape(batch, seq, hidden, n_heads, n_kv_heads)
    ref, case, runs = _run_module("attention", student_cls, world_size, seed, shape)
    act = _nbytes(ref["x"])
    for backend, out in runs:
        where = f"{case}, {out.backend}"
        _check_outputs(out, ref, "TensorParallelAttention", where)
        _check_gradients(out, ref, "attention", "TensorParallelAttention", where)
        _check_comms(out, 1, act, "TensorParallelAttention", where, phase=1)


def check_tp_block(student_cls, world_size: int = 2, seed: int | None = None, batch=2, seq=8,
                   hidden=32, n_heads=4, n_kv_heads=2, ffn=64) -> None:
    """TensorParallelTransformerBlock(dense TransformerBlock, group): output, dL/dx and every
    shard's gradient equal the dense ones (norms replicated, whole gradients); exactly two
    all_reduces of b*s*h floats forward (attention's proj, the MLP's fc2) and two backward."""
    shape = dict(batch=batch, seq=seq, hidden=hidden, n_heads=n_heads, n_kv_heads=n_kv_heads, ffn=ffn)
    ref, case, runs = _run_module("block", student_cls, world_size, seed, shape)
    act = _nbytes(ref["x"])
    what = "TensorParallelTransformerBlock"
    for backend, out in runs:
        where = f"{case}, {out.backend}"
        _check_outputs(out, ref, what, where, prefix="attn.")
        _check_comms(out, 2, act, what, where, phase=0)
        _check_gradients(out, ref, "block", what, where)
        _check_comms(out, 2, act, what, where, phase=1)


# ---------------------------------------------------------------------------------------------
# Exercise 5: vocabulary-parallel cross-entropy

def _loss_on_rank(rank, world_size, fn, shard, target):
    """Rank body: this rank's vocabulary slice of the logits (its only one) -> fn -> barrier ->
    backward."""
    import torch.distributed as dist

    dev = rank_device()
    shard = shard.to(dev).clone().requires_grad_(True)  # (b, s, V/p)
    loss = fn(shard, target.to(dev), None)
    dist.barrier()
    if not isinstance(loss, torch.Tensor) or not loss.requires_grad:
        return {"loss": loss, "grad": None}
    loss.backward()
    return {"loss": loss.detach(), "grad": shard.grad}


def _check_loss_comms(out, tokens: int, shard_bytes: int, where: str) -> None:
    assert_crossed_as_recorded(out, f"vocab_parallel_cross_entropy on {where}")
    small = 2 * tokens * 8          # up to two float64 numbers per token in one message
    for rank, comms in enumerate(out.comms):
        forward, backward = split_phases(comms, 2, "vocab_parallel_cross_entropy", rank)
        for label, issued in (("forward", forward), ("backward", backward)):
            big = [c for c in issued if c.op != "all_reduce" or c.bytes > small]
            if big:
                raise CheckFailed(
                    f"vocab_parallel_cross_entropy on {where}: rank {rank}'s {label} issued "
                    f"{describe_comms(big)}; only all_reduces of one number per token ({tokens} tokens) are "
                    f"needed (this rank's logits are {shard_bytes} bytes). Gathering the logits "
                    f"defeats the point: reduce the max, the target logit and the sum of "
                    f"exponentials instead.")
        if len(forward) > 3:
            raise CheckFailed(f"vocab_parallel_cross_entropy on {where}: rank {rank}'s forward issued "
                              f"{len(forward)} collectives ({describe_comms(forward)}); three all_reduces "
                              f"suffice (max, target logit, sum of exponentials).")


def check_vocab_parallel_cross_entropy(fn, world_size: int = 2, seed: int | None = None,
                                       batch=2, seq=8, vocab=64) -> None:
    """fn(logits_shard (b, s, V/p), target (b, s), group) -> the mean cross-entropy over the b*s
    tokens, a 0-d tensor equal on every rank to F.cross_entropy on the full logits; its gradient
    on each rank equals that rank's vocabulary slice of the dense gradient. Collectives: only
    all_reduces of at most two numbers per token, at most three forward."""
    ref, case = attention_case("vocab", seed, world_size, dict(batch=batch, seq=seq, vocab=vocab))
    if vocab % world_size:
        raise ValueError(f"vocab={vocab} is not divisible by {world_size} ranks")
    tokens = ref["target"].numel()
    shards = PerRank([cut(ref["logits"], -1, r, world_size).clone() for r in range(world_size)])
    for backend, out in run_each_backend(_loss_on_rank, world_size, fn, shards, ref["target"]):
        where = f"{case}, {out.backend}"
        # Gathered logits give the right loss the wrong way: say so before comparing values.
        _check_loss_comms(out, tokens, _nbytes(ref["logits"]) // world_size, where)
        for rank, res in enumerate(out):
            loss = res["loss"]
            if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
                raise CheckFailed(f"vocab_parallel_cross_entropy on {where}: rank {rank} returned "
                                  f"{type(loss).__name__}"
                                  f"{list(loss.shape) if isinstance(loss, torch.Tensor) else ''}; "
                                  f"return the mean loss over all tokens as a 0-d tensor.")
            if not torch.isfinite(loss):
                raise CheckFailed(
                    f"vocab_parallel_cross_entropy on {where}: rank {rank}'s loss is {loss.item()}. "
                    f"Some logits are near {MAX_OFFSET:g}, and exp() of anything above 88.7 overflows "
                    f"float32: subtract each token's max over the *whole* vocabulary (an all_reduce "
                    f"with op=dist.ReduceOp.MAX) before exp().")
            _close(loss, ref["loss"], f"vocab_parallel_cross_entropy loss on {where}", rank,
                   "loss = mean over tokens of log(sum_v exp(z_v - m)) + m - z_target, with m, the sum "
                   "and z_target taken over the whole vocabulary (every rank's slice).")
            if res["grad"] is None:
                raise CheckFailed(f"vocab_parallel_cross_entropy on {where}: rank {rank}'s loss has "
                                  f"no gradient path to the logits; all_reduce is not differentiable, "
                                  f"so write a torch.autograd.Function with its own backward.")
            _close(res["grad"], cut(ref["dlogits"], -1, rank, world_size),
                   f"vocab_parallel_cross_entropy gradient of the logits on {where}", rank,
                   "dL/dz = (softmax(z) - onehot(target)) / tokens on this rank's vocabulary slice; "
                   "the target's -1 only on the rank that owns the target id.")


def check_tp_scaling(predict_step_time, strong_scaling_efficiency, seed: int | None = None) -> None:
    """The scaling exercise: T_N predicted from Lab 1's ring model, and T1 / (N T_N)."""
    from distlab.checks.lab04_scaling import check
    check(predict_step_time, strong_scaling_efficiency, seed)


# The course code these exercises may not use (see distlab.checks.course_code); Lab 4 builds
# on Lab 3's layers, which it may use.
from distlab.checks.course_code import LAB4_SHIPPED, CourseCode, LAB3_SHIPPED  # noqa: E402
COURSE_CODE = dict.fromkeys([
    "check_split_qkv", "check_tp_attention_forward", "check_tp_attention_backward",
    "check_tp_block", "check_vocab_parallel_cross_entropy", "check_tp_scaling"],
    CourseCode(forbidden=LAB4_SHIPPED, allowed=LAB3_SHIPPED))
from distlab.checks.messenger import judge_module  # noqa: E402  (while grading, checks run in the judge)
judge_module(globals())
