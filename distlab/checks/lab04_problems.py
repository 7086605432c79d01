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
        return load(LAB, kind), "the stored inputs (2 ranks)"
    sizes = " ".join(f"{k}={v}" for k, v in shape.items() if not (kind == "attention" and k == "ffn"))
    return attention_problem(kind, seed, **shape), f"fresh inputs (seed {seed}, {world_size} ranks, {sizes})"


def qkv_layout_of(ref: dict) -> att.QKVLayout:
    return att.QKVLayout(ref["x"].shape[-1], int(ref["n_heads"]), int(ref["n_kv_heads"]))


def dense_module_of(kind: str, ref: dict):
    """The dense module of a reference set, weights loaded (identical on every rank)."""
    hidden, layout = ref["x"].shape[-1], qkv_layout_of(ref)
    ffn = ref["param.mlp.fc1.weight"].shape[0] if kind == "block" else 0
    model = att.dense_transformer(kind, 0, hidden, layout.n_heads, layout.n_kv_heads, ffn)
    model.load_state_dict({k[len("param."):]: v for k, v in ref.items() if k.startswith("param.")})
    return model
