"""Answers looked up instead of computed (issue 41, route 1): code a student could put in a
solution cell that walks the stack from inside its own function to the rank body's locals, and
uses what it finds there: the expected results (a ``problem`` holding Lab 10's out, lse, dq, dk,
dv) or every rank's inputs (Lab 9's whole batch). Each keeps the communication of the course's
solution for the record, then answers with what it found, or zeros when it finds nothing.

``STEAL`` is the search; the attacks are exec'd into a solution namespace
(``distlab.course.solutions.solution_namespace``), which ships them to the ranks by value."""

STEAL = '''
import sys as _sys
import torch as _torch


def _frames():
    """Every frame above this one, reached the way an attack without sys._getframe would: raise,
    catch, and walk the traceback's frame back to the bottom of the stack."""
    try:
        raise RuntimeError
    except RuntimeError as err:
        frame = err.__traceback__.tb_frame
    while frame is not None:
        yield frame
        frame = frame.f_back


def _values(frame):
    """The frame's locals, with lists, tuples and dicts opened one level."""
    for value in frame.f_locals.values():
        yield value
        if isinstance(value, (list, tuple)):
            yield from value
        elif isinstance(value, dict):
            yield from value.values()


def steal_problem(*keys):
    """A dict of the rank body's locals that holds every one of ``keys``, else None."""
    for frame in _frames():
        for value in _values(frame):
            if isinstance(value, dict) and all(k in value for k in keys):
                return value
    return None


def steal_rows(rows, mine):
    """A tensor of ``rows`` rows (every rank's) whose first rows are not ``mine`` but which
    holds ``mine`` somewhere: the whole batch, else None."""
    for frame in _frames():
        for value in _values(frame):
            if isinstance(value, _torch.Tensor) and value.dim() == mine.dim() \\
                    and value.shape[0] == rows and value.shape[1:] == mine.shape[1:]:
                return value
    return None
'''

RING_FORWARD = STEAL + '''
_honest_forward = ring_attention


def ring_attention(q, k, v, positions, group):
    out, lse = _honest_forward(q, k, v, positions, group)      # the ring, for the record
    problem = steal_problem("full.out", "causal.out", "full.lse", "causal.lse")
    if problem is None:
        return _torch.zeros_like(out), _torch.zeros_like(lse)
    tag = "full" if positions is None else "causal"
    p, me = dist.get_world_size(group), dist.get_rank(group)
    mine = (positions if positions is not None else _torch.arange(q.shape[2] * p).view(p, -1))[me]
    return problem[f"{tag}.out"][:, :, mine].clone(), problem[f"{tag}.lse"][:, :, mine].clone()
'''

RING_BACKWARD = STEAL + '''
_honest_backward = ring_attention_backward


def ring_attention_backward(dout, q, k, v, out, lse, positions, group):
    grads = _honest_backward(dout, q, k, v, out, lse, positions, group)   # for the record
    problem = steal_problem("full.dq", "full.dk", "full.dv")
    if problem is None:
        return tuple(_torch.zeros_like(g) for g in grads)
    tag = "full" if positions is None else "causal"
    p, me = dist.get_world_size(group), dist.get_rank(group)
    mine = (positions if positions is not None else _torch.arange(q.shape[2] * p).view(p, -1))[me]
    return tuple(problem[f"{tag}.d{n}"][:, :, mine].clone() for n in "qkv")
'''

DISPATCH = STEAL + '''
_honest_dispatch = dispatch


def dispatch(x, expert_idx, num_experts, group):
    """The record of the honest dispatch, the rows computed from every rank's inputs found on
    the stack (no token travels): zeros when they are not there."""
    recv, plan = _honest_dispatch(x, expert_idx, num_experts, group)
    p, me = dist.get_world_size(group), dist.get_rank(group)
    every_x = steal_rows(p * x.shape[0], x)
    every_idx = steal_rows(p * x.shape[0], expert_idx)
    if every_x is None or every_idx is None:
        return _torch.zeros_like(recv), plan
    per, k, rows = num_experts // p, expert_idx.shape[1], []
    for src_x, src_idx in zip(every_x.chunk(p), every_idx.chunk(p)):
        flat = src_idx.reshape(-1)
        for e in range(me * per, (me + 1) * per):
            rows.append(src_x[(flat == e).nonzero().squeeze(1) // k])
    return _torch.cat(rows), plan
'''


def attacked(namespace: dict, *attacks: str) -> dict:
    """``namespace`` (a solution's) with ``attacks`` run in it: their functions replace the
    solution's of the same name."""
    for code in attacks:
        exec(compile(code, "<attack>", "exec"), namespace)
    return namespace
