"""Lab 4 (tensor-parallel attention): the reference implementation passes the graded checks on 2
and 4 ranks, and typical wrong submissions fail them with a message that names the mistake."""
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from distlab.labs import attention as att
from distlab.labs import tensor_parallel as tp
from distlab.checks.assertions import CheckFailed
from distlab.checks import lab04

GQA4 = dict(batch=3, seq=12, hidden=48, n_heads=8, n_kv_heads=4)   # heads divisible by 4 ranks
MHA = dict(batch=2, seq=8, hidden=32, n_heads=4, n_kv_heads=4)


# ---------------------------------------------------------------------------------------------
# The layout helpers and the dense references

def test_rank_heads_cover_every_head_once():
    layout = att.QKVLayout(48, 8, 4)
    rows = torch.cat([layout.rank_rows(r, 4) for r in range(4)])
    assert sorted(rows.tolist()) == list(range(layout.rows))
    assert layout.rank_heads(1, 4) == ["q2", "q3", "k1", "v1"]


def test_identify_heads_names_blocks():
    layout = att.QKVLayout(32, 4, 2)
    weight = torch.randn(layout.rows, 32)
    shard, _ = att.split_qkv(weight, None, 1, 2, 4, 2)
    assert att.identify_heads(shard, weight, layout) == ["q2", "q3", "k1", "v1"]
    assert att.identify_heads(weight[:32], weight, layout) == ["q0", "q1", "q2", "q3"]
    assert att.identify_heads(torch.randn(16, 32), weight, layout) == ["?", "?"]


def test_attend_matches_an_explicit_masked_softmax():
    torch.manual_seed(0)
    b, s, nh, nkv, hs = 2, 5, 4, 2, 3
    qkv = torch.randn(b, s, (nh + 2 * nkv) * hs)
    q, k, v = qkv.split([nh * hs, nkv * hs, nkv * hs], dim=-1)
    out = []
    for i in range(nh):
        qi = q[..., i * hs:(i + 1) * hs]                               # (b, s, hs)
        g = i // (nh // nkv)
        ki, vi = k[..., g * hs:(g + 1) * hs], v[..., g * hs:(g + 1) * hs]
        scores = qi @ ki.transpose(1, 2) / hs ** 0.5                   # (b, s, s)
        scores = scores.masked_fill(torch.ones(s, s).triu(1).bool(), float("-inf"))
        out.append(scores.softmax(-1) @ vi)
    torch.testing.assert_close(att.attend(qkv, nh, nkv), torch.cat(out, -1))


def test_references_are_reproducible():
    a, b = lab04.make_references(), lab04.make_references()
    for name in a:
        for key, value in a[name].items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(value, b[name][key]), (name, key)
    vocab = a["vocab"]
    assert not torch.isfinite(vocab["logits"].exp()).all(), "the logits must overflow a naive exp"
    model = lab04.dense_module_of("attention", a["attention"])
    torch.testing.assert_close(model(a["attention"]["x"]), a["attention"]["y"])


# ---------------------------------------------------------------------------------------------
# The reference implementation passes every check

def test_split_reference_passes():
    lab04.check_split_qkv(att.split_qkv)
    lab04.check_split_qkv(att.split_qkv, world_size=4, seed=11, **GQA4)


@pytest.mark.parametrize("world_size,shape", [(2, MHA), (4, GQA4)])
def test_attention_reference_passes(world_size, shape):
    lab04.check_tp_attention_forward(att.TensorParallelAttention, world_size, seed=21, **shape)
    lab04.check_tp_attention_backward(att.TensorParallelAttention, world_size, seed=22, **shape)


@pytest.mark.stored_data
def test_visible_checks_pass_on_stored_references():
    lab04.check_tp_attention_backward(att.TensorParallelAttention)
    lab04.check_tp_block(att.TensorParallelTransformerBlock)
    lab04.check_vocab_parallel_cross_entropy(att.vocab_parallel_cross_entropy)


def test_block_and_loss_reference_pass_on_4_ranks():
    lab04.check_tp_block(att.TensorParallelTransformerBlock, 4, seed=31, ffn=96, **GQA4)
    lab04.check_vocab_parallel_cross_entropy(att.vocab_parallel_cross_entropy, 4, seed=32,
                                             batch=3, seq=4, vocab=96)


# ---------------------------------------------------------------------------------------------
# Wrong submissions fail, with a message that says why

def one_block_split(weight, bias, rank, world_size, n_heads, n_kv_heads):
    """The classic bug: the fused rows cut into p contiguous blocks."""
    return weight.chunk(world_size, 0)[rank].clone(), bias.chunk(world_size, 0)[rank].clone()


def mha_split(weight, bias, rank, world_size, n_heads, n_kv_heads):
    """Right idea, but K and V split as if there were n_heads of them (ignores GQA)."""
    hs = weight.shape[1] // n_heads
    q, k, v = weight.split([n_heads * hs, n_kv_heads * hs, n_kv_heads * hs])
    qb, kb, vb = bias.split([n_heads * hs, n_kv_heads * hs, n_kv_heads * hs])
    per = n_heads * hs // world_size
    pick = lambda t: t[rank * per:(rank + 1) * per]   # noqa: E731
    return torch.cat([pick(q), pick(k), pick(v)]), torch.cat([pick(qb), pick(kb), pick(vb)])


def test_one_block_split_fails_naming_the_heads():
    with pytest.raises(CheckFailed, match=r"rank 0's shard holds the head blocks \[q0 q1 q2 q3\] "
                                          r".*should hold \[q0 q1 k0 v0\].*one contiguous block"):
        lab04.check_split_qkv(one_block_split)


def test_mha_split_of_gqa_weight_fails_naming_the_heads():
    with pytest.raises(CheckFailed, match=r"rank 0's shard holds the head blocks \[q0 q1 k0 k1 v0 v1\]"):
        lab04.check_split_qkv(mha_split)


class OneBlockAttention(att.TensorParallelAttention):
    """The whole TP attention, built on ColumnParallelLinear's contiguous split of the fused qkv."""

    def __init__(self, attn, group=None):
        super().__init__(attn, group)
        self.qkv = tp.ColumnParallelLinear.from_linear(attn.qkv, group)


def test_module_with_one_block_split_fails_pointing_at_the_heads():
    with pytest.raises(CheckFailed, match=r"(?s)TensorParallelAttention output.*on rank 0.*"
                                          r"holds the head blocks \[q0 q1 q2 q3\]"):
        lab04.check_tp_attention_forward(OneBlockAttention)


class GlobalHeadCountAttention(att.TensorParallelAttention):
    """Right shard, but the local attention is told the global head counts."""

    def forward(self, x):
        qkv = self.qkv(x)                                              # (b, s, (nh+2nkv) hs/p)
        # all nh heads, each hs/p wide: the same numbers cut into the wrong heads
        return self.proj(att.attend(qkv, self.n_heads * 2, self.n_kv_heads * 2))   # 2 ranks


def test_wrong_local_head_count_fails_on_the_output():
    with pytest.raises(CheckFailed, match="holds the right heads; look at the local head counts"):
        lab04.check_tp_attention_forward(GlobalHeadCountAttention)


class NoBackwardReduceAttention(att.TensorParallelAttention):
    """Forgets f: the qkv projection reads x directly, so dL/dx is never summed over ranks."""

    def forward(self, x):
        qkv = F.linear(x, self.qkv.weight, self.qkv.bias)
        return self.proj(att.attend(qkv, self.n_heads, self.n_kv_heads))


def test_missing_f_fails_the_backward_check_only():
    lab04.check_tp_attention_forward(NoBackwardReduceAttention)
    with pytest.raises(CheckFailed, match="(?s)TensorParallelAttention input gradient.*copy_to_tp"):
        lab04.check_tp_attention_backward(NoBackwardReduceAttention)


class GatheringBlock(att.TensorParallelTransformerBlock):
    """Right numbers, wrong lesson: gathers the attention heads and the output projection's
    column shards, and projects densely."""

    def __init__(self, block, group=None):
        super().__init__(block, group)
        w = self.attn.proj.weight.detach().contiguous()                   # (h, h/p): its columns
        parts = [torch.empty_like(w) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, w, group=group)
        self.full_w, self.full_b = torch.cat(parts, 1), self.attn.proj.bias.detach()

    def forward(self, x):
        from torch.distributed.nn.functional import all_gather
        a = self.attn
        heads = att.attend(a.qkv(self.norm1(x)), a.n_heads, a.n_kv_heads)   # (b, s, nh hs/p)
        h = x + F.linear(torch.cat(all_gather(heads.contiguous()), -1), self.full_w, self.full_b)
        return h + self.mlp(self.norm2(h))


def test_gathering_heads_fails_the_collective_count():
    with pytest.raises(CheckFailed, match=r"(?s)forward should issue exactly 2 all_reduce.*all_gather"):
        lab04.check_tp_block(GatheringBlock)


class DenseProjectionBlock(att.TensorParallelTransformerBlock):
    """The local shortcut: each rank's heads go through the dense module's whole output
    projection, which the rank was handed but whose other ranks' columns it must not read."""

    def __init__(self, block, group=None):
        super().__init__(block, group)
        self.dense_proj = block.attn.proj

    def forward(self, x):
        from torch.distributed.nn.functional import all_gather
        a = self.attn
        heads = att.attend(a.qkv(self.norm1(x)), a.n_heads, a.n_kv_heads)   # (b, s, nh hs/p)
        h = x + self.dense_proj(torch.cat(all_gather(heads.contiguous()), -1))
        return h + self.mlp(self.norm2(h))


def test_a_dense_layer_used_whole_reads_nan_and_is_told_so():
    """What a rank's shard must not read is NaN: the shortcut's output is NaN, and the message
    says why (before any comparison of collectives)."""
    with pytest.raises(CheckFailed, match=r"(?s)TensorParallelTransformerBlock output.*on rank 0.*"
                                          r"NaN in your result.*weights it does not own"):
        lab04.check_tp_block(DenseProjectionBlock)


def gathered_loss(logits, target, group=None):
    """Right loss, wrong lesson: gathers the logits over the vocabulary."""
    from torch.distributed.nn.functional import all_gather
    full = torch.cat(all_gather(logits.contiguous()), -1)               # (b, s, V)
    return F.cross_entropy(full.reshape(-1, full.shape[-1]), target.reshape(-1))


def composed_loss(logits, target, group=None, subtract_max=True):
    """The loss from Lab 3's g (reduce_from_tp: all-reduce forward, identity backward), letting
    autograd find the gradient; the max is a constant for the gradient, so it may be detached."""
    part = logits.shape[-1]
    start = dist.get_rank(group) * part
    z, t = logits.reshape(-1, part), target.reshape(-1)                 # (N, V/p), (N,)
    m = torch.zeros(z.shape[0])
    if subtract_max:
        m = z.detach().max(-1).values                                   # (N,)
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
    z = z - m[:, None]
    mine = (t >= start) & (t < start + part)
    z_t = torch.where(mine, z.gather(1, (t - start).clamp(0, part - 1)[:, None])[:, 0], 0.0)
    total = tp.reduce_from_tp(z.exp().sum(-1), group)                   # (N,)
    return (total.log() - tp.reduce_from_tp(z_t, group)).mean()


def naive_exp_loss(logits, target, group=None):
    return composed_loss(logits, target, group, subtract_max=False)


def test_loss_written_with_reduce_from_tp_passes():
    lab04.check_vocab_parallel_cross_entropy(composed_loss)
    lab04.check_vocab_parallel_cross_entropy(composed_loss, 4, seed=33, batch=2, seq=3, vocab=32)


def test_gathering_logits_fails():
    with pytest.raises(CheckFailed, match="Gathering the logits defeats the point"):
        lab04.check_vocab_parallel_cross_entropy(gathered_loss)


def test_overflowing_loss_is_explained():
    with pytest.raises(CheckFailed, match=r"overflows float32.*ReduceOp.MAX"):
        lab04.check_vocab_parallel_cross_entropy(naive_exp_loss)


def test_local_softmax_fails_on_the_loss():
    def local_only(logits, target, group=None):
        # each rank pretends its slice is the whole vocabulary
        t = (target - dist.get_rank() * logits.shape[-1]).clamp(0, logits.shape[-1] - 1)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), t.reshape(-1))
    with pytest.raises(CheckFailed, match="vocab_parallel_cross_entropy loss"):
        lab04.check_vocab_parallel_cross_entropy(local_only)


# ---------------------------------------------------------------------------------------------
# The lab's demonstrations

def test_block_comms_table_shows_two_all_reduces_each_way(capsys):
    rows = att.block_comms_table(world_size=2)
    assert [(r["pass"], r["op"]) for r in rows] == [("forward", "all_reduce")] * 2 + \
        [("backward", "all_reduce")] * 2
    assert {r["bytes"] for r in rows} == {2 * 8 * 32 * 4}


def test_scaling_table_has_a_row_per_world_size(capsys):
    rows = att.scaling_table(world_sizes=(1, 2), batch=1, seq=8, hidden=16, n_heads=2,
                             n_kv_heads=2, steps=1, warmup=0)
    assert [r["ranks"] for r in rows] == [1, 2]
    assert rows[0]["efficiency T1/(N TN)"] == "1.00"
    assert rows[1]["all-reduce ms"] != "-"
    assert "scaling efficiency" in str(att.plot_scaling(rows).axes[1].get_title())


# ---- the scaling exercise: T_N predicted from Lab 1's ring model ------------------------------

def test_tp_scaling_check_passes_the_formulas_and_rejects_mistakes():
    from distlab.checks.assertions import CheckFailed
    from distlab.checks import lab04
    from distlab.labs import tp_scaling as ts
    lab04.check_tp_scaling(ts.reference_predicted_step, ts.reference_strong_scaling_efficiency)
    lab04.check_tp_scaling(ts.reference_predicted_step, ts.reference_strong_scaling_efficiency, seed=9)

    def compute_only(t1, n, alpha, bandwidth, batch, seq, hidden):
        return t1 / n
    with pytest.raises(CheckFailed, match="4 all-reduces"):
        lab04.check_tp_scaling(compute_only, ts.reference_strong_scaling_efficiency)

    def speedup(t1, tn, n):
        return t1 / tn
    with pytest.raises(CheckFailed, match="Strong-scaling efficiency"):
        lab04.check_tp_scaling(ts.reference_predicted_step, speedup)


def test_tp_scaling_visible_check_needs_no_formula_of_the_course(monkeypatch):
    """A handout has no reference formulas: the visible check reads the stored values, which
    are the formulas' on the visible cases; the hidden one computes them (in the judge)."""
    from distlab.checks import lab04, lab04_scaling
    from distlab.checks.stored import load
    from distlab.labs import tp_scaling as ts
    predict, efficiency = ts.reference_predicted_step, ts.reference_strong_scaling_efficiency
    stored = load(lab04.LAB, "scaling")
    fresh = lab04_scaling.reference_set()
    # float64 formulas of the same stored numbers: equal but for sums in another order
    from distlab.checks.stored import EXACT64, tolerance
    for k in ("predicted", "efficiency", "all_reduce"):
        torch.testing.assert_close(fresh[k], stored[k], **tolerance(stored[k], rel=EXACT64))

    def withheld(*args, **kwargs):
        raise NotImplementedError("not in the handout")
    for name in ("reference_predicted_step", "reference_strong_scaling_efficiency",
                 "ring_all_reduce_time"):
        monkeypatch.setattr(lab04_scaling, name, withheld)
    lab04.check_tp_scaling(predict, efficiency)
    with pytest.raises(NotImplementedError):
        lab04.check_tp_scaling(predict, efficiency, seed=9)


def test_scaling_table_times_the_block_it_is_given(capsys):
    """The lab times the student's block (a handout has no course block): a class that counts
    its instances shows it ran, on the ranks of N = 2 only (N = 1 is the dense block)."""
    rows = att.scaling_table(world_sizes=(1, 2), batch=1, seq=8, hidden=16, n_heads=2,
                             n_kv_heads=2, steps=1, warmup=0, block_cls=_CountingBlock)
    assert [r["ranks"] for r in rows] == [1, 2] and "built on rank" in capsys.readouterr().out


class _CountingBlock(att.TensorParallelTransformerBlock):
    def __init__(self, dense, group=None):
        super().__init__(dense, group)
        print(f"built on rank {torch.distributed.get_rank()}")


def test_ring_model_of_the_prediction_grows_with_n():
    from distlab.labs import tp_scaling as ts
    one = ts.reference_predicted_step(1.0, 1, 1e-5, 1e9, 4, 64, 128)
    assert one == 1.0                                   # no communication on one rank
    t2 = ts.reference_predicted_step(1.0, 2, 1e-5, 1e9, 4, 64, 128)
    assert t2 == pytest.approx(0.5 + 4 * (2e-5 + 4 * 64 * 128 * 4 / 1e9))
