"""Lab 3 (tensor-parallel MLP): the reference layers pass the graded checks on 2 and 4 ranks,
and typical wrong submissions fail them with a message that names the mistake."""
import re

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from distlab.labs import tensor_parallel as tp
from distlab.labs.tensor_parallel import demos
from distlab.labs.activation_memory import ActivationMeter
from distlab.checks.assertions import CheckFailed
from distlab.checks import lab03

SMALL = dict(batch=3, seq=12, hidden=24, ffn=48)   # divisible by 2 and 4


def column(dense, group):
    return tp.ColumnParallelLinear.from_linear(dense, group)


def row(dense, group):
    return tp.RowParallelLinear.from_linear(dense, group)


def sp_block(dense, group):
    return tp.TensorParallelBlock(dense, group, sequence_parallel=True)


# ---------------------------------------------------------------------------------------------
# The reference implementation passes every check

def test_sharding_reference_passes():
    lab03.check_shard_column(lambda w, b, r, p: (tp.shard(w, 0, r, p), tp.shard(b, 0, r, p)),
                             world_size=4, seed=11, **SMALL)
    lab03.check_shard_row(lambda w, b, r, p: (tp.shard(w, 1, r, p), b.clone()),
                          world_size=2, seed=12, **SMALL)


@pytest.mark.parametrize("world_size", [2, 4])
def test_operators_reference_passes(world_size):
    shape = dict(batch=2, seq=8, hidden=16)
    lab03.check_copy_to_tp(tp.CopyToTensorParallel, world_size, seed=21, **shape)
    lab03.check_reduce_from_tp(tp.ReduceFromTensorParallel, world_size, seed=22, **shape)
    lab03.check_gather_from_sp(tp.GatherFromSequenceParallel, world_size, seed=23, **shape)
    lab03.check_reduce_scatter_to_sp(tp.ReduceScatterToSequenceParallel, world_size, seed=24, **shape)


@pytest.mark.parametrize("world_size", [2, 4])
def test_modules_reference_passes(world_size):
    lab03.check_parallel_linears(column, row, world_size, seed=31, **SMALL)
    lab03.check_tp_mlp(tp.TensorParallelMLP, world_size, seed=32, **SMALL)
    lab03.check_tp_swiglu(tp.TensorParallelSwiGLU, world_size, seed=33, **SMALL)
    lab03.check_sequence_parallel_block(sp_block, world_size, seed=34, **SMALL)


def test_references_are_reproducible_and_dense():
    a, b = lab03.make_references(), lab03.make_references()
    assert a.keys() == b.keys()
    for name in a:
        for key, value in a[name].items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(value, b[name][key]), (name, key)
    mlp = a["mlp"]
    dense = tp.MLP(mlp["x"].shape[-1], mlp["param.fc1.weight"].shape[0])
    dense.load_state_dict({k[6:]: v for k, v in mlp.items() if k.startswith("param.")})
    torch.testing.assert_close(dense(mlp["x"]), mlp["y"])


# ---------------------------------------------------------------------------------------------
# Wrong submissions fail, with a message that says why

class GatheringRowParallel(nn.Module):
    """Right numbers, wrong lesson: gathers the full weight and the full input on every rank."""

    def __init__(self, dense, group=None):
        super().__init__()
        w, b = tp.row_shard(dense, dist.get_rank(group), dist.get_world_size(group))
        self.weight, self.bias = nn.Parameter(w), nn.Parameter(b)

    def forward(self, x):
        from torch.distributed.nn.functional import all_gather
        weight = torch.cat(all_gather(self.weight), dim=1)     # (out, in): the whole matrix
        x = torch.cat(all_gather(x.contiguous()), dim=-1)       # (b, s, in)
        return F.linear(x, weight, self.bias)


class GatheringMLP(nn.Module):
    def __init__(self, dense, group=None):
        super().__init__()
        self.fc1 = tp.ColumnParallelLinear.from_linear(dense.fc1, group)
        self.fc2 = GatheringRowParallel(dense.fc2, group)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


def test_gathering_full_weights_fails_the_communication_check():
    with pytest.raises(CheckFailed, match=r"whole weight matrix .*fc2\.weight.*one all_reduce") as err:
        lab03.check_tp_mlp(GatheringMLP, 2, seed=41, **SMALL)
    assert "rank 0's forward should issue exactly all_reduce" in str(err.value)


class CopyWithoutReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group=None):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def test_missing_backward_all_reduce_fails_on_the_gradient():
    with pytest.raises(CheckFailed, match="CopyToTensorParallel input gradient"):
        lab03.check_copy_to_tp(CopyWithoutReduce, 2, seed=42, batch=2, seq=8, hidden=16)


class InPlaceReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group=None):
        dist.all_reduce(x, group=group)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def test_reduce_in_place_on_input_is_named():
    with pytest.raises(CheckFailed, match="changed its input in place"):
        lab03.check_reduce_from_tp(InPlaceReduce, 2, seed=43, batch=2, seq=8, hidden=16)


class ReduceScatterByAllReduce(torch.autograd.Function):
    """Right values, twice the bytes: all-reduce then keep a slice."""

    @staticmethod
    def forward(ctx, x, group=None):
        ctx.group = group
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x.chunk(dist.get_world_size(group), 1)[dist.get_rank(group)].contiguous()

    @staticmethod
    def backward(ctx, grad):
        return tp.GatherFromSequenceParallel.apply(grad, ctx.group), None


def test_all_reduce_instead_of_reduce_scatter_fails():
    with pytest.raises(CheckFailed, match="reduce-scatter belongs"):
        lab03.check_reduce_scatter_to_sp(ReduceScatterByAllReduce, 2, seed=44, batch=2, seq=8, hidden=16)


def test_split_row_bias_is_named():
    with pytest.raises(CheckFailed, match="Keep the whole bias"):
        lab03.check_shard_row(lambda w, b, r, p: (tp.shard(w, 1, r, p), b / p), seed=45, **SMALL)


def test_interleaved_column_shard_fails():
    with pytest.raises(CheckFailed, match="contiguous block"):
        lab03.check_shard_column(lambda w, b, r, p: (w[r::p].clone(), b[r::p].clone()), seed=46, **SMALL)


# ---------------------------------------------------------------------------------------------
# Plumbing: memory, DTensor, formula

def test_sequence_parallel_saves_activation_memory():
    rows = tp.compare_activation_memory(None, world_size=2, batch=2, seq=16, hidden=16, ffn=64)
    kib = {r["variant"]: float(r["saved KiB per rank"]) for r in rows}
    assert kib["sequence parallel"] < kib["tensor parallel"] < kib["dense (one device)"]
    # The lab passes the student's TP MLP: the same block around it keeps the same bytes.
    mine = tp.compare_activation_memory(None, tp.TensorParallelMLP, world_size=2, batch=2, seq=16,
                                        hidden=16, ffn=64)
    assert mine == rows


def test_saved_activations_counts_a_linear_input_once():
    layer = nn.Linear(8, 8)
    x = torch.randn(4, 8, requires_grad=True)
    with ActivationMeter(layer) as saved:
        layer(x)
    assert saved.bytes == x.numel() * 4   # the input; the weight is a parameter, not counted


def test_sequence_parallel_backward_counts_the_second_all_gather():
    # Megatron re-gathers fc1's input shard in the backward (Korthikanti et al. 2022, 4.2.2):
    # forward as TP, backward 1.5x TP per rank on a ring, not "the same volume".
    n = 2 * 8 * 16 * 4
    formula = tp.megatron_comm_bytes(2, 8, 16)
    assert formula["sp"]["backward"] == {"all_gather": 2 * n, "reduce_scatter": n}
    for p in (2, 4):
        ring = {v: tp.ring_bytes_per_rank(phases, p) for v, phases in formula.items()}
        assert ring["sp"]["forward"] == pytest.approx(ring["tp"]["forward"])
        assert ring["sp"]["backward"] == pytest.approx(1.5 * ring["tp"]["backward"])
        assert ring["tp"]["backward"] == pytest.approx(2 * (p - 1) / p * n)


@pytest.mark.stored_data     # the lab's case: DTensor's side is the course's stored run
@pytest.mark.parametrize("kind", ["mlp", "block_sp"])
def test_dtensor_matches_hand_written_and_formula(kind, capsys):
    rows = tp.compare_with_dtensor(None, kind, world_size=2)
    printed = capsys.readouterr().out
    # float32 rounding shows as its bound (< 32 float32 ulps of the outputs' largest |value|,
    # rounded up to a power of ten), never as digits, which differ from CPU to CPU
    assert re.search(r"max \|hand - DTensor\| output < 1e-0[4-6], input gradient < 1e-0[4-6]",
                     printed), printed
    assert not re.search(r"\d\.\d+e-\d", printed), printed
    nbytes = tp.megatron_comm_bytes(2, 8, 16)["tp" if kind == "mlp" else "sp"]
    for row in rows:
        for side in ("hand-written (out.comms)", "DTensor (CommDebugMode)"):
            if row[side] != "-":
                assert row[side].endswith(f" {nbytes['forward'][next(iter(nbytes['forward']))]} B")


def test_dtensor_comparison_reads_the_stored_run_of_the_labs_case_and_runs_any_other(capsys):
    """A handout has no DTensor plans: the lab's case shows the course's stored DTensor run
    (equal to a fresh one: test_references_reproducible); another case runs DTensor now."""
    stored = demos.stored_dtensor_run("swiglu")
    assert [(r["phase"], r["op"], r["shape"], r["bytes"]) for r in stored["records"]] == \
        [("forward", "all_reduce", (2, 8, 16), 1024)] + [("backward", "all_reduce", (2, 8, 16), 1024)] * 2
    tp.compare_with_dtensor(tp.TensorParallelSwiGLU, "swiglu", world_size=2)
    assert "the course's stored run" in capsys.readouterr().out
    rows = tp.compare_with_dtensor(tp.TensorParallelMLP, "mlp", world_size=2, batch=1, seq=4)
    printed = capsys.readouterr().out
    assert "stored" not in printed and re.search(r"output < 1e-0[4-6],", printed), printed
    assert rows[0]["DTensor (CommDebugMode)"] == "all_reduce [1, 4, 16] 256 B"


# ----------------------------------------------------------------------------- the prediction


def test_ring_bytes_prediction_passes_and_planted_mistakes_fail():
    from distlab.checks import lab03_prediction
    from distlab.course.solutions import solution_functions
    from distlab.labs.tensor_parallel import mlp_comm_record
    f = solution_functions(lab03.LAB, ("predict_ring_bytes", "TensorParallelMLP"))
    lab03.check_predicted_ring_bytes(f["predict_ring_bytes"])
    lab03.check_predicted_ring_bytes(f["predict_ring_bytes"], seed=6)
    # the formula's messages are the ones the lab's TensorParallelMLP issues
    n = 2 * 8 * 16 * 4
    assert mlp_comm_record(f["TensorParallelMLP"]) == {"forward": [("all_reduce", n)],
                                                       "backward": [("all_reduce", n)]}
    assert lab03_prediction._expected(2, 8, 16, 2, "tp") == [n, n]     # 2(p-1)/p = 1 at p = 2

    def message_bytes(batch, seq, hidden, world_size, variant):     # forgot the ring share
        n = batch * seq * hidden * 4
        return {"forward": n, "backward": n}
    # at p = 2 a ring all-reduce sends the whole message: the first miss is SP's backward
    with pytest.raises(CheckFailed, match=r"variant='sp'\)\['backward'\] = 1024, the formula gives 1536"):
        lab03.check_predicted_ring_bytes(message_bytes)

    def sp_like_tp(batch, seq, hidden, world_size, variant):        # forgot the extra all-gather
        return f["predict_ring_bytes"](batch, seq, hidden, world_size, "tp")
    with pytest.raises(CheckFailed, match="all-gathers fc1's input once more"):
        lab03.check_predicted_ring_bytes(sp_like_tp)


def test_a_frame_walk_or_a_dense_shortcut_earns_nothing():
    """Issue 41, route 1: the student's module walks up to the rank body's locals for the dense
    problem (expected output and gradients) and replays it, one all_reduce each way for the
    record; finding none, it runs the dense MLP it was handed, whole. The rank holds no expected
    value, and its dense module is NaN outside its shard: the output is NaN, and said so."""
    from submissions import frame_walk
    problem = lab03.mlp_problem("mlp", 41, **SMALL)

    def leaky_body(ref):             # what the rank body held before: the whole problem
        return frame_walk.steal_problem()
    assert leaky_body(problem) is problem   # the walk finds it where it is
    with pytest.raises(CheckFailed, match=r"(?s)TensorParallelMLP output on fresh inputs.*"
                                          r"rank 0.*NaN in your result"):
        lab03.check_tp_mlp(frame_walk.StealingMLP, 2, seed=41, **SMALL)
