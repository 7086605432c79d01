"""Every rank a lab's checks launch with a student's code gets its own inputs only, and no
expected result (CONTRIBUTING.md, "Answers out of reach"; ``distlab.runtime.per_rank``).

For each lab, the graded test cells (visible and hidden tests) run with the course's solution
while every launch is recorded: each rank's pickled task, and what the ranks returned. Then
- no rank's task holds a piece of another rank's ``PerRank`` value (what differs between the
  two ranks' values, as bytes);
- every value the judge compares a rank's result with is marked as a reference (so pickling it,
  on its way to a rank, would have stopped the launch), but for ranks compared with each other.

A lab joins with one parameter in ``LABS`` (its test cells must run with the solution alone).
"""
from __future__ import annotations

import sys

import pytest
import torch

from distlab.checks import assertions
from distlab.course import solutions
from distlab.grading.course_dir import source_notebook
from distlab.runtime import launch
from distlab.runtime.per_rank import PerRank, ReferenceTensor

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
