"""Running a schedule table on real ranks: rank ``r`` runs ``table[r]`` in order, each stage's
layers on the rank ``placement`` gives it, activations and gradients crossing ranks with
``isend``/``irecv`` (a stage hands them to its neighbour on the same rank directly).

An action ``(op, i, s)``: ``F`` runs stage ``s`` on microbatch ``i`` (its input from stage
``s-1``, its output to ``s+1``; the last stage adds ``loss_fn / m``); ``B`` back-propagates the
gradient of the output (from stage ``s+1``, or the loss) to the stage's input and sends it to
``s-1``, and, when the table has no ``W`` for ``(s, i)``, into the weights too; ``W`` then
computes the weights' gradient alone. What each action computes is
``table_stages.TableStage``'s: by hand for Lab 5's blocks (Section 3, the checks), or under
autograd with a pair ``(backward_input, backward_weight)`` (``run_tables``: Section 1's, the
course's by default).

- ``run_table``: one rank's loop, the course's answer to Lab 11's executor exercise (withheld
  from its handout: ``distlab.checks.lab11_executor.EXECUTOR_SHIPPED``). Sends never block
  (``isend``, waited for at the end); each action's receive is posted one action ahead, so it
  travels while the rank computes, and waited for when the action needs it. A table whose
  replay on paper finishes (every wait ends) cannot deadlock here: each rank's waits are the
  replay's. Messages carry a tag naming their kind, stage and microbatch, so two stages that
  talk over the same pair of ranks (a V) never take each other's.
- ``tables_on_rank``, ``table_rank_inputs``, ``run_tables``: the plumbing around any such loop
  (yours in the lab): building the stages, handing each rank its own inputs, one launch for
  several tables.
"""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist

from distlab.labs.losses import loss_fn
from distlab.labs.pipeline.model import PipeSpec, partition_layers, reference_step, stage_layers
from distlab.labs.pipeline.schedules import StageEvent
from distlab.labs.pipeline.split_backward import backward_input, backward_weight
from distlab.labs.pipeline.table_stages import build_stages


def run_table(row, stages, placement, num_microbatches):
    """Run this rank's actions ``row`` in order, on its ``stages`` (stage index -> ``TableStage``),
    stage ``s`` living on rank ``placement[s]``; return once every message it sent was received.
    The stages keep the loss and add the weights' gradients into ``.grad``. (The lab's solution
    cell, word for word: tests/test_lab11_executor_check.py.)"""
    rank, m, last = dist.get_rank(), num_microbatches, len(placement) - 1
    with_w = {(s, i) for op, i, s in row if op == "W"}
    local, posted, sends = {}, {}, []

    def tag(kind, stage, i):                  # one tag per message of a step
        return 2 * (stage * m + i) + (kind == "B")

    def source(k):                            # (kind, stage) of what action k needs, or None
        op, i, s = row[k]
        if op == "F" and s > 0:
            return "F", s - 1
        if op == "B" and s < last:
            return "B", s + 1
        return None

    def post(k):                              # start action k's receive, if it crosses ranks
        if k < len(row) and k not in posted and source(k) and placement[source(k)[1]] != rank:
            (kind, frm), (_, i, s) = source(k), row[k]
            buf = stages[s].buffer()
            posted[k] = buf, dist.irecv(buf, placement[frm], tag=tag(kind, s, i))

    def receive(k):
        if source(k) is None:
            return None
        (kind, frm), (_, i, s) = source(k), row[k]
        if placement[frm] == rank:
            return local.pop((kind, s, i))
        buf, work = posted.pop(k)
        work.wait()
        return buf

    def send(kind, stage, i, tensor):
        if placement[stage] == rank:
            local[(kind, stage, i)] = tensor
        else:
            sends.append(dist.isend(tensor, placement[stage], tag=tag(kind, stage, i)))

    post(0)
    for k, (op, i, s) in enumerate(row):
        post(k + 1)                           # the next message travels while this action runs
        got = receive(k)
        if op == "F":
            y = stages[s].forward(i, got)
            if s < last:
                send("F", s + 1, i, y)
        elif op == "B":
            g = stages[s].backward(i, got, weights=(s, i) not in with_w)
            if s > 0:
                send("B", s - 1, i, g)
        else:
            stages[s].weights(i)
    for work in sends:                        # a send's buffer lives until it is received
        work.wait()


def tables_on_rank(rank, world_size, executor, layers, x, target, rows, placements, m,
                   split=None):
    """Rank body: for each table in turn, this rank's stages (``build_stages``, B and W by
    ``split`` if given) run ``rows[name]`` with ``executor`` (a ``run_table``); a barrier between
    tables (the next one's tags start afresh). Returns per table the loss (on the last stage's rank, else None), every parameter's
    gradient by its global name, and the stages' events as a tensor (rank, microbatch, op
    0/1/2 for F/B/W, start, end, stage)."""
    results = {}
    for name, row in rows.items():
        stages = build_stages(rank, layers[name], placements[name], m, x, target, split)
        executor(list(row), stages, list(placements[name]), m)
        losses = [loss for st in stages.values() for loss in st.losses.values()]
        grads = {n: p.grad for st in layers[name].values() for n, p in st.named_parameters()}
        events = [[e.rank, e.mb, "FBW".index(e.kind), e.start, e.end, e.stage]
                  for st in stages.values() for e in st.events]
        results[name] = dict(loss=sum(losses).item() if losses else None, grads=grads,
                             events=torch.tensor(events, dtype=torch.float64).reshape(-1, 6))
        dist.barrier()
    return results


def events_of(tensor) -> list[StageEvent]:
    """``tables_on_rank``'s events tensor as ``StageEvent``s."""
    return [StageEvent(int(r), int(i), "FBW"[int(k)], a, b, stage=int(s))
            for r, i, k, a, b, s in tensor.tolist()]


def table_rank_inputs(tables: dict, spec: PipeSpec, num_microbatches: int, dtype: torch.dtype,
                model=None, data=None) -> tuple:
    """What each rank of a run of ``tables`` gets, as ``PerRank`` lists: its stages' blocks per
    table (copies: two tables must not add into each other's grads), the batch where a table's
    first stage runs and the target where its last does (NaN elsewhere), its row of each table.
    ``model`` and ``data`` default to ``spec``'s."""
    m = num_microbatches
    sizes = {len(table) for table, _ in tables.values()}
    if len(sizes) != 1:
        raise ValueError(f"the tables run on {sorted(sizes)} ranks: one launch runs tables of "
                         "one size; call run_tables once per size")
    p = sizes.pop()
    if spec.batch % m:
        raise ValueError(f"a batch of {spec.batch} rows does not split into {m} equal "
                         "microbatches: choose num_microbatches dividing it")
    model = (spec.model() if model is None else model).to(dtype)
    x, target = spec.data() if data is None else data
    layers = []
    for r in range(p):
        layers.append({})
        for name, (_, placement) in tables.items():
            S = len(placement)
            bounds = partition_layers(spec.num_layers, S)
            layers[r][name] = copy.deepcopy({s: stage_layers(model, s, S, bounds)
                                             for s in range(S) if placement[s] == r})
    x, target = x.to(dtype), target.to(dtype)
    blind = torch.full_like(x, float("nan"))
    firsts = {placement[0] for _, placement in tables.values()}
    lasts = {placement[-1] for _, placement in tables.values()}
    return (layers, [x if r in firsts else blind for r in range(p)],
            [target if r in lasts else blind for r in range(p)],
            [{name: table[r] for name, (table, _) in tables.items()} for r in range(p)])


def run_tables(tables: dict, spec: PipeSpec = PipeSpec(), num_microbatches: int = 4, *,
               dtype: torch.dtype = torch.float32, timeout: float = 60, executor=None,
               split_backward: tuple = (backward_input, backward_weight)) -> dict:
    """Run each table of ``tables`` (name -> ``(table, placement)``: one list of
    ``(op, i, stage)`` per rank, stage ``s`` on rank ``placement[s]``), all on the same number
    of ranks, in one launch, with ``executor`` (a ``run_table(row, stages, placement, m)``: yours
    in Lab 11; by default the course's). The model of ``spec`` (in ``dtype``) is cut into
    ``len(placement)`` stages; the batch into ``num_microbatches`` equal microbatches; where a
    table splits a backward, ``split_backward`` (Section 1's ``(backward_input,
    backward_weight)``, the course's by default) runs its B and its W. Returns,
    per name, ``loss`` (the whole batch's), ``grads`` (every parameter's, by its name in the
    whole model) and ``events`` (every action's ``StageEvent``, times on ``perf_counter``)."""
    import distlab
    from distlab.runtime.per_rank import PerRank
    layers, xs, targets, rows = table_rank_inputs(tables, spec, num_microbatches, dtype)
    p = len(layers)
    out = distlab.run(tables_on_rank, p, executor or run_table, PerRank(layers), PerRank(xs),
                      PerRank(targets), PerRank(rows),
                      {name: list(placement) for name, (_, placement) in tables.items()},
                      num_microbatches, tuple(split_backward), timeout=timeout)
    return {name: dict(loss=out[placement[-1]][name]["loss"],
                       grads={n: g for r in range(p) for n, g in out[r][name]["grads"].items()},
                       events=[e for r in range(p) for e in events_of(out[r][name]["events"])])
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
