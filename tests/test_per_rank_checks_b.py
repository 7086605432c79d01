"""Labs 6-10: ranks that run student code hold their own inputs only and no expected value
(issue 41, route 1; ``distlab.runtime.per_rank``).

- Every task a lab's checks launch with the course's solution is inspected: rank r's arguments
  hold no other rank's per-rank tensors, no reference (the launch would refuse one: the checks
  still pass) and not the hidden case's seed.
- Attacks that walk the stack from inside the student's function to the rank body's locals
  (``tests/submissions/frame_walks.py``) find nothing there, and earn nothing on what they attack.
"""
from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

from distlab.checks import lab07, lab08, lab09, lab10
from distlab.checks.assertions import CheckFailed
from distlab.course import solutions
from distlab.runtime import launch
from distlab.runtime.per_rank import PerRank, ReferenceTensor
from submissions.frame_walks import DISPATCH, RING_BACKWARD, RING_FORWARD, STEAL, attacked

SEED = 48611                     # a hidden case's seed, distinctive enough to look for


def _leaves(value, seen=None):
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
            yield from _leaves(v, seen)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v, seen)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            yield from _leaves(getattr(value, field.name), seen)
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
        leaves = list(_leaves(shared)) + [x for values in per_rank for x in _leaves(values)]
        assert SEED not in [x for x in leaves if isinstance(x, int)], f"{name} got the seed"
        assert not any(isinstance(x, ReferenceTensor) for x in leaves), name
        for values in per_rank:
            split += 1
            for rank, other in itertools.permutations(range(world_size), 2):
                own = [t for t in _leaves(values[rank]) if isinstance(t, torch.Tensor)]
                for t in _leaves(values[other]):
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


LABS = {"10_context_parallel": (_lab10, ("imports", "plan_imports"), 3),
        "09_expert_parallel": (_lab09, ("imports",), 5),
        "08_sharded_data_parallel": (_lab08, ("imports",), 3),
        "07_3d_parallelism": (_lab07, ("imports",), 1)}


@pytest.mark.parametrize("lab", list(LABS))
def test_every_rank_gets_its_own_inputs_and_no_expected_value(lab, launched):
    run, setup, split = LABS[lab]
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
