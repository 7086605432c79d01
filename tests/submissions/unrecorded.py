"""Traffic kept out of the record (issue 41, route 3): a solution cell that moves the exercise's
data with a ``ProcessGroup``'s own method, which ``torch.distributed``'s recorded functions never
see, and adds communication that looks right for the record. The values are right and the record
is a ring's; only the bytes the kernel counted leaving each rank (``distlab.checks.crossed``)
tell.

``RING_FORWARD`` is an edit of Lab 10's ``ring_forward`` cell (``submissions.edited``): after the
course's ring, a ``ring_attention`` that fetches every rank's K/V block with the default group's
``allgather`` and sends zeros around the course's ring for the record."""

LAB = "10_context_parallel"

_RING_END = ("            kv, requests = incoming, None   # a finished request still holds the block it sent\n"
             "    return out, lse")

_UNRECORDED_RING = _RING_END + '''



_ring_for_the_record = ring_attention


def ring_attention(q, k, v, positions=None, group=None):
    """Every K/V block fetched at once, unrecorded; zeros go around the ring for the record."""
    p, me = dist.get_world_size(group), dist.get_rank(group)
    kv = torch.stack([k, v])                                          # (2, b, h, s/p, d)
    blocks = [torch.empty_like(kv) for _ in range(p)]
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    pg.allgather([blocks], [kv]).wait()
    zeros = torch.zeros_like(k)
    _ring_for_the_record(torch.zeros_like(q), zeros, zeros, positions, group)
    out = lse = None
    for src, block_kv in enumerate(blocks):
        block = (block_attention(q, block_kv[0], block_kv[1]) if positions is None else
                 block_attention(q, block_kv[0], block_kv[1], positions[me], positions[src]))
        out, lse = block if out is None else merge_partials(out, lse, *block)
    return out, lse
'''

# (sample name, grade_id of the cell, old text, new text, the one test it must lose)
RING_FORWARD = ("ring_through_an_unrecorded_all_gather", "ring_forward", _RING_END,
                _UNRECORDED_RING, "test_ring_forward")
