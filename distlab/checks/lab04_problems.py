"""Lab 4's problems: inputs drawn from a seed and the dense single-process results every check
compares with (the stored set for visible tests, a fresh one for hidden tests)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from distlab.checks.common import dense_run
from distlab.labs import attention as att

LAB = "04_tensor_parallel_attention"
SHAPE = dict(batch=2, seq=8, hidden=32, n_heads=4, n_kv_heads=2, ffn=64)
VOCAB_SHAPE = dict(batch=2, seq=8, vocab=64)
MAX_OFFSET = 150.0   # per-token logit offsets: exp overflows float32 above ~88.7


def attention_problem(kind: str, seed: int, batch: int, seq: int, hidden: int = 0, n_heads: int = 0,
            n_kv_heads: int = 0, ffn: int = 0, vocab: int = 0) -> dict:
    """"attention" / "block": x, dy (b, s, h), the dense module's y, dx, param.*, grad.*, and the
    head counts as 0-d tensors. "vocab": logits (b, s, V), target (b, s), loss and dlogits."""
    g = torch.Generator().manual_seed(seed)
    if kind == "vocab":
        logits = torch.randn(batch, seq, vocab, generator=g) * 3                      # (b, s, V)
        offset = MAX_OFFSET * torch.rand(batch, seq, 1, generator=g)                   # (b, s, 1)
        offset[0, 0] = MAX_OFFSET       # at least one token overflows a naive exp
        logits = logits + offset
        target = torch.randint(0, vocab, (batch, seq), generator=g)                   # (b, s)
        z = logits.clone().requires_grad_(True)
        loss = F.cross_entropy(z.reshape(-1, vocab), target.reshape(-1))              # (N, V) rows
        loss.backward()
        return {"seed": seed, "logits": logits, "target": target, "loss": loss.detach(),
                "dlogits": z.grad}
    x = torch.randn(batch, seq, hidden, generator=g)                                   # (b, s, h)
    dy = torch.randn(batch, seq, hidden, generator=g)                                  # (b, s, h)
    model = att.dense_transformer(kind, seed, hidden, n_heads, n_kv_heads, ffn)
    return {"seed": seed, "x": x, "dy": dy, "n_heads": torch.tensor(n_heads),
            "n_kv_heads": torch.tensor(n_kv_heads), **dense_run(model, x, dy)}



def attention_case(kind: str, seed, world_size: int, shape: dict) -> tuple[dict, str]:
    """(problem, description): the stored set when seed is None, else a fresh one."""
    default = VOCAB_SHAPE if kind == "vocab" else SHAPE
    if seed is None:
        if world_size != 2 or any(shape.get(k) != v for k, v in default.items()):
            raise ValueError("stored references are for 2 ranks and the default shapes; "
                             "pass a seed to check other world sizes or shapes")
        from distlab.checks.stored import load
        return marked_attention_problem(load(LAB, kind)), "the stored inputs (2 ranks)"
    sizes = " ".join(f"{k}={v}" for k, v in shape.items() if not (kind == "attention" and k == "ffn"))
    return marked_attention_problem(attention_problem(kind, seed, **shape)), f"fresh inputs (seed {seed}, {world_size} ranks, {sizes})"


def qkv_layout_of(ref: dict) -> att.QKVLayout:
    return att.QKVLayout(ref["x"].shape[-1], int(ref["n_heads"]), int(ref["n_kv_heads"]))


def dense_module_of(kind: str, ref: dict):
    """The dense module of a reference set, weights loaded (identical on every rank)."""
    hidden, layout = ref["x"].shape[-1], qkv_layout_of(ref)
    ffn = ref["param.mlp.fc1.weight"].shape[0] if kind == "block" else 0
    model = att.dense_transformer(kind, 0, hidden, layout.n_heads, layout.n_kv_heads, ffn)
    model.load_state_dict({k[len("param."):]: v for k, v in ref.items() if k.startswith("param.")})
    return model


def marked_attention_problem(problem: dict) -> dict:
    """``problem`` with its expected results (the dense y, dx, grad.*; the loss and dlogits)
    marked (``distlab.runtime.per_rank.reference``): they stay in the judge."""
    from distlab.runtime.per_rank import reference
    expected = lambda k: k in ("y", "dx", "loss", "dlogits") or k.startswith("grad.")  # noqa: E731
    return {k: reference(v) if expected(k) else v for k, v in problem.items()}


# ---------------------------------------------------------------------------------------------
# What a rank may read of the dense module: its own heads, rows and columns; NaN elsewhere

_QUIET_NAN = 0x7FC00000            # float32 bits of a quiet NaN; the low 22 bits are free


def coded_nan_outside(t: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``t`` (float32) with the rows ``rows`` kept and every other element a NaN whose payload is
    its flat index + 1: arithmetic on it gives NaN, and a shard cut from it (a copy) still says
    which rows it took, so a wrong split of the heads can be named (``decoded``)."""
    codes = torch.arange(1, t.numel() + 1, dtype=torch.int32) | _QUIET_NAN
    blind = codes.view(torch.float32).reshape(t.shape).clone()
    blind[rows] = t.detach()[rows]
    return blind


def decoded(shard: torch.Tensor, full: torch.Tensor) -> torch.Tensor:
    """``shard`` with each coded NaN replaced by the element of ``full`` it stands for."""
    if shard.dtype != torch.float32:
        return shard
    bits = shard.detach().contiguous().view(torch.int32)
    code = bits & 0x3FFFFF
    coded = (torch.isnan(shard) & ((bits & _QUIET_NAN) == _QUIET_NAN) & (code > 0)
             & (code <= full.numel()))
    out = shard.detach().clone()
    out[coded] = full.detach().reshape(-1)[(code[coded] - 1).long()]
    return out


def blinded_modules(kind: str, ref: dict, how: dict, world_size: int) -> list:
    """For each rank, the dense module of ``ref`` with what its shard must not read NaN: ``how``
    maps a dense parameter's name to "heads" (the rank's head rows of the fused QKV), 0 or 1
    (its block of rows or columns) or None (replicated, whole)."""
    from distlab.runtime.per_rank import nan_module_outside
    dense, layout = dense_module_of(kind, ref), qkv_layout_of(ref)
    params = dict(dense.named_parameters())
    out = []
    for r in range(world_size):
        rows = layout.rank_rows(r, world_size)
        keep = {}
        for name, h in how.items():
            if h in (0, 1):
                n = params[name].shape[h] // world_size
                keep[name] = (slice(None),) * h + (slice(r * n, (r + 1) * n),)
            elif h == "heads" and name.endswith("bias"):
                keep[name] = rows
        module = nan_module_outside(dense, keep)
        with torch.no_grad():
            for name, h in how.items():
                if h == "heads" and name.endswith("weight"):
                    module.get_parameter(name).copy_(coded_nan_outside(params[name], rows))
        out.append(module)
    return out
