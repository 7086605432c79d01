"""Submissions that copy, for the similarity report (distlab/grading/similarity.py).

- ``course_copier``: Lab 1 with the alpha-beta fit copied from the shipped package's
  ``distlab.labs.collectives.reference_fit``, its names changed and comments removed;
- ``ann`` and ``ben``: Lab 1 with the same ring all-reduce, written their own way (not the
  course's), ``ben``'s a disguised copy of ``ann``'s;
- ``moe_copier``: Lab 9's dispatch cell with the course's ``plan_dispatch`` copied, disguised,
  after the cell's other definition (so the cell's numbering of names is shifted);
- ``source_runner``: Lab 9's dispatch cell running the course's ``plan_dispatch`` from its source
  text, fetched at run time (no copy in the cell: only the dynamic code tells).

Every other answer in them is the course's solution, which the report treats as common ground, so
exactly these answers must be flagged. The disguise is done by code (``disguise``), as a
student would do it by hand: every name the code binds renamed, docstrings and comments dropped,
the layout redone.
"""
from __future__ import annotations

import ast
import builtins
import inspect
import textwrap

import nbformat

from . import replace_cell, solved

LAB = "01_collectives"
LAB9 = "09_expert_parallel"

# A ring all-reduce unlike the course's (which uses isend and tensor_split): slices of one flat
# buffer and blocking send/recv ordered by rank parity. Written for the similarity report: these
# samples are not graded.
OWN_RING = '''\
def ring_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """Reduce-scatter then all-gather around the ring, one slice of the buffer per step."""
    world, me = dist.get_world_size(), dist.get_rank()
    flat = tensor.flatten().clone()
    bounds = [len(flat) * k // world for k in range(world + 1)]

    def piece(k):
        k %= world
        return flat[bounds[k]:bounds[k + 1]]

    def exchange(outgoing, incoming):
        # even ranks send first and odd ranks receive first, so two neighbours never both wait
        if me % 2 == 0:
            dist.send(outgoing.contiguous(), (me + 1) % world)
            dist.recv(incoming, (me - 1) % world)
        else:
            dist.recv(incoming, (me - 1) % world)
            dist.send(outgoing.contiguous(), (me + 1) % world)

    for i in range(world - 1):                 # after step i, slice me-i-1 holds i+2 ranks' sum
        buffer = torch.zeros_like(piece(me - i - 1))
        exchange(piece(me - i), buffer)
        piece(me - i - 1).add_(buffer)
    for i in range(world - 1):                 # pass the finished slices around
        buffer = torch.zeros_like(piece(me - i))
        exchange(piece(me + 1 - i), buffer)
        piece(me - i).copy_(buffer)
    return flat.view_as(tensor)
'''


class _Rename(ast.NodeTransformer):
    def __init__(self, names: dict[str, str]):
        self.names = names

    def visit_Name(self, node):
        node.id = self.names.get(node.id, node.id)
        return node

    def visit_arg(self, node):
        node.arg = self.names.get(node.arg, node.arg)
        return node

    def visit_FunctionDef(self, node):
        node.name = self.names.get(node.name, node.name)
        first = node.body[0]
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                and isinstance(first.value.value, str):
            node.body = node.body[1:] or [ast.Pass()]     # the docstring goes
        self.generic_visit(node)
        return node


def disguise(source: str, rename: dict[str, str] | None = None) -> str:
    """``source`` as a copier hands it in: ``rename`` applied (e.g. the function's name to the
    exercise's), every other name it binds changed, docstrings and comments gone, layout redone
    (``ast.unparse``)."""
    tree = ast.parse(textwrap.dedent(source))
    bound = sorted({n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
                    and isinstance(n.ctx, ast.Store)}
                   | {a.arg for a in ast.walk(tree) if isinstance(a, ast.arg)}
                   | {f.name for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)})
    names = {name: f"my_{name[:3]}{i}" for i, name in enumerate(bound)
             if not hasattr(builtins, name)}
    names.update(rename or {})
    return ast.unparse(_Rename(names).visit(tree)) + "\n"


def copied_fit() -> str:
    """The alpha-beta cell answered with the course's ``reference_fit``, disguised."""
    from distlab.labs.collectives import reference_fit

    fit = disguise(inspect.getsource(reference_fit), {"reference_fit": "fit_alpha_beta"})
    predict = "def predict_time(alpha, bandwidth, nbytes):\n    return alpha + nbytes / bandwidth\n"
    return "import math\n\n" + fit + "\n\n" + predict


def _dispatch_cell(before: str = "") -> str:
    """Lab 9's dispatch cell with ``before`` it and only the solution's ``dispatch`` after."""
    cell = next(c.source for c in solved(LAB9).cells
                if c.metadata.get("nbgrader", {}).get("grade_id") == "dispatch")
    return before + cell[cell.index("def dispatch("):].rstrip() + "\n\n\n"


def copied_plan() -> str:
    """The dispatch cell with the course's ``plan_dispatch`` disguised after ``dispatch`` (whose
    names would shift a whole-cell numbering)."""
    from distlab.labs.experts.parallel import plan_dispatch

    return _dispatch_cell() + disguise(inspect.getsource(plan_dispatch),
                                       {"plan_dispatch": "plan_dispatch"})


# The course's plan_dispatch, run from its source text.
RUN_SOURCE = """\
import inspect
from distlab.labs.experts import parallel
exec(inspect.getsource(parallel.plan_dispatch))

"""


def copy_samples() -> dict[tuple[str, str], nbformat.NotebookNode]:
    """{(student, lab): notebook}: the copiers of the course and the two students who share."""
    return {
        ("course_copier", LAB): replace_cell(solved(LAB), "alpha_beta", copied_fit()),
        ("ann", LAB): replace_cell(solved(LAB), "ring_all_reduce", OWN_RING),
        ("ben", LAB): replace_cell(solved(LAB), "ring_all_reduce",
                                   disguise(OWN_RING, {"ring_all_reduce": "ring_all_reduce"})),
        ("moe_copier", LAB9): replace_cell(solved(LAB9), "dispatch", copied_plan()),
        ("source_runner", LAB9): replace_cell(solved(LAB9), "dispatch", _dispatch_cell(RUN_SOURCE)),
    }


def _course(fn) -> str:
    return f"course: {fn.__module__}:{fn.__qualname__}"


def expected_flags() -> set[tuple[str, str, str]]:
    """The copies the report must find in them: (student, cell, the other side)."""
    from distlab.labs.collectives import reference_fit
    from distlab.labs.experts.parallel import plan_dispatch

    return {("course_copier", "alpha_beta", _course(reference_fit)),
            ("ann", "ring_all_reduce", "ben"),
            ("moe_copier", "dispatch", _course(plan_dispatch))}


# The answers the report must list for their dynamic code: {(student, cell): the detail}.
EXPECTED_DYNAMIC = {("source_runner", "dispatch"):
                    "line 1: import inspect; line 3: exec(...); line 3: inspect.getsource"}
