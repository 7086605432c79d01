"""Lab 11, Section 1: the backward of a stage split in two (the judge serves only
``distlab.checks.lab11``'s ``check_*`` functions: ``check_split_backward`` and
``check_held_prediction`` there call ``grade_split_backward`` and ``grade_held_prediction`` here).

Exercise 1, ``backward_input(output, grad_output, stage_input) -> (grad_input, kept)`` (B) and
``backward_weight(kept, params)`` (W), graded on one rank, in float64, on three stages of Lab 5's
model cut in three (the first: its input is the batch; a middle one; the last: its output is the
loss), two microbatches each, B and W interleaved in a different order per stage. Graded:
- with the full backward (``torch.autograd.backward`` of each microbatch, computed here): the
  input gradient B returns and the weights' gradients after every W;
- how: while B runs no weight gradient is computed (hooks on the parameters count them) and no
  ``.grad`` changes; while W runs the input's gradient is not computed again, ``stage_input.grad``
  stays None and the gradient B returned is unchanged.
The hooks run in the rank beside the student's code: a diagnostic it could remove, not a count
made outside it (CONTRIBUTING.md, "How is counted outside").

The graded prediction, ``predict_held_bytes(num_layers, batch, hidden, itemsize)``: the bytes held
between B and W by a stage of ``num_layers`` of Lab 5's layers that is not the last, for the
two ways of ``distlab.labs.pipeline.split_backward`` (``_held_bytes``; ``held_between`` measures
them, tests/test_lab11_split.py checks measurement against formula). Visible values are stored
in ``data/11_pipeline_schedules/split_prediction.pt`` (a handout has no ``_held_bytes``).
"""
from __future__ import annotations

import copy
import math
import random

import torch

from distlab.checks.assertions import CheckFailed, assert_close
from distlab.checks.common import numbers_by_key
from distlab.checks.ranks import SubmittedError, call_each, rank_timeout
from distlab.checks.shown import joined
from distlab.checks.stored import expected_values

LAB = "11_pipeline_schedules"
SEED = 1101
KEYS = ("recompute", "keep")
EPS64 = torch.finfo(torch.float64).eps
# (stage, the order of B and W of its two microbatches): W after its own B, in several orders
ORDERS = (("first", (("B", 0), ("B", 1), ("W", 0), ("W", 1))),
          ("middle", (("B", 0), ("W", 0), ("B", 1), ("W", 1))),
          ("last", (("B", 0), ("B", 1), ("W", 1), ("W", 0))))
SIZES = dict(layers=2, hidden=6, batch=8)   # batch ≠ hidden: a weight's shape is no activation's


# ---------------------------------------------------------------------------------------------
# Exercise 1: the cases, the rank body, the comparison

def split_cases(seed: int, layers: int, hidden: int, batch: int) -> list[dict]:
    """The three stages of a model of ``3·layers`` layers drawn from ``seed``, each with two
    microbatches of ``batch/2`` rows (float64): inputs, output gradients (middle and first
    stage) or targets (last), and the order of its B and W."""
    from distlab.labs.pipeline.model import PipeSpec, stage_layers
    spec = PipeSpec(num_layers=3 * layers, hidden=hidden, batch=batch, seed=seed)
    model = spec.model().to(torch.float64)
    gen = torch.Generator().manual_seed(seed + 2)
    x, target = (t.to(torch.float64) for t in spec.data())
    cases = []
    for s, (name, order) in enumerate(ORDERS):
        rows = torch.randn(batch, hidden, generator=gen, dtype=torch.float64)
        cases.append(dict(name=name, stage=copy.deepcopy(stage_layers(model, s, 3)),
                          xs=list((x if s == 0 else rows).chunk(2)), input_grad=s > 0,
                          dys=None if name == "last" else list(
                              torch.randn(batch, hidden, generator=gen,
                                          dtype=torch.float64).chunk(2)),
                          targets=list(target.chunk(2)) if name == "last" else None,
                          order=list(order)))
    return cases


def _forward(case: dict, count=None):
    """The stage's forward on each microbatch: (stage, inputs, outputs); the last stage's output
    is its loss, ``loss_fn / m`` as the executor's."""
    from distlab.labs.losses import loss_fn
    stage = case["stage"]
    xs, outs = [], []
    for i, x in enumerate(case["xs"]):
        x = x.clone().requires_grad_(case["input_grad"])
        if count is not None and x.requires_grad:
            x.register_hook(lambda g: count.__setitem__("input", count["input"] + 1))
        y = stage(x)
        if case["targets"] is not None:
            y = loss_fn(y, case["targets"][i]) / len(case["xs"])
        xs.append(x)
        outs.append(y)
    return stage, xs, outs


def full_backward(case: dict) -> dict:
    """The reference: one full backward per microbatch (parameters' gradients accumulated)."""
    case = copy.deepcopy(case)
    stage, xs, outs = _forward(case)
    for i, y in enumerate(outs):
        torch.autograd.backward(y, None if case["dys"] is None else case["dys"][i])
    return {"dx": [x.grad for x in xs],
            "grads": {n: p.grad for n, p in stage.named_parameters()}}


def _split_on_rank(rank, world_size, backward_input, backward_weight, cases: list) -> list:
    """Rank body (one rank): per case, the student's B and W in the case's order, with what each
    call did (weight and input gradients computed, ``.grad`` changed), as plain data."""
    return [_split_case(backward_input, backward_weight, case) for case in cases]


def _split_case(backward_input, backward_weight, case: dict) -> dict:
    count = {"weights": 0, "input": 0}
    stage, xs, outs = _forward(case, count)
    named = list(stage.named_parameters())
    for _, p in named:
        p.register_hook(lambda g: count.__setitem__("weights", count["weights"] + 1))
    kept, dx, at_b, log = {}, {}, {}, []
    for op, i in case["order"]:
        before, grads = dict(count), {n: _copy(p.grad) for n, p in named}
        try:
            if op == "B":
                got = backward_input(outs[i], None if case["dys"] is None else case["dys"][i],
                                     xs[i])
                if not (isinstance(got, tuple) and len(got) == 2):
                    return {"malformed": f"{type(got).__name__} {got!r:.80}"}
                dx[i], kept[i] = got
                at_b[i] = _copy(dx[i])
            else:
                backward_weight(kept.pop(i), [p for _, p in named])
        except Exception as exc:   # noqa: BLE001 - the judge reports it, with the call
            return {"raised": (op, i, type(exc).__name__, str(exc)[:400])}
        log.append({"op": op, "i": i, "weights": count["weights"] - before["weights"],
                    "input": count["input"] - before["input"],
                    "changed": [n for n, p in named if not _same(grads[n], p.grad)],
                    "input_grad_set": [x.grad is not None for x in xs]})
    return {"log": log, "dx": [dx.get(i) for i in range(len(xs))],
            "dx_at_b": [at_b.get(i) for i in range(len(xs))],
            "grads": {n: p.grad for n, p in named}}


def _copy(t):
    return t.detach().clone() if isinstance(t, torch.Tensor) else t


def _same(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)


def _fail(what: str, why: str):
    raise CheckFailed(f"{what}: {why}")


def _judge_log(case: dict, res: dict, what: str) -> None:
    """How: B computes no weight gradient and sets no .grad; W leaves the input alone."""
    if "malformed" in res:
        _fail(what, f"backward_input returned {res['malformed']}; it must return the pair "
                    f"(grad_input, kept).")
    if "raised" in res:
        op, i, kind, text = res["raised"]
        call = "backward_input" if op == "B" else "backward_weight"
        if kind == "NotImplementedError":   # the stub, untouched: not done, as call_each says
            raise SubmittedError(kind, f"{call} raised {kind}: {text}")
        hint = ""
        if op == "W" and "second time" in text:
            hint = ("\nW walks the graph B walked: B must leave it alive (retain_graph=True), "
                    "and W, its last user, frees it.")
        _fail(what, f"{call} (the {op} of microbatch {i}, order "
                    f"{' '.join(o + str(k) for o, k in case['order'])}) raised {kind}: {text}"
                    f"{hint}")
    for entry in res["log"]:
        step = f"{entry['op']} of microbatch {entry['i']}"
        if entry["op"] == "B":
            if entry["weights"]:
                _fail(what, f"the {step} computed {entry['weights']} parameter gradient(s). B "
                            f"computes the input's gradient alone (autograd.grad with the "
                            f"input as inputs=); the weights' wait for W.")
            if entry["changed"]:
                _fail(what, f"the {step} changed the .grad of {', '.join(entry['changed'])}: "
                            f"B must not touch the parameters' gradients (a full backward "
                            f"does).")
        else:
            if entry["input"]:
                _fail(what, f"the {step} computed the stage input's gradient again: W computes "
                            f"the weights' gradients alone (inputs= the parameters).")
            if any(entry["input_grad_set"]):
                _fail(what, f"after the {step}, the stage input's .grad was set: W must not "
                            f"change the input gradient (B returned it; nothing accumulates "
                            f"into the input).")


def _tolerance(layers: int, hidden: int) -> float:
    """float64: a gradient through ``layers`` layers sums ``hidden`` products per layer, each sum
    off by at most about ``hidden`` ulps of its terms; twice that for two microbatches added in
    another order, and twice again as room."""
    return 4 * layers * hidden * EPS64


def grade_split_backward(backward_input, backward_weight, seed: int | None = None, layers=2,
                         hidden=6, batch=8) -> str:
    """backward_input / backward_weight on the first, a middle and the last stage (``layers``
    layers each, two microbatches): equal to the full backward, B computing no weight
    gradient, W leaving the input gradient alone."""
    __tracebackhide__ = True  # noqa: F841
    from distlab.runtime.per_rank import reference
    if batch % 2 or batch == hidden:
        raise CheckFailed("choose an even batch, other than hidden (two microbatches; a weight's "
                          "shape must differ from an activation's)")
    drawn = SEED if seed is None else seed
    cases = split_cases(drawn, layers, hidden, batch)
    where = "the visible cases" if seed is None else f"fresh inputs (seed {seed})"
    results = _run(backward_input, backward_weight, cases)
    tol = _tolerance(layers, hidden)
    shown = []
    for case, res in zip(cases, results):
        what = f"split backward, {case['name']} stage, on {where}"
        _judge_log(case, res, what)
        want = reference(full_backward(case))
        for i, (got, at_b) in enumerate(zip(res["dx"], res["dx_at_b"])):
            if want["dx"][i] is None:
                if got is not None:
                    _fail(what, f"backward_input returned an input gradient for microbatch {i} "
                                f"of the first stage, whose input (the batch) does not require "
                                f"grad: return None there.")
                continue
            assert_close(got, want["dx"][i], what=f"{what}: grad_input of microbatch {i}",
                         atol=tol, rtol=tol)
            if not torch.equal(got, at_b):
                _fail(what, f"grad_input of microbatch {i} changed after B returned it: W must "
                            f"not change the input gradient.")
        for name, g in want["grads"].items():
            assert_close(res["grads"][name], g, what=f"{what}: {name}.grad after both W",
                         atol=tol, rtol=tol,
                         hint="W adds into p.grad (None counts as zero), as a full backward "
                              "accumulates: two microbatches' W sum.")
        shown.append(f"{case['name']} ({' '.join(o + str(k) for o, k in case['order'])})")
    return joined(f"split backward equals the full backward (float64, tolerance {tol:.1g}) on "
                  f"{where}; B computed no weight gradient, W no input gradient: ", shown)


def _run(backward_input, backward_weight, cases: list) -> list:
    """Every case on one rank, in one launch; a raise outside the cases is the student's."""
    import distlab
    from distlab.runtime.outcome import RankError
    try:
        return distlab.run(_split_on_rank, 1, backward_input, backward_weight, cases,
                           backend="gloo", timeout=rank_timeout())[0]
    except RankError as exc:
        raise SubmittedError(exc.exc_type, f"the split backward raised {exc.exc_type}:\n"
                             f"{exc.rank_traceback.rstrip()}") from None


# ---------------------------------------------------------------------------------------------
# The prediction: bytes held between B and W

def _held_bytes(num_layers: int, batch: int, hidden: int, itemsize: int) -> dict:
    """The prediction's reference: the bytes each way holds between B and W on a stage of
    ``num_layers`` of Lab 5's layers that is not the last."""
    unit = batch * hidden * itemsize   # one (batch, hidden) tensor
    # recompute: per layer addmm's input and gelu's input, saved; kept: the output, its gradient
    # keep: per Linear its input and its output's gradient; the graph freed
    return {"recompute": (2 * num_layers + 2) * unit, "keep": 2 * num_layers * unit}


def held_cases(seed: int | None) -> list[tuple[int, int, int, int]]:
    """(num_layers, batch, hidden, itemsize): the lab's measured stage and others (visible), or
    drawn from ``seed`` (hidden)."""
    if seed is None:
        return [(2, 8, 16, 8), (1, 4, 6, 8), (4, 32, 1024, 2)]
    rng = random.Random(seed)
    return [(rng.randint(1, 12), rng.choice([1, 4, 16, 64]), rng.choice([8, 256, 4096]),
             rng.choice([2, 4, 8])) for _ in range(3)]


def held_prediction_set() -> dict:
    """The visible cases' bytes, for ``data/<lab>/split_prediction.pt``."""
    return {"seed": SEED, "bytes": torch.tensor([[_held_bytes(*c)[k] for k in KEYS]
                                                 for c in held_cases(None)], dtype=torch.float64)}


def make_references() -> dict[str, dict]:
    """Section 1's stored set (the prediction's visible values)."""
    return {"split_prediction": held_prediction_set()}


def grade_held_prediction(predict_held_bytes, seed: int | None = None) -> str:
    """predict_held_bytes(num_layers, batch, hidden, itemsize) -> {"recompute": bytes,
    "keep": bytes}, equal to the formulas (``_held_bytes``) on the visible or drawn cases."""
    __tracebackhide__ = True  # noqa: F841
    todo = held_cases(seed)
    expected = expected_values(LAB, "split_prediction", "bytes", seed, todo,
                               lambda case: [_held_bytes(*case)[k] for k in KEYS])
    calls = [f"predict_held_bytes(num_layers={L}, batch={b}, hidden={h}, itemsize={s})"
             for L, b, h, s in todo]
    answers = call_each(predict_held_bytes, todo, names=calls)   # every case in one launch
    shown = []
    for call, got, want in zip(calls, answers, expected):
        got = numbers_by_key(call, got, KEYS)
        for key, g, w in zip(KEYS, got, want):
            if not math.isclose(g, w, rel_tol=1e-12):
                raise CheckFailed(
                    f"{call}[{key!r}] = {g:,.0f} bytes; the count gives {w:,.0f}. "
                    + {"recompute": "B leaves the graph alive: which tensors did each layer's "
                                    "forward save for its backward (the weight is a parameter, "
                                    "not counted)? And what else does W start from?",
                       "keep": "B frees the graph. What does one Linear's weight gradient "
                               "need, and which of it did the forward or B hand over?"}[key])
        shown.append(f"{call.split('(', 1)[1][:-1]}: " + "/".join(f"{g:,.0f}" for g in got))
    return joined(f"predict_held_bytes: your recompute/keep bytes equal the count on "
                  f"{len(todo)} cases: ", shown)


# The course code these exercises may not use (see distlab.checks.course_code), keyed by the
# names of ``distlab.checks.lab11``'s checks, whose COURSE_CODE this is.
from distlab.checks.course_code import CourseCode, names  # noqa: E402
SPLIT_SHIPPED = (names("distlab.labs.pipeline.split_backward", "backward_input",
                       "backward_weight")
                 + names("distlab.checks.lab11_split", "_held_bytes"))
# Splits the handout keeps, since the lab measures them beside the student's: the keep way and
# torch's own (its stage_backward_input/weight, and the course's wrappers of them). Each meets
# the exercise's contract (torch's once its B's input .grad is cleared): handed in as B and W they
# are a copy, not a split written.
OTHER_SPLITS = (names("distlab.labs.pipeline.split_backward", "keep_forward",
                      "keep_backward_input", "keep_backward_weight", "torch_backward_input",
                      "torch_backward_weight")
                + names("torch.distributed.pipelining._backward", "stage_backward_input",
                        "stage_backward_weight"))
# The measurement the cell after the prediction runs: the prediction is made before it, not by it.
MEASURED = names("distlab.labs.pipeline.split_backward", "held_between", "held_rows")
COURSE_CODE = {"check_split_backward": CourseCode(forbidden=SPLIT_SHIPPED, watched=OTHER_SPLITS),
               "check_held_prediction": CourseCode(forbidden=SPLIT_SHIPPED,
                                                   watched=OTHER_SPLITS + MEASURED)}
