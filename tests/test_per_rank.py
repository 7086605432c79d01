"""Ranks get their own inputs only, and no expected result can reach one (distlab.runtime.per_rank)."""
import pickle

import pytest
import torch

import distlab
from distlab.runtime.launch import _calls
from distlab.runtime.per_rank import (PerRank, ReferenceLeak, nan_module_outside, nan_outside,
                                      plain, reference)


def _echo(rank, world_size, x, label=None):
    return x, label


def test_each_rank_receives_its_own_value_and_no_other_ranks():
    secrets = [f"secret-of-rank-{r}" for r in range(3)]
    calls = _calls(_echo, (PerRank(secrets),), {}, 3)
    for rank, call in enumerate(calls):
        for other, secret in enumerate(secrets):
            assert (secret.encode() in call) == (other == rank)
    out = distlab.run(_echo, 3, PerRank([torch.tensor([r]) for r in range(3)]),
                      label=PerRank("abc"), backend="gloo")
    assert [(int(x), label) for x, label in out] == [(0, "a"), (1, "b"), (2, "c")]


def test_a_per_rank_argument_needs_one_value_per_rank_and_never_travels_whole():
    with pytest.raises(ValueError, match="3 values for 2 ranks"):
        _calls(_echo, (PerRank([1, 2, 3]),), {}, 2)
    with pytest.raises(TypeError, match="never sent whole"):
        pickle.dumps(PerRank([1, 2]))


def test_a_reference_planted_in_a_rank_body_is_refused_before_any_rank_starts():
    expected = reference({"out": torch.ones(4), "loss": 2.5, "steps": 3})
    derived = expected["out"] * 2 + 1            # computed from a reference: still one
    assert type(derived).__name__ == "ReferenceTensor"
    for planted in (expected["out"], derived, expected["loss"], expected["steps"], [derived]):
        with pytest.raises(ReferenceLeak, match="expected result"):
            distlab.run(_echo, 2, planted, backend="gloo")
    with pytest.raises(ReferenceLeak):          # in a closure's cell, too
        distlab.run(lambda rank, world_size: derived.sum(), 2, backend="gloo")
    with pytest.raises(ReferenceLeak):          # or in one rank's inputs
        distlab.run(_echo, 2, PerRank([torch.zeros(1), derived]), backend="gloo")


def test_plain_drops_the_mark_and_keeps_the_values():
    expected = reference({"out": torch.arange(3.0), "loss": 2.5, "steps": 3, "name": "ring"})
    values = plain(expected)
    pickle.dumps(values)
    assert type(values["out"]) is torch.Tensor and torch.equal(values["out"], torch.arange(3.0))
    assert (type(values["loss"]), type(values["steps"]), values["name"]) == (float, int, "ring")


def test_what_a_shard_must_not_read_is_nan():
    full = torch.arange(12.0).reshape(3, 4)
    blind = nan_outside(full, (slice(None), slice(2, 4)))
    assert torch.equal(blind[:, 2:], full[:, 2:]) and blind[:, :2].isnan().all()
    layer = torch.nn.Linear(4, 6)
    shard = nan_module_outside(layer, {"weight": slice(0, 3), "bias": slice(0, 3)})
    assert torch.equal(shard.weight[:3], layer.weight[:3]) and shard.weight[3:].isnan().all()
    assert shard(torch.ones(1, 4))[0, 3:].isnan().all() and not layer.weight.isnan().any()
    with pytest.raises(KeyError, match="no tensor named"):
        nan_module_outside(layer, {"w": slice(0, 1)})
