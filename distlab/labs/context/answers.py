"""The course's answers to Lab 10's exercises (withheld from the handout: see
``distlab.checks.lab10.COURSE_CODE``). The same code as the lab's solution cells.

Shapes: q, k, v, out (b, h, s/p, d) on each rank, lse (b, h, s/p); ``positions`` (p, s/p) holds in
row r the global positions of the tokens rank r holds (None: not causal).

- ``merge_partials``: two blocks' (out, lse) into one, the online softmax (Milakov & Gimelshein
  2018; FlashAttention, Dao et al. 2022, §3.1).
- ``ring_attention`` / ``ring_attention_backward``: Ring Attention (Liu et al., arXiv 2310.01889):
  K/V travel to the right neighbour, the next block in flight while the current one computes; in
  the backward dK/dV travel with them and come home.
- ``causal_layout``: a split of the sequence whose ring critical path (``layout.critical_path``)
  is short.
- ``ulysses_attention``: DeepSpeed-Ulysses (arXiv 2309.14509 §3): all-to-all from sequence shards to
  head shards, attention on h/p heads over the whole sequence, all-to-all back.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from distlab.labs.context.dense import block_attention, causal_mask


def merge_partials(out_a, lse_a, out_b, lse_b):
    """Attention over the union of two disjoint key blocks from each block's (out, lse)."""
    top = torch.maximum(lse_a, lse_b)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))   # both blocks masked
    w_a, w_b = torch.exp(lse_a - top), torch.exp(lse_b - top)           # (b, h, s_q), in [0, 1]
    total = w_a + w_b
    lse = top + torch.log(total)                                         # -inf where total = 0
    total = torch.where(total > 0, total, torch.ones_like(total))
    out = (w_a[..., None] * out_a + w_b[..., None] * out_b) / total[..., None]
    return out, lse


def _neighbours(group):
    """(p, my rank in the group, global rank of the right neighbour, of the left one)."""
    p, me = dist.get_world_size(group), dist.get_rank(group)
    glob = (lambda r: r) if group is None else (lambda r: dist.get_global_rank(group, r))
    return p, me, glob((me + 1) % p), glob((me - 1) % p)


def exchange(tensor, right, left, group=None):
    """Start sending ``tensor`` to ``right`` and receiving as much from ``left``: (buffer, works)."""
    received = torch.empty_like(tensor)
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, tensor, right, group),
                                    dist.P2POp(dist.irecv, received, left, group)])
    return received, works


def _wait(works):
    for work in works:
        work.wait()


def ring_attention(q, k, v, positions=None, group=None):
    """This rank's (out, lse) of attention of its queries over every rank's keys."""
    p, me, right, left = _neighbours(group)
    q_pos = None if positions is None else positions[me]
    kv = torch.stack([k, v])                                    # (2, b, h, s/p, d)
    out = lse = None
    for step in range(p):
        if step < p - 1:
            incoming, works = exchange(kv, right, left, group)  # next block in flight
        k_pos = None if positions is None else positions[(me - step) % p]
        part = block_attention(q, kv[0], kv[1], q_pos, k_pos)
        out, lse = part if out is None else merge_partials(out, lse, *part)
        if step < p - 1:
            _wait(works)
            kv, works = incoming, None   # a finished request still holds the block it sent
    return out, lse


def block_grads(dout, q, k, v, lse, delta, q_pos=None, k_pos=None):
    """(dq, dk, dv) of one key block: this block's share of the attention's gradients, given the
    whole row's lse and ``delta`` (one number per query row, the same for every block)."""
    scale = 1 / math.sqrt(q.shape[-1])
    scores = q @ k.transpose(-2, -1) * scale                       # (b, h, s_q, s_k)
    if q_pos is not None and k_pos is not None:
        scores = scores.masked_fill(~causal_mask(q_pos, k_pos), float("-inf"))
    safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    probs = torch.exp(scores - safe[..., None])                    # 0 where masked
    dprobs = dout @ v.transpose(-2, -1)                            # (b, h, s_q, s_k)
    dscores = probs * (dprobs - delta[..., None]) * scale
    return dscores @ k, dscores.transpose(-2, -1) @ q, probs.transpose(-2, -1) @ dout


def ring_attention_backward(dout, q, k, v, out, lse, positions=None, group=None):
    """(dq, dk, dv) of this rank's chunk of the sequence, equal to full attention's gradients
    there, each on the rank that holds that chunk."""
    p, me, right, left = _neighbours(group)
    q_pos = None if positions is None else positions[me]
    delta = (dout * out).sum(-1)                                   # (b, h, s/p)
    kv = torch.stack([k, v])                                       # (2, b, h, s/p, d)
    dkv = torch.zeros_like(kv)
    dq = torch.zeros_like(q)
    for step in range(p):
        if step < p - 1:
            incoming, works = exchange(kv, right, left, group)     # K/V in flight
        k_pos = None if positions is None else positions[(me - step) % p]
        dq_part, dk_part, dv_part = block_grads(dout, q, kv[0], kv[1], lse, delta, q_pos, k_pos)
        dq = dq + dq_part
        dkv, dworks = exchange(dkv + torch.stack([dk_part, dv_part]), right, left, group)
        _wait(dworks)
        if step < p - 1:
            _wait(works)
            kv = incoming
    return dq, dkv[0], dkv[1]


def causal_layout(seq_len, world_size):
    """positions (p, s/p): every position once, with a short ring critical path."""
    if seq_len % (2 * world_size):
        raise ValueError(f"seq_len={seq_len} must be divisible by 2·world_size = {2 * world_size}")
    chunks = torch.arange(seq_len).view(2 * world_size, -1)       # (2p, s/2p)
    return torch.stack([torch.cat([chunks[r], chunks[2 * world_size - 1 - r]])
                        for r in range(world_size)])


def _all_to_all(x, scatter_dim, gather_dim, group):
    """Split x along scatter_dim into p pieces, send piece j to rank j, concatenate what comes
    back along gather_dim."""
    p = dist.get_world_size(group)
    send = [t.contiguous() for t in x.chunk(p, dim=scatter_dim)]
    recv = [torch.empty_like(t) for t in send]
    dist.all_to_all(recv, send, group=group)
    return torch.cat(recv, dim=gather_dim)


def ulysses_attention(q, k, v, group=None, causal=False):
    """(b, h, s/p, d) in and out: this rank's chunk of full attention's output; ValueError
    where the heads cannot be split over the ranks."""
    p, me = dist.get_world_size(group), dist.get_rank(group)
    heads = q.shape[1]
    if heads % p:
        raise ValueError(f"ulysses_attention on rank {me}: {heads} heads cannot be split over "
                         f"{p} ranks; Ulysses needs the number of heads divisible by the "
                         f"sequence-parallel degree (use a degree that divides {heads}, or ring "
                         f"attention).")
    qkv = _all_to_all(torch.stack([q, k, v]), 2, 3, group)         # (3, b, h/p, s, d)
    pos = torch.arange(qkv.shape[3]) if causal else None
    out, _ = block_attention(qkv[0], qkv[1], qkv[2], pos, pos)      # (b, h/p, s, d)
    return _all_to_all(out, 2, 1, group)                           # (b, h, s/p, d)
