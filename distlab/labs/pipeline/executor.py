"""Running a schedule table on real ranks: rank ``r`` runs ``table[r]`` in order, each stage's
layers on the rank ``placement`` gives it, activations and gradients crossing ranks with
``isend``/``irecv`` (a stage hands them to its neighbour on the same rank directly).

An action ``(op, i, s)``: ``F`` runs stage ``s`` on microbatch ``i`` (its input from stage
``s-1``, its output to ``s+1``; the last stage adds ``loss_fn / m``); ``B`` back-propagates the
gradient of the output (from stage ``s+1``, or the loss) to the stage's input and sends it to
``s-1``, and, when the table has no ``W`` for ``(s, i)``, into the weights too; ``W`` then
computes the weights' gradient alone.

B and W are Section 1's ``split_backward.backward_input`` / ``backward_weight`` (or the pair
``run_tables`` is given): W recomputes the chain of activation gradients inside the stage from
its output's gradient (``torch.autograd.grad`` with the parameters as ``inputs``), B keeps the
graph alive (``retain_graph``), the output and its gradient. Lab 11 measures what that holds
between B and W against keeping each Linear's output gradient instead (``held_between``).

Sends never block (``isend``); a receive is posted when its action needs it. A table whose
replay on paper finishes (every wait ends) cannot deadlock here: each rank's waits are the
replay's. Messages carry a tag naming their kind, stage and microbatch, so two stages that
talk over the same pair of ranks (a V) never take each other's.
"""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist

from distlab.labs.losses import loss_fn
from distlab.labs.pipeline.model import PipeSpec, partition_layers, reference_step, stage_layers
from distlab.labs.pipeline.split_backward import backward_input, backward_weight


def _tag(kind: str, stage: int, mb: int, m: int) -> int:
    """A message's tag: activations into ``stage`` (``kind="F"``) or gradients out of it."""
    return 2 * (stage * m + mb) + (kind == "B")


class _Rank:
    """One rank's stages and what it holds between actions."""

    def __init__(self, rank, layers, placement, x, target, m, split_backward):
        self.rank, self.layers, self.placement, self.m = rank, layers, placement, m
        self.last = len(placement) - 1
        self.xs = None if x is None else x.chunk(m)
        self.targets = None if target is None else target.chunk(m)
        self.inputs, self.outputs, self.kept, self.losses = {}, {}, {}, {}
        self.backward_input, self.backward_weight = split_backward
        self.local: dict[tuple, torch.Tensor] = {}   # hand-offs between stages of this rank
        self.sends: list = []

    def _receive(self, kind, src_stage, stage, i, like):
        """The tensor stage ``src_stage`` sent to ``stage`` (``kind`` F: activation, B: grad)."""
        key = (kind, stage, i)
        if self.placement[src_stage] == self.rank:
            return self.local.pop(key)
        buf = torch.empty_like(like)
        dist.irecv(buf, self.placement[src_stage], tag=_tag(kind, stage, i, self.m)).wait()
        return buf

    def _send(self, kind, stage, i, tensor):
        """``tensor`` to ``stage`` (an activation into it, or a gradient out of it)."""
        dst = self.placement[stage]
        if dst == self.rank:
            self.local[(kind, stage, i)] = tensor
        else:
            self.sends.append(dist.isend(tensor.contiguous(), dst,
                                         tag=_tag(kind, stage, i, self.m)))

    def forward(self, i, s, like):
        x = self.xs[i] if s == 0 else self._receive("F", s - 1, s, i, like).requires_grad_()
        y = self.layers[s](x)
        self.inputs[(s, i)] = x
        if s == self.last:
            self.outputs[(s, i)] = loss = loss_fn(y, self.targets[i]) / self.m
            self.losses[i] = loss.detach()
        else:
            self.outputs[(s, i)] = y
            self._send("F", s + 1, i, y.detach())

    def backward(self, i, s, split, like):
        out = self.outputs[(s, i)]
        grad = None if s == self.last else self._receive("B", s + 1, s, i, like)
        x = self.inputs[(s, i)]
        if split:   # the input's gradient alone; what W needs is kept
            gx, self.kept[(s, i)] = self.backward_input(out, grad, x)
            del self.outputs[(s, i)], self.inputs[(s, i)]
            if s > 0:
                self._send("B", s - 1, i, gx)
            return
        torch.autograd.backward(out, grad)
        del self.outputs[(s, i)], self.inputs[(s, i)]
        if s > 0:
            self._send("B", s - 1, i, x.grad)

    def weights(self, i, s):
        self.backward_weight(self.kept.pop((s, i)), list(self.layers[s].parameters()))


def _rank_tables(rank, world_size, layers, x, target, rows, placements, m, shape,
                 split_backward):
    """On each rank, for each table in turn: run ``rows[name]`` (this rank's actions) on its
    stages' ``layers[name]``; return per table the loss (on the last stage's rank) and its
    parameters' gradients by their global names."""
    results = {}
    for name, row in rows.items():
        placement = placements[name]
        first, last = placement[0] == rank, placement[-1] == rank
        me = _Rank(rank, layers[name], placement, x if first else None,
                   target if last else None, m, split_backward)
        like = torch.empty(shape, dtype=x.dtype)
        split = {(s, i) for op, i, s in row if op == "W"}
        for op, i, s in row:
            if op == "F":
                me.forward(i, s, like)
            elif op == "B":
                me.backward(i, s, (s, i) in split, like)
            else:
                me.weights(i, s)
        for work in me.sends:
            work.wait()
        grads = {n: p.grad for stage in layers[name].values() for n, p in stage.named_parameters()}
        results[name] = dict(loss=sum(me.losses.values()).item() if me.losses else None,
                             grads=grads)
        dist.barrier()   # the next table's tags start afresh
    return results


def run_tables(tables: dict, spec: PipeSpec = PipeSpec(), num_microbatches: int = 4, *,
               dtype: torch.dtype = torch.float32, timeout: float = 60,
               split_backward: tuple = (backward_input, backward_weight)) -> dict:
    """Run each table of ``tables`` (name -> ``(table, placement)``: one list of
    ``(op, i, stage)`` per rank, stage ``s`` on rank ``placement[s]``), all on the same number
    of ranks, in one launch. The model of ``spec`` (in ``dtype``) is cut into
    ``len(placement)`` stages; the batch into ``num_microbatches`` equal microbatches; where a
    table splits a backward, ``split_backward`` (Section 1's ``(backward_input,
    backward_weight)``, the course's by default) runs its B and its W. Returns,
    per name, ``loss`` (the whole batch's) and ``grads`` (every parameter's, by its name in
    the whole model)."""
    import distlab
    from distlab.runtime.per_rank import PerRank
    m = num_microbatches
    sizes = {len(table) for table, _ in tables.values()}
    if len(sizes) != 1:
        raise ValueError(f"the tables run on {sorted(sizes)} ranks: one launch runs tables of "
                         "one size; call run_tables once per size")
    p = sizes.pop()
    if spec.batch % m:
        raise ValueError(f"a batch of {spec.batch} rows does not split into {m} equal "
                         "microbatches: choose num_microbatches dividing it")
    model, (x, target) = spec.model().to(dtype), spec.data()
    layers = []
    for r in range(p):
        layers.append({})
        for name, (_, placement) in tables.items():
            S = len(placement)
            bounds = partition_layers(spec.num_layers, S)
            # a copy per table: the tables of one rank must not add into each other's grads
            layers[r][name] = copy.deepcopy({s: stage_layers(model, s, S, bounds)
                                             for s in range(S) if placement[s] == r})
    # the batch where a table's first stage runs, the target where its last does, NaN elsewhere
    x, target = x.to(dtype), target.to(dtype)
    blind = torch.full_like(x, float("nan"))
    firsts = {placement[0] for _, placement in tables.values()}
    lasts = {placement[-1] for _, placement in tables.values()}
    out = distlab.run(_rank_tables, p, PerRank(layers),
                      PerRank([x if r in firsts else blind for r in range(p)]),
                      PerRank([target if r in lasts else blind for r in range(p)]),
                      PerRank([{name: table[r] for name, (table, _) in tables.items()}
                               for r in range(p)]),
                      {name: list(placement) for name, (_, placement) in tables.items()}, m,
                      (spec.batch // m, spec.hidden), tuple(split_backward), timeout=timeout)
    return {name: dict(loss=out[placement[-1]][name]["loss"],
                       grads={n: g for r in range(p) for n, g in out[r][name]["grads"].items()})
            for name, (_, placement) in tables.items()}


def single_process_step(spec: PipeSpec, dtype: torch.dtype = torch.float32) -> tuple[float, dict]:
    """The single-process step of ``spec`` in ``dtype``: the loss and every gradient by name."""
    if dtype == torch.float32:
        return reference_step(spec)
    model, (x, target) = spec.model().to(dtype), spec.data()
    loss = loss_fn(model(x.to(dtype)), target.to(dtype))
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


def table_error(result: dict, spec: PipeSpec, dtype: torch.dtype = torch.float32):
    """The largest differences of a run's loss and gradients from the single-process step."""
    loss, ref = single_process_step(spec, dtype)
    return abs(result["loss"] - loss), max((result["grads"][n] - g).abs().max().item()
                                           for n, g in ref.items())
