"""The fused QKV weight of Lab 4: which rows are which head, and which rows a rank owns when
heads are sharded (rows [Q heads | K heads | V heads], each head hs rows)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from distlab.labs.tables import format_table

@dataclass(frozen=True)
class QKVLayout:
    """Row layout of a fused ((nh + 2 nkv) hs, h) QKV weight: [q0..q(nh-1) | k0.. | v0..]."""

    hidden: int
    n_heads: int
    n_kv_heads: int

    def __post_init__(self):
        if self.hidden % self.n_heads:
            raise ValueError(f"hidden={self.hidden} is not divisible by n_heads={self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.n_heads

    @property
    def rows(self) -> int:
        return (self.n_heads + 2 * self.n_kv_heads) * self.head_dim

    def heads(self) -> list[str]:
        """Names of the hs-row blocks in fused order: ["q0", ..., "k0", ..., "v0", ...]."""
        return ([f"q{i}" for i in range(self.n_heads)] + [f"k{i}" for i in range(self.n_kv_heads)]
                + [f"v{i}" for i in range(self.n_kv_heads)])

    def check_degree(self, world_size: int) -> None:
        """Each rank needs whole query heads and whole key/value heads."""
        if self.n_heads % world_size or self.n_kv_heads % world_size:
            raise ValueError(f"{self.n_heads} query heads and {self.n_kv_heads} key/value heads "
                             f"cannot be split over {world_size} ranks: both counts must be "
                             f"divisible by the tensor-parallel degree")

    def rank_heads(self, rank: int, world_size: int) -> list[str]:
        """The blocks rank `rank` owns, in its local [q | k | v] order."""
        self.check_degree(world_size)
        nq, nkv = self.n_heads // world_size, self.n_kv_heads // world_size
        return ([f"q{i}" for i in range(rank * nq, (rank + 1) * nq)]
                + [f"{kind}{i}" for kind in "kv" for i in range(rank * nkv, (rank + 1) * nkv)])

    def rank_rows(self, rank: int, world_size: int) -> torch.Tensor:
        """Indices into the fused rows of rank `rank`'s shard, in its local order."""
        where = {name: i for i, name in enumerate(self.heads())}
        hs = self.head_dim
        return torch.cat([torch.arange(where[n] * hs, (where[n] + 1) * hs)
                          for n in self.rank_heads(rank, world_size)])


def split_qkv(weight: torch.Tensor, bias: torch.Tensor | None, rank: int, world_size: int,
              n_heads: int, n_kv_heads: int):
    """Rank `rank`'s head shard of a fused QKV projection: ((nh+2nkv) hs/p, h) rows, same bias rows."""
    layout = QKVLayout(weight.shape[1], n_heads, n_kv_heads)
    rows = layout.rank_rows(rank, world_size)
    return (weight.detach()[rows].clone(),
            None if bias is None else bias.detach()[rows].clone())


def identify_heads(shard: torch.Tensor, weight: torch.Tensor, layout: QKVLayout) -> list[str]:
    """Name each hs-row block of `shard` by the dense head block it equals ("?" for none).

    The dense weight's rows are random and distinct, so equality identifies a block; this is how
    a check tells a student *which* heads they gave a rank.
    """
    hs, names = layout.head_dim, layout.heads()
    dense_blocks = weight.detach().reshape(len(names), hs, -1)          # (nh+2nkv, hs, h)
    if shard.dim() != 2 or shard.shape[1] != weight.shape[1] or shard.shape[0] % hs:
        return ["?"]
    found = []
    for block in shard.detach().reshape(-1, hs, weight.shape[1]):       # (hs, h) each
        match = [n for n, d in zip(names, dense_blocks) if torch.allclose(block, d, atol=1e-6)]
        found.append(match[0] if match else "?")
    return found


def qkv_split_table(n_heads: int = 4, n_kv_heads: int = 2, world_size: int = 2) -> list[dict]:
    """Print who owns which head under the right split (by heads) and the one-block split."""
    layout = QKVLayout(n_heads * 8, n_heads, n_kv_heads)
    names, per = layout.heads(), len(layout.heads()) // world_size
    rows = [{"rank": r, "by heads (right)": " ".join(layout.rank_heads(r, world_size)),
             "one block of rows (wrong)": " ".join(names[r * per:(r + 1) * per])}
            for r in range(world_size)]
    print(f"fused rows: {' '.join(names)}   (each name = head_dim rows)")
    print(format_table(rows))
    return rows

