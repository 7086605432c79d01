"""distlab.grading.similarity: copies are flagged through renaming, reformatting and removed
comments; honest answers, short formulas and untouched cells are not."""
from __future__ import annotations

import inspect
import textwrap

from distlab.grading.similarity import MIN_TOKENS, compare_cell, normalise, threshold
from distlab.labs.collectives import reference_fit

RING = '''
def ring_all_reduce(tensor):
    """Sum over ranks by a ring."""
    n, r = dist.get_world_size(), dist.get_rank()
    out = tensor.reshape(-1).clone()                            # (N,)
    chunks = list(torch.tensor_split(out, n))
    right, left = (r + 1) % n, (r - 1) % n
    for step in range(n - 1):                                   # reduce-scatter
        send_c, recv_c = (r - step) % n, (r - step - 1) % n
        incoming = torch.empty_like(chunks[recv_c])
        work = dist.isend(chunks[send_c].contiguous(), right)
        dist.recv(incoming, left)
        work.wait()
        chunks[recv_c] += incoming
    for step in range(n - 1):                                   # all-gather
        send_c, recv_c = (r + 1 - step) % n, (r - step) % n
        incoming = torch.empty_like(chunks[recv_c])
        work = dist.isend(chunks[send_c].contiguous(), right)
        dist.recv(incoming, left)
        work.wait()
        chunks[recv_c].copy_(incoming)
    return out.reshape(tensor.shape)
'''

# The same code as another student would disguise it: new names, no comments, other layout.
RING_DISGUISED = '''
def ring_all_reduce(t):
    size, me = (dist.get_world_size(),
                dist.get_rank())
    flat = t.reshape(-1).clone()
    pieces = list(torch.tensor_split(flat, size))
    nxt, prv = (me + 1) % size, (me - 1) % size
    for i in range(size - 1):
        a, b = (me - i) % size, (me - i - 1) % size
        buf = torch.empty_like(pieces[b])
        req = dist.isend(pieces[a].contiguous(), nxt)
        dist.recv(buf, prv)
        req.wait()
        pieces[b] += buf
    for i in range(size - 1):
        a, b = (me + 1 - i) % size, (me - i) % size
        buf = torch.empty_like(pieces[b])
        req = dist.isend(pieces[a].contiguous(), nxt)
        dist.recv(buf, prv)
        req.wait()
        pieces[b].copy_(buf)
    return flat.reshape(t.shape)
'''

# An honest, different answer to the same exercise: whole-tensor passes around the ring.
RING_OTHER = '''
def ring_all_reduce(tensor):
    world, rank = dist.get_world_size(), dist.get_rank()
    total = tensor.clone()
    message = tensor.clone()
    for _ in range(world - 1):
        received = torch.zeros_like(message)
        if rank % 2 == 0:
            dist.send(message, (rank + 1) % world)
            dist.recv(received, (rank - 1) % world)
        else:
            dist.recv(received, (rank - 1) % world)
            dist.send(message, (rank + 1) % world)
        total += received
        message = received
    return total
'''

HANDED_OUT = '''
def ring_all_reduce(tensor):
    """Sum over ranks by a ring."""
    raise NotImplementedError("your code here")
'''


def test_renaming_layout_and_comments_change_nothing():
    assert normalise(RING) == normalise(RING_DISGUISED)
    assert normalise(RING) != normalise(RING_OTHER)


def test_a_copy_of_a_shipped_implementation_is_flagged():
    source = inspect.getsource(reference_fit)
    disguised = textwrap.dedent(source).replace("sizes", "xs").replace("times", "ys") \
        .replace("alpha", "a0").replace("inv_bandwidth", "ib")
    disguised = "\n".join(line.split("#")[0].rstrip() for line in disguised.splitlines())
    flags = compare_cell("01_collectives", "alpha_beta", {"eve": disguised, "ann": RING_OTHER},
                         [HANDED_OUT], {"distlab.labs.collectives:reference_fit": source})
    assert [(f.student, f.kind) for f in flags] == [("eve", "course implementation")]


def test_students_copying_each_other_are_flagged():
    flags = compare_cell("01_collectives", "ring_all_reduce",
                         {"ann": RING, "bob": RING_DISGUISED, "cat": RING_OTHER,
                          "dan": HANDED_OUT}, [HANDED_OUT], {})
    assert [(f.student, f.other, f.kind) for f in flags] == [("ann", "bob", "another student")]
    assert flags[0].similarity == 1.0


def test_what_everyone_shares_with_the_course_solution_is_common_ground():
    # Both wrote the course's own solution: common ground, not copying from each other.
    flags = compare_cell("01_collectives", "ring_all_reduce", {"ann": RING, "bob": RING},
                         [HANDED_OUT, RING], {})
    assert flags == []


def test_short_answers_are_not_compared_and_short_cells_need_more():
    formula = "def busbw(algbw, n):\n    return algbw * 2 * (n - 1) / n\n"
    assert len(normalise(formula)) < MIN_TOKENS
    assert compare_cell("01_collectives", "bandwidths", {"a": formula, "b": formula},
                        [HANDED_OUT], {}) == []
    assert threshold(MIN_TOKENS) > threshold(100) > threshold(1000) == 0.8
