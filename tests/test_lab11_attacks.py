"""Lab 11 attacked as a student would, from the handout alone: each attack is an answer cell that
tries to earn a test's points without doing its exercise, run through the check as the judge runs
it (the call guard of the check's COURSE_CODE on, the answer compiled under a notebook cell's file
name, so that the guard counts it as the student's code), and must earn nothing.

An answer's test cell holds the visible call and a hidden one with the grader's seed
(solutions/11_pipeline_schedules): an attack earns nothing when either fails. Attacks that the
checks cannot stop yet are marked xfail(strict=True), the hole said in the reason."""
from __future__ import annotations

import pytest

from distlab.checks import lab11, lab11_tables
from distlab.checks.assertions import CheckFailed
from distlab.checks.course_code import guard_of
from distlab.checks.ranks import SubmittedError
from distlab.course import solutions
from distlab.runtime.call_guard import guarding

LAB = "11_pipeline_schedules"
CELL = "<ipython-input-7-0>"    # a notebook cell's file name, as a kernel gives it
COURSE_CODE_USED = "course's own implementation"
HIDDEN_SEEDS = (3, 11)


def answer(source: str, name: str, setup: tuple = ()) -> object:
    """The student's ``name`` as the cell ``source`` defines it (after the solution's ``setup``
    cells, whose own definitions a cell may call)."""
    ns = (solutions.solution_namespace(LAB, [], setup) if setup
          else {"__name__": "lab11_attack"})   # a module nobody imports: shipped by value
    exec(compile(source, CELL, "exec"), ns)    # noqa: S102  (the student's cell)
    return ns[name]


def judged(check, *args, **kwargs) -> str:
    """The check as the judge runs it: its ranks under its COURSE_CODE's guard."""
    with guarding(guard_of(check)):
        return check(*args, **kwargs)


def earns(check, fn, seeds=HIDDEN_SEEDS, **kwargs) -> bool:
    """Whether the test cell passes: the visible call and the hidden ones, judged."""
    try:
        judged(check, fn, **kwargs)
        for seed in seeds:
            judged(check, fn, seed=seed, **kwargs)
    except (CheckFailed, SubmittedError):
        return False
    return True


# ---------------------------------------------------------------------------------------------
# Section 2: torch's tables (the handout keeps them for the comparison cell) reached through
# course code the handout keeps, so that the guard's nearest caller is the course's

LAUNDERED_PREDICTIONS = {
    "expected_figures": "def predict_interleaved(p, m, v):\n"
                        "    from distlab.checks.lab11_tables import expected_figures\n"
                        "    return expected_figures('interleaved', p, m, v)\n",
    "torch_figures": "def predict_interleaved(p, m, v):\n"
                     "    from distlab.checks import lab11_tables\n"
                     "    return lab11_tables._torch_figures('interleaved', p, m, v)\n",
}


@pytest.mark.parametrize("route", list(LAUNDERED_PREDICTIONS))
def test_the_prediction_read_from_the_checks_own_figures_earns_nothing(route):
    """The check's figures (the formulas in the judge, torch's table replayed in a handout) are
    course code a prediction may not call, though the handout keeps them."""
    fn = answer(LAUNDERED_PREDICTIONS[route], "predict_interleaved")
    assert lab11.check_interleaved_prediction(fn)   # unguarded it passes: the guard decides
    with pytest.raises(SubmittedError, match=COURSE_CODE_USED):
        judged(lab11.check_interleaved_prediction, fn)


STORED_TABLES = {
    "course": ("zb_h1", "_own = zb_h1\n"
               "def zb_h1(p, m):\n"
               "    if (p, m) == (4, 8):   # the stored case: the course's own table\n"
               "        from distlab.labs.pipeline.on_ranks import stored_problem\n"
               "        return stored_problem()[0]['ZB-H1'][0]\n"
               "    return _own(p, m)\n"),
    "torch": ("zb_v", "_own = zb_v\n"
              "def zb_v(p, m):\n"
              "    if (p, m) == (4, 8):   # the stored case: torch's own table\n"
              "        from distlab.labs.pipeline.on_ranks import stored_torch_tables\n"
              "        return stored_torch_tables()['torch ScheduleZBVZeroBubble'][0]\n"
              "    return _own(p, m)\n"),
}


@pytest.mark.parametrize("kind", list(STORED_TABLES))
def test_a_stored_table_handed_in_earns_nothing(kind):
    """The stored tables Section 3 runs (the course's and torch's, p = 4, m = 8) handed in for the
    visible case, the student's own elsewhere: the copy is noticed."""
    name, source = STORED_TABLES[kind]
    fn = answer(source, name, ("tables_imports",))
    with pytest.raises(SubmittedError, match=COURSE_CODE_USED):
        judged(getattr(lab11, "check_" + name), fn)


def _literal_tables(kind: str) -> str:
    """An answer cell that is a dict of torch's tables, computed beforehand in a scratch cell
    (no guard there) and pasted, for the visible cases and one seed's hidden draw."""
    from distlab.labs.pipeline.torch_tables import torch_table
    # the visible cases, and the hidden ones of the seeds this test grades with (a student
    # cannot know those: the judge draws its seed): even so, the draws' other cases are missing
    cases = lab11_tables.VISIBLE[kind] + [case for case, _ in lab11_tables.hidden_cases(kind, 0)]
    known = {case: torch_table(lab11_tables.TORCH[kind], *case)[0] for case in cases}
    args = "p, m, v" if kind == "interleaved" else "p, m"
    key = "(p, m, v)" if kind == "interleaved" else "(p, m, 2)"
    return (f"KNOWN = {known!r}\n"
            f"def {lab11_tables.NAMES[kind]}({args}):\n"
            f"    return KNOWN[{key}]\n")


@pytest.mark.parametrize("kind", ["interleaved", "zb_v"])
def test_torchs_tables_pasted_for_every_listed_case_earn_nothing(kind):
    fn = answer(_literal_tables(kind), lab11_tables.NAMES[kind])
    check = getattr(lab11, "check_" + lab11_tables.NAMES[kind])
    assert not earns(check, fn)


# ---------------------------------------------------------------------------------------------
# Section 1: the split backward, torch's own (the handout shows it beside the student's)

PARAMS_FROM_GRAPH = (
    "import torch\n"
    "def _params(output, stage_input):\n"
    "    found, seen, todo = [], set(), [output.grad_fn]\n"
    "    while todo:\n"
    "        node = todo.pop()\n"
    "        if node is None or node in seen:\n"
    "            continue\n"
    "        seen.add(node)\n"
    "        leaf = getattr(node, 'variable', None)\n"
    "        if leaf is not None:\n"
    "            if leaf is not stage_input:\n"
    "                found.append(leaf)\n"
    "            continue\n"
    "        todo += [n for n, _ in node.next_functions]\n"
    "    return found\n")
TORCH_SPLITS = {
    "course's wrapper": PARAMS_FROM_GRAPH + (
        "from distlab.labs.pipeline.split_backward import torch_backward_input, "
        "torch_backward_weight\n"
        "def backward_input(output, grad_output, stage_input):\n"
        "    if not stage_input.requires_grad:   # the first stage: W does it all\n"
        "        return None, (output, grad_output)\n"
        "    got = torch_backward_input(output, grad_output, stage_input,\n"
        "                               _params(output, stage_input))\n"
        "    stage_input.grad = None   # torch's B sets it; the contract's does not\n"
        "    return got\n"
        "def backward_weight(kept, params):\n"
        "    if isinstance(kept, tuple):\n"
        "        return torch.autograd.backward(kept[0], kept[1])\n"
        "    torch_backward_weight(kept, params)\n"),
    "torch's": PARAMS_FROM_GRAPH + (
        "from torch.distributed.pipelining._backward import stage_backward_input, "
        "stage_backward_weight\n"
        "def backward_input(output, grad_output, stage_input):\n"
        "    if not stage_input.requires_grad:   # the first stage: W does it all\n"
        "        return None, (output, grad_output)\n"
        "    grads, groups = stage_backward_input(\n"
        "        [output], None if grad_output is None else [grad_output], [stage_input],\n"
        "        iter(_params(output, stage_input)))\n"
        "    stage_input.grad = None   # torch's B sets it; the contract's does not\n"
        "    return grads[0], groups\n"
        "def backward_weight(kept, params):\n"
        "    if isinstance(kept, tuple):\n"
        "        return torch.autograd.backward(kept[0], kept[1])\n"
        "    stage_backward_weight(iter(params), kept)\n"),
}


@pytest.mark.parametrize("route", list(TORCH_SPLITS))
def test_torchs_own_split_backward_handed_in_earns_nothing(route):
    """torch 2.13's stage_backward_input / stage_backward_weight (the lab measures them beside
    the student's; the course wraps them in split_backward.torch_backward_*) split the backward
    in the exercise's contract: handed in, they are a copy, not a split written."""
    ns = {"__name__": "lab11_attack"}
    exec(compile(TORCH_SPLITS[route], CELL, "exec"), ns)    # noqa: S102
    assert lab11.check_split_backward(ns["backward_input"], ns["backward_weight"])   # unguarded
    with pytest.raises(SubmittedError, match=COURSE_CODE_USED):
        judged(lab11.check_split_backward, ns["backward_input"], ns["backward_weight"])


MEASURED_PREDICTION = (
    "def predict_held_bytes(num_layers, batch, hidden, itemsize):\n"
    "    import torch\n"
    "    from distlab.labs.pipeline.model import PipeSpec, stage_layers\n"
    "    from distlab.labs.pipeline.split_backward import (held_between, keep_backward_input,\n"
    "                                                      keep_backward_weight, keep_forward)\n"
    "    dtype = {2: torch.float16, 4: torch.float32, 8: torch.float64}[itemsize]\n"
    "    stage = stage_layers(PipeSpec(num_layers=num_layers, hidden=hidden, batch=batch)\n"
    "                         .model().to(dtype), 0, 1)\n"
    "    x = torch.randn(batch, hidden, dtype=dtype, requires_grad=True)\n"
    "    dy = torch.randn(batch, hidden, dtype=dtype)\n"
    "    def b(y, g, inp):\n"
    "        (dx,) = torch.autograd.grad(y, [inp], g, retain_graph=True)\n"
    "        return dx, (y, g)\n"
    "    def w(kept, params):\n"
    "        y, g = kept\n"
    "        for p, d in zip(params, torch.autograd.grad(y, params, g)):\n"
    "            p.grad = d if p.grad is None else p.grad + d\n"
    "    return {'recompute': held_between(stage, x, dy, b, w),\n"
    "            'keep': held_between(stage, x.detach().requires_grad_(), dy,\n"
    "                                 keep_backward_input, keep_backward_weight, keep_forward)}\n")


def test_the_held_bytes_measured_instead_of_predicted_earn_nothing():
    """The prediction answered by the lab's own measurement (held_between, which the cell after
    it runs): measuring is not predicting."""
    fn = answer(MEASURED_PREDICTION, "predict_held_bytes")
    assert lab11.check_held_prediction(fn)   # unguarded it passes: the guard decides
    with pytest.raises(SubmittedError, match=COURSE_CODE_USED):
        judged(lab11.check_held_prediction, fn)


STORED_HELD = (
    "def predict_held_bytes(num_layers, batch, hidden, itemsize):\n"
    "    from distlab.checks.stored import load\n"
    "    rows = load('11_pipeline_schedules', 'split_prediction')['bytes'].tolist()\n"
    "    cases = [(2, 8, 16, 8), (1, 4, 6, 8), (4, 32, 1024, 2)]   # the check's, in the handout\n"
    "    recompute, keep = rows[cases.index((num_layers, batch, hidden, itemsize))]\n"
    "    return {'recompute': recompute, 'keep': keep}\n")


def test_the_stored_visible_bytes_read_back_lose_the_hidden_test():
    fn = answer(STORED_HELD, "predict_held_bytes")
    assert judged(lab11.check_held_prediction, fn)      # the visible values are in data/
    assert not earns(lab11.check_held_prediction, fn, seeds=HIDDEN_SEEDS[:1])


# ---------------------------------------------------------------------------------------------
# Section 3: an executor that computes nothing, its gradients read from the stored case

FORGED_EXECUTOR = (
    "import torch.distributed as dist\n"
    "def run_table(row, stages, placement, num_microbatches):\n"
    "    from distlab.checks.stored import load\n"
    "    stored = load('11_pipeline_schedules', 'executor')\n"
    "    me, last, m, works = dist.get_rank(), len(placement) - 1, num_microbatches, []\n"
    "    buf = next(iter(stages.values())).buffer\n"
    "    def tag(kind, s, i):\n"
    "        return (kind * len(placement) + s) * m + i\n"
    "    for op, i, s in row:   # the table's messages, with nothing in them\n"
    "        if op == 'F' and s < last and placement[s + 1] != me:\n"
    "            works.append(dist.isend(buf().zero_(), placement[s + 1], tag=tag(0, s + 1, i)))\n"
    "        if op == 'F' and s > 0 and placement[s - 1] != me:\n"
    "            works.append(dist.irecv(buf(), placement[s - 1], tag=tag(0, s, i)))\n"
    "        if op == 'B' and s > 0 and placement[s - 1] != me:\n"
    "            works.append(dist.isend(buf().zero_(), placement[s - 1], tag=tag(1, s - 1, i)))\n"
    "        if op == 'B' and s < last and placement[s + 1] != me:\n"
    "            works.append(dist.irecv(buf(), placement[s + 1], tag=tag(1, s, i)))\n"
    "    for work in works:\n"
    "        work.wait()\n"
    "    for s, st in stages.items():   # the stored case's gradients and loss\n"
    "        for n, p in st.layers.named_parameters():\n"
    "            p.grad = stored['grad.' + n].clone()\n"
    "        if s == last:\n"
    "            st.losses = {0: stored['loss'].clone()}\n")


def test_an_executor_forged_from_the_stored_case_loses_the_hidden_test():
    """The visible case's single-process gradients are stored (data/, readable by the ranks):
    copied into .grad with the table's messages sent empty, they pass the visible call; the hidden
    call's fresh model is nobody's stored case."""
    fn = answer(FORGED_EXECUTOR, "run_table")
    assert "run_table on the stored case" in judged(lab11.check_executor, fn)
    with pytest.raises(CheckFailed):
        judged(lab11.check_executor, fn, seed=HIDDEN_SEEDS[0], world_size=2, num_microbatches=4)


# ---------------------------------------------------------------------------------------------
# The guard itself: it runs in the rank, where the answer's own code runs

TORCH_INTERLEAVED = ("    from distlab.labs.pipeline.torch_tables import torch_table\n"
                     "    return torch_table('ScheduleInterleaved1F1B', p, m, v)[0]\n")
GUARD_OFF = {
    "sys.setprofile": ("def interleaved_1f1b(p, m, v):\n"
                       "    import sys\n"
                       "    sys.setprofile(None)\n" + TORCH_INTERLEAVED),
}
GUARD_OFF_UNLISTED = {
    "threading's sys": ("def interleaved_1f1b(p, m, v):\n"
                        "    import threading\n"
                        "    threading._sys.setprofile(None)   # sys, by another name\n"
                        + TORCH_INTERLEAVED),
    "a raw thread": ("def interleaved_1f1b(p, m, v):\n"
                     "    import _thread, time\n"
                     "    out = []\n"
                     "    def copy():\n"
                     "        from distlab.labs.pipeline.torch_tables import torch_table\n"
                     "        out.append(torch_table('ScheduleInterleaved1F1B', p, m, v)[0])\n"
                     "    _thread.start_new_thread(copy, ())   # no threading.setprofile here\n"
                     "    while not out:\n"
                     "        time.sleep(0.01)\n"
                     "    return out[0]\n"),
    "threading's hook": ("def interleaved_1f1b(p, m, v):\n"
                         "    import threading\n"
                         "    threading._profile_hook = None   # new threads start without it\n"
                         "    out = []\n"
                         "    def copy():\n"
                         "        from distlab.labs.pipeline.torch_tables import torch_table\n"
                         "        out.append(torch_table('ScheduleInterleaved1F1B', p, m, v)[0])\n"
                         "    thread = threading.Thread(target=copy)\n"
                         "    thread.start()\n"
                         "    thread.join()\n"
                         "    return out[0]\n"),
}


def _caught_or_listed(source: str) -> bool:
    """Refused by the guard, or listed for the instructor by the copy report (similarity_dynamic:
    DESIGN.md, what a student copies anyway is flagged, never silently scored)."""
    from distlab.grading.similarity_dynamic import dynamic_uses
    if dynamic_uses(source):
        return True
    fn = answer(source, "interleaved_1f1b")
    try:
        judged(lab11.check_interleaved_1f1b, fn)
    except SubmittedError as err:
        return COURSE_CODE_USED in str(err)
    return False


@pytest.mark.parametrize("route", list(GUARD_OFF))
def test_the_guard_switched_off_is_listed_for_the_instructor(route):
    assert _caught_or_listed(GUARD_OFF[route])


@pytest.mark.parametrize("route", list(GUARD_OFF_UNLISTED))
def test_the_guard_switched_off_by_another_route_earns_nothing(route):
    """Routes the copy report does not list (sys by another name, a thread without the hook):
    the guard notices them itself, being the guarded code's own first call (call_guard,
    entry_hooks), which no profile switch turns off and every thread runs."""
    assert _caught_or_listed(GUARD_OFF_UNLISTED[route])


# ---------------------------------------------------------------------------------------------
# Section 4: the design, torch's zero-bubble table where the cap allows it (a hidden case caps
# at 1F1B's own peak, k = p, where ZB-H1 fits)

TORCH_DESIGN = (
    "_own = capped_schedule\n"
    "def capped_schedule(num_ranks, num_microbatches, max_held):\n"
    "    if max_held >= num_ranks and num_microbatches % num_ranks == 0:\n"
    "        from distlab.labs.pipeline.torch_tables import torch_table\n"
    "        return torch_table('ScheduleInterleavedZeroBubble', num_ranks, num_microbatches,\n"
    "                           1)[0]\n"
    "    return _own(num_ranks, num_microbatches, max_held)\n")


def test_torchs_zero_bubble_table_handed_in_as_the_design_earns_nothing():
    fn = answer(TORCH_DESIGN, "capped_schedule", ("design_imports",))
    with pytest.raises(SubmittedError, match=COURSE_CODE_USED):
        judged(lab11.check_capped_schedule, fn, world_size=2, num_microbatches=6, max_held=2,
               seed=HIDDEN_SEEDS[0])


# ---------------------------------------------------------------------------------------------
# The handout's stubs: the contract, not the method

def test_a_withheld_function_keeps_no_comment_of_its_method():
    """tables.interleaved_1f1b's comment gave every forward's microbatch and chunk and the
    warm-up count, zb_h1's how many W each rank keeps waiting, greedy_table's the V's whole
    method: a handout's stub keeps the signature and the docstring, no comment of the body."""
    import ast
    from distlab import paths
    from distlab.grading import student_package
    commented = []
    for module, names in student_package.withheld([LAB]).items():
        path = student_package._module_file(paths.PACKAGE, module)
        out = student_package.stub_source(path.read_text(), module, names)
        lines = out.splitlines()
        for qualname, node in student_package._definitions(ast.parse(out)):
            if qualname in names or any(qualname.startswith(q + ".") for q in names):
                body = lines[node.body[0].lineno - 1:node.end_lineno]
                commented += [f"{module}:{qualname}: {line.strip()}" for line in body
                              if line.strip().startswith("#")]
    assert not commented, "\n".join(commented[:10])


# ---------------------------------------------------------------------------------------------
# Section 1's "how": the hooks that count what B and W compute run beside the student's code

HOOKS_CLEARED = PARAMS_FROM_GRAPH + (
    "def backward_input(output, grad_output, stage_input):\n"
    "    params = _params(output, stage_input)\n"
    "    for p in params:   # the check's counting hooks\n"
    "        p._backward_hooks.clear()\n"
    "    wanted = ([stage_input] if stage_input.requires_grad else []) + params\n"
    "    grads = torch.autograd.grad(output, wanted, grad_output)   # W's work done in B\n"
    "    dx = grads[0] if stage_input.requires_grad else None\n"
    "    return dx, (params, grads[len(grads) - len(params):])\n"
    "def backward_weight(kept, params):\n"
    "    for p, g in zip(*kept):\n"
    "        p.grad = g if p.grad is None else p.grad + g\n")


def test_b_doing_ws_work_with_the_counting_hooks_cleared_is_listed():
    """The check counts with hooks on the parameters, in the rank (lab11_split: a diagnostic the
    student's code could remove, as its docstring says). A B that clears them and computes the
    weights' gradients too passes the check; the copy report lists the private hook table it
    reached (similarity_dynamic), so the instructor sees it."""
    from distlab.grading.similarity_dynamic import dynamic_uses
    ns = {"__name__": "lab11_attack"}
    exec(compile(HOOKS_CLEARED, CELL, "exec"), ns)    # noqa: S102
    assert judged(lab11.check_split_backward, ns["backward_input"], ns["backward_weight"])
    assert [use for _, use in dynamic_uses(HOOKS_CLEARED)] == ["._backward_hooks"]
