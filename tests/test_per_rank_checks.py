"""Every rank a lab's checks launch with a student's code gets its own inputs only, and no
expected result (CONTRIBUTING.md, "Answers out of reach"; ``distlab.runtime.per_rank``;
issue 41, route 1).

Labs 1-5 (``LABS``): the graded test cells (visible and hidden tests) run with the course's
solution while every launch is recorded: each rank's pickled task, and what the ranks returned.
Then
- no rank's task holds a piece of another rank's ``PerRank`` value (what differs between the
  two ranks' values, as bytes);
- every value the judge compares a rank's result with is marked as a reference (so pickling it,
  on its way to a rank, would have stopped the launch), but for ranks compared with each other.
A lab joins with one parameter in ``LABS`` (its test cells must run with the solution alone).

Labs 7-10 (``CHECK_CALLS``): their checks run with the solution on a hidden case's seed, and
every task they launch is inspected: rank r's arguments hold no other rank's per-rank tensors, no
reference (the launch would refuse one: the checks still pass) and not the hidden case's seed.

Attacks that walk the stack from inside the student's function to the rank body's locals
(``tests/submissions/frame_walk.py``) find nothing there, and earn nothing on what they attack.
"""
from __future__ import annotations

import dataclasses
import itertools
import sys

import pytest
import torch

from distlab.checks import assertions, lab07, lab08, lab09, lab10, lab11, lab12
from distlab.checks.assertions import CheckFailed
from distlab.course import solutions
from distlab.grading.course_dir import source_notebook
from distlab.runtime import launch
from distlab.runtime.per_rank import PerRank, ReferenceTensor
from submissions.frame_walk import DISPATCH, RING_BACKWARD, RING_FORWARD, STEAL, attacked

LABS = ["01_collectives", "02_data_parallel", "03_tensor_parallel_mlp",
        "04_tensor_parallel_attention", "05_pipeline_parallel"]
# Comparisons of one rank's result with another's (no reference involved).
RANK_WITH_RANK = ("compared with rank 0's",)


def _leaves(value) -> list[torch.Tensor]:
    """The tensors in ``value`` (through tuples, lists, dicts and modules), in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, torch.nn.Module):
        return list(value.state_dict().values())
    if isinstance(value, dict):
        return [t for v in value.values() for t in _leaves(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _leaves(v)]
    return []


def _own_piece(mine: torch.Tensor, other: torch.Tensor | None) -> bytes | None:
    """Bytes of 4 consecutive elements of ``mine`` that are numbers and differ from ``other``
    there (the part of ``mine`` that ``other`` lacks); None if there is none."""
    flat = mine.detach().reshape(-1)
    own = torch.isfinite(flat) if flat.is_floating_point() else torch.ones_like(flat, dtype=torch.bool)
    if other is not None and other.shape == mine.shape and other.dtype == mine.dtype:
        own &= flat != other.detach().reshape(-1)
    run = 0
    for i, ok in enumerate(own.tolist()):
        run = run + 1 if ok else 0
        if run == 4:
            return flat[i - 3:i + 1].contiguous().numpy().tobytes()
    return None


def _per_rank_args(args: tuple, kwargs: dict) -> list[PerRank]:
    return [a for a in (*args, *kwargs.values()) if isinstance(a, PerRank)]


@pytest.fixture(params=LABS)
def lab_run(request, monkeypatch):
    """The lab's test cells run with its solution: {"launches": [(args, kwargs, calls)],
    "results": ids of the tensors ranks returned, "compared": [(got, expected, what)]}."""
    lab = request.param
    namespace = solutions.solution_namespace(lab)
    marker = namespace["__name__"].encode()           # by-value pickles name the solution's module
    launches, results, compared, keep = [], set(), [], []

    original_calls, original_run = launch._calls, launch.Launcher.run

    def calls(fn, args, kwargs, world_size):
        pickled = original_calls(fn, args, kwargs, world_size)
        if any(marker in call for call in pickled):
            launches.append((args, kwargs, pickled))
        return pickled

    def run(self, fn, world_size, *args, **kwargs):
        out = original_run(self, fn, world_size, *args, **kwargs)
        if world_size > 1:
            keep.append(out)                           # ids stay valid while the values live
            results.update(id(t) for rank in out for t in _leaves(rank))
        return out

    original_close = assertions.assert_close

    def close(got, expected, **kw):
        compared.append((got, expected, kw.get("what", "")))
        return original_close(got, expected, **kw)

    monkeypatch.setattr(launch, "_calls", calls)
    monkeypatch.setattr(launch.Launcher, "run", run)
    for module in [m for name, m in sys.modules.items() if name.startswith("distlab.checks")]:
        if getattr(module, "assert_close", None) is original_close:
            monkeypatch.setattr(module, "assert_close", close)
    for cell in source_notebook(lab).cells:
        if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("grade"):
            exec(compile(cell.source, f"<{lab} test cell>", "exec"), namespace)
    return {"lab": lab, "launches": launches, "results": results, "compared": compared}


@pytest.mark.timeout(1200)
def test_ranks_get_their_own_inputs_and_no_expected_result(lab_run):
    assert lab_run["launches"], f"{lab_run['lab']}: no launch ran the solution's code"
    for args, kwargs, calls in lab_run["launches"]:
        for per_rank in _per_rank_args(args, kwargs):
            values = [_leaves(v) for v in per_rank.values]
            for rank, call in enumerate(calls):
                for other, theirs in enumerate(values):
                    if other == rank:
                        continue
                    mine = values[rank]
                    for i, leaf in enumerate(theirs):
                        piece = _own_piece(leaf, mine[i] if i < len(mine) else None)
                        assert piece is None or piece not in call, (
                            f"{lab_run['lab']}: rank {rank}'s task holds part of rank {other}'s "
                            f"input (its {i}-th tensor, shape {list(leaf.shape)})")
    checked = 0
    for got, expected, what in lab_run["compared"]:
        if not isinstance(expected, torch.Tensor) or id(got) not in lab_run["results"]:
            continue
        if any(phrase in what for phrase in RANK_WITH_RANK):
            continue
        checked += 1
        assert isinstance(expected, ReferenceTensor), (
            f"{lab_run['lab']}: {what!r} compares a rank's result with an unmarked value; mark "
            f"it with distlab.runtime.per_rank.reference where it is computed or loaded")
    assert checked, f"{lab_run['lab']}: no rank's result was compared with a reference"


# =============================================================================================
# Labs 7-10: the tasks of chosen check calls on a hidden case's seed

SEED = 48611                     # a hidden case's seed, distinctive enough to look for


def _leaves_and_ints(value, seen=None):
    """Tensors and ints inside ``value``: through lists, tuples, dicts, dataclasses and modules."""
    seen = set() if seen is None else seen
    if id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, torch.nn.Module):
        yield from value.state_dict().values()
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _leaves_and_ints(v, seen)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _leaves_and_ints(v, seen)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            yield from _leaves_and_ints(getattr(value, field.name), seen)
    elif isinstance(value, int) and not isinstance(value, bool):
        yield value


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)


@pytest.fixture
def launched(monkeypatch):
    """Every launch's (per-rank values, pickled calls) while the test runs."""
    runs = []
    real = launch._calls

    def spy(fn, args, kwargs, world_size):
        calls = real(fn, args, kwargs, world_size)
        shared = [v for v in (*args, *kwargs.values()) if not isinstance(v, PerRank)]
        per_rank = [v.values for v in (*args, *kwargs.values()) if isinstance(v, PerRank)]
        runs.append((getattr(fn, "__name__", "?"), world_size, shared, per_rank, calls))
        return calls

    monkeypatch.setattr(launch, "_calls", spy)
    return runs


def _inspect(runs) -> int:
    """Assert the per-rank property on every launch; return how many carried PerRank values."""
    split = 0
    for name, world_size, shared, per_rank, calls in runs:
        leaves = list(_leaves_and_ints(shared)) + [x for values in per_rank for x in _leaves_and_ints(values)]
        assert SEED not in [x for x in leaves if isinstance(x, int)], f"{name} got the seed"
        assert not any(isinstance(x, ReferenceTensor) for x in leaves), name
        for values in per_rank:
            split += 1
            for rank, other in itertools.permutations(range(world_size), 2):
                own = [t for t in _leaves_and_ints(values[rank]) if isinstance(t, torch.Tensor)]
                for t in _leaves_and_ints(values[other]):
                    if not isinstance(t, torch.Tensor) or t.numel() < 16 \
                            or any(_same(t, o) for o in own) \
                            or t.isnan().all():   # replicated: both have it; NaN-filled: nothing
                        continue
                    blob = t.detach().contiguous().numpy().tobytes()
                    assert blob not in calls[rank], \
                        f"{name}: rank {rank}'s task holds rank {other}'s {list(t.shape)}"
    return split


def _lab10(ns):
    for check, fn in ((lab10.check_ring_forward, "ring_attention"),
                      (lab10.check_ring_backward, "ring_attention_backward"),
                      (lab10.check_ulysses, "ulysses_attention")):
        check(ns[fn], 2, SEED, batch=1, heads=4, seq=16, dim=4)


def _lab09(ns):
    lab09.check_dispatch(ns["dispatch"], 2, SEED)
    lab09.check_moe_layer(ns["moe_forward"], 2, SEED)
    lab09.check_capacity(ns["expert_capacity"], ns["capacity_mask"], 2, SEED)
    lab09.check_aux_loss(ns["load_balancing_loss"], 2, SEED)
    lab09.check_padded_moe(ns["padded_moe_forward"], 2, SEED)


def _lab08(ns):
    lab08.check_zero2_step(ns["Zero2AdamW"], seed=SEED)
    lab08.check_zero3_block(ns["Zero3Block"], seed=SEED)
    lab08.check_design(ns["design"], seed=SEED)


def _lab07(ns):
    lab07.check_tp_plan(ns["tp_plan"], seed=SEED)


def _lab12(ns):
    # Sections 5 and 6 (l12interval): one rank calls the student's function on the cases'
    # figures (one launch each, nothing per rank: 0 split launches), nothing else; the model,
    # its expected values and the scale stay in the judge
    lab12.check_lost_prediction(ns["predict_lost_fraction"], seed=SEED)
    lab12.check_checkpoint_plan(ns["plan_checkpoints"], seed=SEED)


def _lab11(ns):
    lab11.check_split_backward(ns["backward_input"], ns["backward_weight"], seed=SEED)
    # the table runs on the course's executor: rank r gets its row, its stages, and the batch
    # (or the target) only where the first (last) stage lives
    lab11.check_capped_schedule(ns["capped_schedule"], 2, 6, 2, SEED)
    # the student's executor: rank r gets its layers, its row, and the batch (the target) only
    # where a table's first (last) stage lives; the single process's gradients stay in the judge
    lab11.check_executor(ns["run_table"], seed=SEED)


def _lab12_state(ns):
    # Section 1: every rank gets the run (its spec), where it stops and how long it goes on;
    # the uninterrupted run stays in the judge
    lab12.check_whole_state(ns["whole_state"], ns["restore"], seed=SEED)
    # Section 2: each writer gets its own rows of the drawn state, each reader the checkpoint's
    # files; the drawn state stays in the judge
    lab12.check_resharding(ns["save"], ns["load"], seed=SEED)


def _lab12_restart(ns):
    # Section 4: each rank gets the student's functions, its step count and the merged
    # checkpoint's files (inputs); the clean restart it is compared with is the student's own,
    # and every comparison stays in the judge. Sections 1-2's functions, where the notebook
    # has none yet (the l12restart branch alone), are the course's.
    import contextlib
    import tempfile
    from distlab.labs.checkpoint import run_state, saving
    ns.setdefault("training_state", run_state.training_state)
    ns.setdefault("load_checkpoint", saving.load_checkpoint)
    # the check's folders go in the launcher's folder (here the working one): a temporary one
    with tempfile.TemporaryDirectory(prefix="lab12-per-rank-") as folder, \
            contextlib.chdir(folder):
        lab12.check_train_resumable(ns["train_resumable"], ns["async_save_checkpoint"],
                                    ns["load_checkpoint"], seed=SEED)


def _lab12_all(ns):
    _lab12_state(ns)
    _lab12_restart(ns)
    _lab12(ns)


CHECK_CALLS = {"12_checkpoint_restart": (_lab12_all, ("state_imports", "reshard_imports",
                                                      "async_imports", "restart_imports",
                                                      "interval_imports", "plan_imports"), 2),
               "11_pipeline_schedules": (_lab11, ("split_imports", "executor_imports",
                                                   "design_imports"), 5),
               "10_context_parallel": (_lab10, ("imports", "plan_imports"), 3),
        "09_expert_parallel": (_lab09, ("imports",), 5),
        "08_sharded_data_parallel": (_lab08, ("imports",), 3),
        "07_3d_parallelism": (_lab07, ("imports",), 1)}


@pytest.mark.parametrize("lab", list(CHECK_CALLS))
def test_every_rank_gets_its_own_inputs_and_no_expected_value(lab, launched):
    run, setup, split = CHECK_CALLS[lab]
    ns = solutions.solution_namespace(lab, [], setup)
    run(ns)                                            # passes: no launch was refused
    assert _inspect(launched) >= split, [r[0] for r in launched]


def test_a_rank_gets_a_copy_of_its_rows_not_the_storage_they_were_cut_from():
    whole = torch.randn(4, 256)
    calls = launch._calls(lambda rank, world_size, x: x, (PerRank(whole.chunk(2)),), {}, 2)
    assert whole[2:].numpy().tobytes() in calls[1] and whole[2:].numpy().tobytes() not in calls[0]


# ---------------------------------------------------------------------------------------------
# Attacks: a frame walk to the rank body's locals

def test_the_frame_walk_finds_what_a_rank_body_holds():
    """The attacks' search works: planted in a caller's locals, the expected results and the
    whole batch are found (so finding nothing on the ranks means nothing is there)."""
    ns = attacked({"__name__": "frame_walk_probe"}, STEAL)
    problem = {"full.out": 1, "causal.out": 2, "full.lse": 3, "causal.lse": 4}
    whole = torch.randn(8, 3)

    def rank_body(problem, x_all):
        return ns["steal_problem"]("full.out", "causal.lse"), ns["steal_rows"](8, whole[:4])
    found, rows = rank_body(problem, whole)
    assert found is problem and rows is whole


@pytest.mark.parametrize("check,fn,attack,lab", [
    (lab10.check_ring_forward, "ring_attention", RING_FORWARD, "10_context_parallel"),
    (lab10.check_ring_backward, "ring_attention_backward", RING_BACKWARD, "10_context_parallel"),
    (lab09.check_dispatch, "dispatch", DISPATCH, "09_expert_parallel")],
    ids=["ring_forward", "ring_backward", "dispatch"])
@pytest.mark.parametrize("seed", [None, SEED], ids=["visible", "hidden"])
def test_an_answer_looked_up_on_the_stack_earns_nothing(check, fn, attack, lab, seed):
    setup = ("imports", "plan_imports") if lab.startswith("10") else ("imports",)
    ns = attacked(solutions.solution_namespace(lab, [], setup), attack)
    with pytest.raises(CheckFailed, match=r"(: lse|: out|: dq|received tokens) on .*elements differ"):
        check(ns[fn], 2, seed)
