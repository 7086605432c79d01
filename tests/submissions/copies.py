"""Submissions that copy, for the similarity report (distlab/grading/similarity.py).

- ``course_copier``: Lab 1 with the alpha-beta fit copied from the shipped package's
  ``distlab.labs.collectives.reference_fit``, its names changed and comments removed;
- ``ann`` and ``ben``: Lab 1 with the same ring all-reduce, written their own way (not the
  course's), ``ben``'s a disguised copy of ``ann``'s;
- ``moe_copier``: Lab 9's dispatch cell with the course's ``plan_dispatch`` copied, disguised,
  after the cell's other definition (so the cell's numbering of names is shifted);
- ``source_runner``: Lab 9's dispatch cell running the course's ``plan_dispatch`` from its source
  text, fetched at run time (no copy in the cell: only the dynamic code tells);
- ``leaker``: Lab 1 with last year's solution disguised (the ring all-reduce and the alpha-beta
  cell), every other cell as handed out;
- ``impl_copier``: Lab 9's MoE cell with the package's ``AllToAll`` disguised, a course
  implementation that the course's solution also contains;
- ``alias_runner``: Lab 1's ring cell reaching ``exec`` through ``print.__self__`` and walking
  the stack from a traceback (the route of issue 41);
- ``rewriter``: Lab 1's two all-reduce exercises written another way than the course's (whole
  tensors passed around the ring; list collectives), every other cell as handed out: honest work
  that must raise no flag at all.

Every other answer in them is the course's solution, so those answers are flagged as the
``course solution`` (above its size floor) and nothing else; the copies above are flagged as
``expected_flags`` says. The disguise is done by code (``disguise``), as a student would do it by
hand: every name the code binds renamed, docstrings and comments dropped, the layout redone.
"""
from __future__ import annotations

import ast
import builtins
import inspect
import textwrap

import nbformat

from . import replace_cell, solved, student

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

# Lab 1's two all-reduce exercises written unlike the course's solution (which slices one flat
# buffer with tensor_split and overlaps isend with recv): the whole tensor passed around the ring,
# blocking send/recv ordered by rank parity; and list collectives on padded equal chunks.
OTHER_RING = '''\
def ring_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """Pass the whole tensor n-1 times around the ring, adding what arrives."""
    world, rank = dist.get_world_size(), dist.get_rank()
    total = tensor.clone()
    message = tensor.clone()
    for _ in range(world - 1):
        received = torch.zeros_like(message)
        if rank % 2 == 0:                      # even ranks send first: no two wait on each other
            dist.send(message, (rank + 1) % world)
            dist.recv(received, (rank - 1) % world)
        else:
            dist.recv(received, (rank - 1) % world)
            dist.send(message, (rank + 1) % world)
        total += received
        message = received
    return total
'''

OTHER_RS_AG = '''\
def all_reduce_rs_ag(tensor: torch.Tensor) -> torch.Tensor:
    """Reduce-scatter into equal chunks, then all-gather them back."""
    world = dist.get_world_size()
    numel = tensor.numel()
    chunk = -(-numel // world)                               # ceil(numel / world)
    buffer = torch.zeros(chunk * world, dtype=tensor.dtype)
    buffer[:numel] = tensor.flatten()
    mine = torch.empty(chunk, dtype=tensor.dtype)
    dist.reduce_scatter(mine, list(buffer.split(chunk)))
    gathered = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine)
    return torch.cat(gathered)[:numel].view_as(tensor)
'''

# The ring cell with exec reached through a builtin function's module, run on a course source
# found by walking up from a traceback to a caller's globals.
ALIAS_RUN = """\
def ring_all_reduce(tensor):
    try:
        raise RuntimeError
    except RuntimeError as error:
        frame = error.__traceback__.tb_frame.f_back
    run = getattr(print.__self__, "exec")
    run(frame.f_globals["source"], frame.f_globals)
    return frame.f_locals["expected"]
"""


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


def _course_cell(lab: str, grade_id: str) -> str:
    return next(c.source for c in solved(lab).cells
                if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


def leaked(lab: str, grade_ids: tuple[str, ...]) -> nbformat.NotebookNode:
    """The student notebook with the course's solution of ``grade_ids`` disguised."""
    nb = student(lab)
    for gid in grade_ids:
        cell = _course_cell(lab, gid)
        exercises = {n.name: n.name for n in ast.parse(cell).body       # the graded names stay
                     if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        nb = replace_cell(nb, gid, disguise(cell, exercises))
    return nb


def copied_all_to_all() -> str:
    """Lab 9's MoE cell answered with the package's ``AllToAll`` disguised, then the solution's
    own ``moe_forward``."""
    from distlab.labs.experts.parallel import AllToAll

    cell = _course_cell(LAB9, "moe_forward")
    # an autograd Function's methods keep their names: torch calls them by name
    names = {"forward": "forward", "backward": "backward"}
    return disguise(inspect.getsource(AllToAll), names) + "\n\n" + \
        cell[cell.index("def moe_forward("):]


def rewritten() -> nbformat.NotebookNode:
    nb = replace_cell(student(LAB), "ring_all_reduce", OTHER_RING)
    return replace_cell(nb, "all_reduce_rs_ag", OTHER_RS_AG)


LEAKED = ("ring_all_reduce", "alpha_beta")


def copy_samples() -> dict[tuple[str, str], nbformat.NotebookNode]:
    """{(student, lab): notebook}: the copiers of the course, the two students who share, the
    one who runs code by aliases, and the honest one who wrote the ring their own way."""
    return {
        ("leaker", LAB): leaked(LAB, LEAKED),
        ("impl_copier", LAB9): replace_cell(solved(LAB9), "moe_forward", copied_all_to_all()),
        ("alias_runner", LAB): replace_cell(student(LAB), "ring_all_reduce", ALIAS_RUN),
        ("rewriter", LAB): rewritten(),
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
EXPECTED_DYNAMIC = {
    ("source_runner", "dispatch"):
        "line 1: import inspect; line 3: exec(...); line 3: inspect.getsource",
    ("alias_runner", "ring_all_reduce"):
        "line 5: .__traceback__; line 5: .f_back; line 5: .tb_frame; line 6: 'exec'; "
        "line 6: .__self__; line 6: exec via print.__self__; line 7: .f_globals; "
        "line 7: frame (bound to .f_back); line 7: run (bound to exec via print.__self__); "
        "line 8: .f_locals; line 8: frame (bound to .f_back)"}


def expected_solution_flags() -> set[tuple[str, str, str]]:
    """The disguised copies of the course's solution: (student, cell, where)."""
    return {("leaker", "ring_all_reduce", "the whole cell"),
            ("leaker", "alpha_beta", "the whole cell"),
            ("impl_copier", "moe_forward", "line 1: AllToAll")}
