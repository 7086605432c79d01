"""The backward of one pipeline stage split in two (Lab 11, Section 1; Qi et al. 2023, "Zero
Bubble Pipeline Parallelism", §2): B, the gradient of the stage's input alone, which the
previous stage waits for; W, the gradient of the stage's weights alone, which nobody waits for
and a schedule may run later, in a bubble.

Two ways to hold what W needs between B and W, both here:
- recompute (``backward_input`` / ``backward_weight``, Exercise 1's answer, which the executor
  runs): B leaves the autograd graph alive and keeps the stage's output and its gradient; W runs
  autograd again from the output to the weights, through the chain of activation gradients.
- keep (``keep_forward`` / ``keep_backward_input`` / ``keep_backward_weight``): the forward
  records each ``nn.Linear``'s input and hooks its output; B's pass fires the hooks, which keep
  the gradient of each Linear's output, and frees the graph; W is one local product per Linear,
  ``dW = dzᵀ x``, ``dc = Σ dz``, with no autograd.

``held_between`` measures the bytes a way holds between B and W (the graph's saved tensors still
alive, and the tensors its ``kept`` reaches), counted once per storage, parameters excluded.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from distlab.labs.activation_memory import ActivationMeter


# ---------------------------------------------------------------------------------------------
# Exercise 1: recompute (the course's answer, withheld from the handout)

def backward_input(output, grad_output, stage_input):
    """B of one stage and microbatch. ``output``: what the stage's forward returned (on the last
    stage, its loss, and ``grad_output`` is None); ``grad_output``: the gradient of the loss with
    respect to ``output``, from the next stage; ``stage_input``: the tensor the forward ran on,
    which requires grad unless it is the batch on the first stage.

    Returns ``(grad_input, kept)``: the gradient of the loss with respect to ``stage_input``
    (None where it does not require grad), and whatever ``backward_weight`` needs later. On
    return no parameter's ``.grad`` has changed, and no parameter's gradient was computed."""
    kept = (output, grad_output)
    if not stage_input.requires_grad:   # the first stage: nobody waits for an input gradient
        return None, kept
    # retain_graph: W walks the same graph again, from the output to the weights
    (grad_input,) = torch.autograd.grad(output, [stage_input], grad_output, retain_graph=True)
    return grad_input, kept


def backward_weight(kept, params):
    """W of the stage and microbatch of an earlier ``backward_input`` that returned ``kept``:
    adds to each ``p.grad`` of ``params`` (None counts as zero) the gradient of the loss with
    respect to ``p``, as a full backward would. Computes no input gradient and changes nothing
    ``backward_input`` returned. Called once per B, after it."""
    output, grad_output = kept
    params = list(params)
    # no retain_graph: this is the graph's last use, its saved tensors go with it
    grads = torch.autograd.grad(output, params, grad_output, allow_unused=True)
    for p, g in zip(params, grads):
        if g is not None:
            p.grad = g if p.grad is None else p.grad + g


# ---------------------------------------------------------------------------------------------
# The other way: keep what B computed (shown in the lab, not an exercise)

def keep_forward(stage: nn.Module, x: torch.Tensor):
    """The stage's forward, recording each ``nn.Linear`` it runs: returns ``(output, linears)``,
    ``linears`` a list of ``[module, its input, None, its output]`` whose third slot the hook on
    the Linear's output fills with that output's gradient when B's pass reaches it."""
    linears, handles = [], []

    def record(module, inputs, out):
        entry = [module, inputs[0].detach(), None, out]   # W needs the input's values, no graph
        linears.append(entry)
        out.register_hook(lambda grad: entry.__setitem__(2, grad))

    for module in stage.modules():
        if isinstance(module, nn.Linear):
            handles.append(module.register_forward_hook(record))
    try:
        return stage(x), linears
    finally:
        for handle in handles:
            handle.remove()


def keep_backward_input(output, grad_output, stage_input, linears):
    """B that keeps, for W, each Linear's input and its output's gradient (``linears`` from
    ``keep_forward``) and frees the graph. Returns ``(grad_input, kept)`` as ``backward_input``
    does; ``kept`` is ``[(module, input, output's gradient)]``."""
    # On the first stage no input gradient is wanted: ask for the first Linear's output's
    # instead, whose chain from the stage's output passes every other Linear's hook.
    wanted = stage_input if stage_input.requires_grad else linears[0][3]
    (grad,) = torch.autograd.grad(output, [wanted], grad_output)   # frees the graph
    kept = [(module, x, dz) for module, x, dz, _ in linears]
    linears.clear()   # drops the Linears' outputs: W needs their gradients only
    return (grad if stage_input.requires_grad else None), kept


def keep_backward_weight(kept, params=None):
    """W from what ``keep_backward_input`` kept: per Linear, ``dW = dzᵀ x`` and ``dc = Σ dz``
    over the rows, added into ``.grad`` (``params`` is unused: each Linear names its own)."""
    for module, x, dz in kept:
        x2, dz2 = x.reshape(-1, x.shape[-1]), dz.reshape(-1, dz.shape[-1])   # (rows, h)
        for p, g in ((module.weight, dz2.t() @ x2), (module.bias, dz2.sum(0))):
            if p is not None:
                p.grad = g if p.grad is None else p.grad + g


# ---------------------------------------------------------------------------------------------
# The bytes a way holds between B and W

def _tensors(obj, seen=None):
    """Every tensor ``obj`` reaches through tuples, lists, sets and dicts (modules excluded:
    their parameters are not activations)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from _tensors(value)
    elif isinstance(obj, (list, tuple, set)):
        for value in obj:
            yield from _tensors(value)


def held_between(stage: nn.Module, x: torch.Tensor, grad_output, backward_input, backward_weight,
                 forward=None, flops: dict | None = None) -> int:
    """Run one microbatch's forward, B and W on ``stage`` and return the bytes held between B and
    W: the tensors autograd saved in the forward that are still alive after B, and those B's
    ``kept`` reaches, each storage once, parameters excluded (``ActivationMeter``'s count).
    ``forward(stage, x) -> (output, extra)`` for a way whose B takes ``extra`` as a fourth
    argument (``keep_forward``); by default the plain ``stage(x)``. ``flops``, if given, gets
    the matrix-multiply FLOPs of B and of W (``torch.utils.flop_counter``)."""
    from torch.utils.flop_counter import FlopCounterMode
    counters = {"B": FlopCounterMode(display=False), "W": FlopCounterMode(display=False)}
    params = list(stage.parameters())
    meter = ActivationMeter(params)
    with meter.hooks():
        output, *extra = (stage(x),) if forward is None else forward(stage, x)
    with counters["B"]:
        _, kept = backward_input(output, grad_output, x, *extra)
    del output, extra   # from here on, only what the way keeps holds anything
    held = meter.live
    counted = set(meter.refs) | set(meter.param_storages)
    for t in _tensors(kept):
        key = t.untyped_storage().data_ptr()
        if key not in counted:
            counted.add(key)
            held += t.untyped_storage().nbytes()
    with counters["W"]:
        backward_weight(kept, params)
    if flops is not None:
        flops.update({op: c.get_total_flops() for op, c in counters.items()})
    return held


# ---------------------------------------------------------------------------------------------
# torch's own split (torch.distributed.pipelining._backward), in the same contract

def torch_backward_input(output, grad_output, stage_input, params):
    """torch 2.13's B: ``stage_backward_input`` (pre-hooks on the nodes where each parameter's
    branch meets the input-to-output path keep the gradients arriving there; the graph is
    retained; the output is detached). ``kept``: its parameter groups."""
    from torch.distributed.pipelining._backward import stage_backward_input
    grads, groups = stage_backward_input([output], None if grad_output is None else [grad_output],
                                         [stage_input], iter(params))
    return grads[0], groups


def torch_backward_weight(kept, params):
    """torch 2.13's W: ``stage_backward_weight``, autograd from the kept nodes to the weights."""
    from torch.distributed.pipelining._backward import stage_backward_weight
    stage_backward_weight(iter(params), kept)


def held_rows(backward_input, backward_weight, predict=None, num_layers: int = 2,
              batch: int = 8, hidden: int = 16, seed: int = 0) -> list[dict]:
    """The bytes held between B and W on a middle stage of ``num_layers`` of Lab 5's layers
    (float64, one microbatch of ``batch`` rows), measured by ``held_between`` for the recompute
    way (``backward_input``/``backward_weight``: yours), the keep way and torch's own; beside
    them ``predict(num_layers, batch, hidden, 8)`` where it predicts that way, and the
    matrix-multiply FLOPs each way's B and W ran."""
    from distlab.labs.pipeline.model import PipeSpec, stage_layers
    spec = PipeSpec(num_layers=num_layers, hidden=hidden, batch=batch, seed=seed)
    model = stage_layers(spec.model().to(torch.float64), 0, 1)
    gen = torch.Generator().manual_seed(seed + 3)
    x, dy = (torch.randn(batch, hidden, generator=gen, dtype=torch.float64) for _ in range(2))
    predicted = predict(num_layers, batch, hidden, 8) if predict else {}
    params = list(model.parameters())
    ways = {"recompute": (backward_input, backward_weight, None),
            "keep": (keep_backward_input, keep_backward_weight, keep_forward),
            "torch 2.13": (lambda y, g, inp: torch_backward_input(y, g, inp, params),
                           torch_backward_weight, None)}
    rows = []
    for name, (b, w, forward) in ways.items():
        flops = {}
        held = held_between(model, x.clone().requires_grad_(), dy, b, w, forward, flops)
        for p in params:
            p.grad = None
        guess = predicted.get(name)
        rows.append({"way": name, "held between B and W (bytes)": f"{held:,}",
                     "in units of b·h·8": f"{held / (batch * hidden * 8):g}",
                     "predicted": "" if guess is None else f"{guess:,.0f}",
                     "B FLOPs": f"{flops['B']:,}", "W FLOPs": f"{flops['W']:,}"})
    return rows
