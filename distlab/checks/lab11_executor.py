"""Lab 11, Section 3: the executor exercise's check.

``run_table(row, stages, placement, num_microbatches)`` runs one rank's row of a schedule table
on its stages (``distlab.labs.pipeline.table_stages.TableStage``), moving activations and
gradients between ranks with ``dist.isend`` / ``dist.irecv`` only. The check runs it on real
gloo ranks (``executor.tables_on_rank``) on the course's tables, interleaved 1F1B (v = 2),
ZB-H1 and the zero-bubble V, one after another in one launch, and compares in the judge, per table:

- the loss and every parameter's gradient with the single-process step, within 1e-6 in float64
  (correct answers agree to about 1e-15: the issue's 1e-6 is far above the order of sums and far
  below the gradients: each parameter's largest |gradient| is of order 0.1 to 100 here);
- the record: only ``isend``/``irecv``, and per rank exactly the table's messages to and from
  each peer (``compare.messages``: none between two stages of one rank), each one
  microbatch's activation. ``assert_crossed_as_recorded`` first: the record must be the traffic.

Visible: p = 4, m = 8, the tables and the expected values stored (a handout has neither the
tables nor the reference); hidden: a fresh model and batch, p = 2 or 4, the tables made and the
reference computed here. gloo only: NCCL's point-to-point ignores tags (pytorch/pytorch#94819,
#125079: messages between two ranks match in the order they are posted), and tags are what this
exercise is about. A deadlock stops the ranks after ``TIMEOUT`` seconds of no progress and is
reported as one, with each rank's pending calls.
"""
from __future__ import annotations

from collections import Counter

import torch

from distlab.checks.assertions import CheckFailed, assert_close, recording
from distlab.checks.crossed import assert_crossed_as_recorded
from distlab.checks.rank_failures import ranks_failed
from distlab.checks.ranks import rank_timeout
from distlab.labs.pipeline.model import PipeSpec
from distlab.labs.pipeline.on_ranks import M as VISIBLE_M, P as VISIBLE_P, SPEC
from distlab.runtime.outcome import DistributedError, HangError
from distlab.runtime.per_rank import PerRank, reference

LAB = "11_pipeline_schedules"
RANK_IMPORTS = ()
TOL = 1e-6          # the figure, in float64
TIMEOUT = 10.0      # seconds before stuck ranks count as deadlocked; a correct run takes < 1 s
P2P = {"isend", "irecv"}
NAMES = {"interleaved": "interleaved 1F1B (v = 2)", "zb_h1": "ZB-H1", "zb_v": "zero-bubble V"}
OPS = "FBW"


def course_tables(p: int, m: int) -> dict:
    """The course's tables the check runs, name -> (table, placement): made in the judge."""
    from distlab.labs.pipeline import tables
    return {"interleaved": (tables.interleaved_1f1b(p, m, 2), tables.round_robin(p, 2)),
            "zb_h1": (tables.zb_h1(p, m), list(range(p))),
            "zb_v": (tables.zb_v(p, m), tables.v_shape(p))}


def executor_set() -> dict:
    """The visible case, stored: the model's weights, the batch, the course's tables (and torch's,
    which Section 3 runs: a handout reads neither), and the single-process loss and gradients
    (float64)."""
    from distlab.labs.pipeline.executor import single_process_step
    model, (x, target) = SPEC.model().double(), SPEC.data()
    loss, grads = single_process_step(SPEC, torch.float64)
    out = {"seed": SPEC.seed, "x": x.double(), "target": target.double(),
           "loss": torch.tensor(loss, dtype=torch.float64),
           **{f"weight.{n}": p.detach() for n, p in model.named_parameters()},
           **{f"grad.{n}": g for n, g in grads.items()}}
    from distlab.labs.pipeline.on_ranks import TORCH
    from distlab.labs.pipeline.torch_tables import torch_table
    tables = {**course_tables(VISIBLE_P, VISIBLE_M),   # torch's too: the lab runs them stored
              **{f"torch_{name}": torch_table(name, VISIBLE_P, VISIBLE_M) for name in TORCH}}
    for key, (table, placement) in tables.items():
        out[f"placement.{key}"] = torch.tensor(placement)
        for r, row in enumerate(table):
            out[f"table.{key}.{r}"] = torch.tensor([(OPS.index(op), i, s) for op, i, s in row])
    return out


def _stored_problem():
    from distlab.checks.stored import load
    stored = load(LAB, "executor")
    model = SPEC.model().double()
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(stored[f"weight.{n}"])
    tables = {}
    for key in NAMES:
        placement = stored[f"placement.{key}"].tolist()
        rows = [stored[f"table.{key}.{r}"].tolist() for r in range(VISIBLE_P)]
        tables[key] = ([[(OPS[op], i, s) for op, i, s in row] for row in rows], placement)
    expected = (stored["loss"].item(), {k.removeprefix("grad."): v for k, v in stored.items()
                                        if k.startswith("grad.")})
    return tables, model, (stored["x"], stored["target"]), reference(expected)


def _reference(spec: PipeSpec):
    """The single-process step of a hidden case, in float64, marked: no rank may receive it."""
    from distlab.labs.pipeline.executor import single_process_step
    return reference(single_process_step(spec, torch.float64))


def _problem(seed, world_size: int, m: int):
    """(tables, model, (x, target), expected (loss, grads), spec, where)."""
    if seed is None:
        if (world_size, m) != (VISIBLE_P, VISIBLE_M):
            raise CheckFailed(f"the stored tables are for p = {VISIBLE_P}, m = {VISIBLE_M}; "
                              "call the check as the test cell does, or pass a seed")
        return (*_stored_problem(), SPEC, f"the stored case (p = {VISIBLE_P}, m = {m})")
    spec = PipeSpec(num_layers=2 * world_size, hidden=16, batch=2 * m, seed=seed)
    try:
        tables = course_tables(world_size, m)
    except NotImplementedError:
        raise CheckFailed("this case needs the course's tables, which your handout leaves out "
                          "(they answer Section 2); call the check without a seed") from None
    data = tuple(t.double() for t in spec.data())
    return (tables, spec.model().double(), data, _reference(spec), spec,
            f"fresh inputs (seed {seed}, p = {world_size}, m = {m})")


def _expected_messages(table, placement) -> list[Counter]:
    """Per rank, Counter of (op, peer): an isend for every F whose next stage, or B whose previous
    stage, is on another rank; an irecv for every F or B whose input comes from one."""
    last, counts = len(placement) - 1, [Counter() for _ in table]
    for r, row in enumerate(table):
        for op, i, s in row:
            out = s + 1 if op == "F" and s < last else s - 1 if op == "B" and s > 0 else None
            inp = s - 1 if op == "F" and s > 0 else s + 1 if op == "B" and s < last else None
            if out is not None and placement[out] != r:
                counts[r][("isend", placement[out])] += 1
            if inp is not None and placement[inp] != r:
                counts[r][("irecv", placement[inp])] += 1
    return counts


DEADLOCK = ("The replay of each of these tables finishes (every action's input is made before "
            "anyone waits for it forever), so a deadlock is the executor's: a rank waits for a "
            "message before it has posted a send its peer needs first. A send must never wait "
            "(dist.isend, its work waited for only once the row is done), and a receive is "
            "waited for only when the action that needs it runs.")


def _run(run_table, tables, model, data, spec, m, where):
    import distlab
    from distlab.labs.pipeline.executor import table_rank_inputs, tables_on_rank
    layers, xs, targets, rows = table_rank_inputs(tables, spec, m, torch.float64, model, data)
    placements = {name: list(pl) for name, (_, pl) in tables.items()}
    what = f"run_table on {where}"
    try:
        out = distlab.run(tables_on_rank, len(layers), run_table, PerRank(layers), PerRank(xs),
                          PerRank(targets), PerRank(rows), placements, m, backend="gloo",
                          timeout=min(rank_timeout(), TIMEOUT))
    except HangError as err:
        order = ", then ".join(NAMES[name] for name in tables)
        raise CheckFailed(f"{what}: the ranks stopped making progress (a deadlock).\n"
                          f"{err}\n{DEADLOCK} (The tables ran in turn: {order}; each rank's "
                          f"barriers so far tell which it was in.)") from None
    except DistributedError as err:
        raise ranks_failed(what, err) from None
    assert_crossed_as_recorded(out, what)
    return out


WRONG_MESSAGE = (
    "A message reached the wrong action. gloo hands a receive the sends from that rank with the "
    "same tag in the order they were posted; in a V, or with virtual stages, one pair of ranks "
    "carries several streams (activations into one stage, gradients into another), each in an "
    "order of its own. Does every tag tell them apart: the kind (activation or gradient) and "
    "the stage (and the microbatch, which costs nothing)?")


def _check_grads(name, out, tables, expected, where) -> float:
    """Loss and gradients of table ``name`` against the single-process step; the largest
    difference."""
    table, placement = tables[name]
    loss, ref = expected
    what = f"run_table on {NAMES[name]}, {where}"
    got_loss = out[placement[-1]][name]["loss"]
    if got_loss is None:
        raise CheckFailed(f"{what}: rank {placement[-1]} (the last stage's) has no loss: its "
                          "stage's forwards never ran.")
    worst = abs(got_loss - loss)
    assert_close(torch.tensor(got_loss), torch.tensor(loss), what=f"{what}: the loss",
                 rank=placement[-1], atol=TOL, rtol=TOL, hint=WRONG_MESSAGE)
    for r in range(len(table)):
        for n, g in out[r][name]["grads"].items():
            stage = next(s for s in range(len(placement)) if placement[s] == r
                         and n in _stage_names(ref, s, len(placement)))
            if g is None:
                raise CheckFailed(
                    f"{what}: {n} (stage {stage}) has no gradient on rank {r}: no B of stage "
                    f"{stage} added its weights' gradient. A B whose (stage, microbatch) has a W "
                    f"in the table computes the input's gradient only (weights=False) and its W "
                    f"adds the weights'; a B without a W is a whole backward (weights=True).")
            hint = ("Twice the expected gradient: a B with a W of its own ran as a whole "
                    "backward (weights=True) and its W added the weights' gradient again."
                    if torch.allclose(g, 2 * ref[n], rtol=1e-6, atol=1e-9) else WRONG_MESSAGE)
            with recording():
                assert_close(g, ref[n], what=f"{what}: the gradient of {n} (stage {stage})",
                             rank=r, atol=TOL, rtol=TOL, hint=hint)
            worst = max(worst, (g - ref[n]).abs().max().item())
    return worst


def _stage_names(ref: dict, stage: int, num_stages: int) -> set:
    from distlab.labs.pipeline.model import partition_layers
    layers = len({n.split(".")[0] for n in ref})
    start, stop = partition_layers(layers, num_stages)[stage]
    return {n for n in ref if start <= int(n.split(".")[0]) < stop}


def _check_record(name, out, tables, index, row_bytes, where) -> int:
    """Only isend/irecv, each rank's messages per peer the table's, each one activation's bytes;
    the messages one step sent."""
    from distlab.labs.tensor_parallel import split_at_barriers
    table, placement = tables[name]
    what = f"run_table on {NAMES[name]}, {where}"
    expected = _expected_messages(table, placement)
    for r in range(len(table)):
        phases = split_at_barriers(out.comms[r])
        if len(phases) != len(tables) + 1:
            raise CheckFailed(f"{what}: rank {r} called dist.barrier() itself; remove it (the "
                              "check puts one between two tables).")
        calls = phases[index]
        other = sorted({c.op for c in calls if c.op not in P2P})
        if other:
            raise CheckFailed(
                f"{what}: rank {r} called {', '.join(other)}. Use dist.isend and dist.irecv "
                f"only: a blocking send waits for its receiver (on gloo, at every size), and a "
                f"blocking receive keeps the rank from posting the sends its peers wait for.")
        got = Counter((c.op, c.peer) for c in calls)
        if got != expected[r]:
            def show(c):
                return ", ".join(f"{n} {op} {'to' if op == 'isend' else 'from'} rank {peer}"
                                 for (op, peer), n in sorted(c.items())) or "none"
            raise CheckFailed(
                f"{what}: rank {r} made {show(got)}; the table sends {show(expected[r])} "
                f"(one message per F whose next stage, or B whose previous stage, is on another "
                f"rank; none between two stages of one rank).")
        wrong = [c for c in calls if c.bytes != row_bytes]
        if wrong:
            raise CheckFailed(f"{what}: rank {r}'s {wrong[0].describe()} moves {wrong[0].bytes} "
                              f"bytes; every message is one microbatch's activation or gradient, "
                              f"{row_bytes} bytes.")
    return sum(sum(n for (op, _), n in c.items() if op == "isend") for c in expected)


def grade_executor(run_table, seed: int | None = None, world_size: int = VISIBLE_P,
                   num_microbatches: int = VISIBLE_M) -> str:
    """``run_table(row, stages, placement, num_microbatches)`` on every rank, for the course's
    interleaved 1F1B (v = 2), ZB-H1 and zero-bubble V tables: the loss and every gradient equal
    one process's within 1e-6 (float64); only isend/irecv, exactly the table's messages per peer;
    a deadlock reported within ``TIMEOUT`` seconds of no progress."""
    __tracebackhide__ = True  # noqa: F841
    m = num_microbatches
    tables, model, data, expected, spec, where = _problem(seed, world_size, m)
    out = _run(run_table, tables, model, data, spec, m, where)
    row_bytes = (spec.batch // m) * spec.hidden * 8
    worst, sent = 0.0, []
    for index, name in enumerate(tables):
        worst = max(worst, _check_grads(name, out, tables, expected, where))
        sent.append(f"{NAMES[name]} {_check_record(name, out, tables, index, row_bytes, where)}")
    return (f"run_table on {where}: loss and every gradient within {worst:.1e} of one process "
            f"(tolerance {TOL:g}) on each table; only isend/irecv, messages per step as the tables "
            f"send: {', '.join(sent)}")


def torch_set() -> dict:
    """torch's own schedules run once on the stored case's model (``torch_runs``): their loss
    and gradients, which Section 3 sets beside the student's executor on torch's tables."""
    from distlab.labs.pipeline.on_ranks import TORCH
    from distlab.labs.pipeline.torch_runs import torch_grads
    out = {"seed": SPEC.seed}
    for name, run in torch_grads(TORCH, VISIBLE_P, VISIBLE_M, SPEC).items():
        out[f"{name}.loss"] = torch.tensor(run["loss"], dtype=torch.float64)
        out.update({f"{name}.{n}": g for n, g in run["grads"].items()})
    return out


EXECUTOR_SHIPPED = ("distlab.labs.pipeline.executor:run_table",
                    "distlab.labs.pipeline.executor:single_process_step",
                    "distlab.checks.lab11_executor:_reference",
                    "distlab.checks.lab11_executor:course_tables",
                    "distlab.checks.lab11_executor:executor_set")
