"""Lab 11's open design (served by ``distlab.checks.lab11``): ``capped_schedule(num_ranks,
num_microbatches, max_held) -> table``, a schedule table (one list per rank of actions
``(op, i, r)``, stage ``r`` on rank ``r``) under a memory cap, graded by its properties:

- the table: every microbatch's F and B once on every rank, each W at most once (a B without
  its W is the whole backward, as ``replay`` times it);
- dependencies: ``replay`` (t_F = t_B = t_W = 1, messages free) runs it to the end: no rank
  waits forever (a W before its B, a B before the rank's own F, ...);
- memory: on every rank, ``Replay.peak`` (activations held from the start of a microbatch's F to
  the end of its W) at most ``max_held``;
- values: the course's executor (``labs.pipeline.executor.run_tables``) runs the table on real
  ranks in float64; loss and every gradient equal single-process training's, compared here;
- the bubble (``Replay.bubble``, idle over compute), on a scale of two tests
  (``common.design_scale``): the first at the bubble of the hinted design (Hint 3: each idle rank
  starts a ready forward while under the cap, else a B, else a W), the second at the bar halfway
  from it to the course's design. The bound no table beats (``labs.pipeline.capped.cap_bound``,
  derived in the lab) is shown beside them.

Both tests grade one run: the first test's table, replay and real run serve the second
(``_RUNS``). Visible figures are stored in ``data/<lab>/capped_design.pt`` (a handout has
neither design); hidden ones are computed in the judge. The figures follow (p, m, k) alone; a
hidden case's seed draws the model and the batch of the real run.
"""
from __future__ import annotations

import torch

from distlab.checks.assertions import CheckFailed, assert_close
from distlab.checks.common import DesignRuns, design_scale
from distlab.checks.course_code import CourseCode, names
from distlab.labs.pipeline.capped import cap_bound, whole_backward_bound
from distlab.labs.pipeline.schedules import replay
from distlab.runtime.per_rank import reference

LAB = "11_pipeline_schedules"
SET = "capped_design"
SEED = 1104
VISIBLE = (4, 8, 3)                     # (p, m, k) of the visible tests
TOL = dict(atol=1e-9, rtol=1e-9)        # float64: sums in another order differ by about 1e-15
UNITS = dict(t_fwd=1.0, t_bwd=1.0, t_wgt=1.0)


def _greedy(p: int, m: int, k: int, prefer: str) -> list:
    from distlab.labs.pipeline.tables import greedy_table
    return greedy_table(list(range(p)), m, k, prefer=prefer, **UNITS)


def _hinted_table(p: int, m: int, k: int) -> list:
    """Hint 3's design for ``(p, m, k)``: the first test's figure."""
    return _greedy(p, m, k, "FBW")


def _course_table(p: int, m: int, k: int) -> list:
    """The course's design for ``(p, m, k)``: the bar is halfway to its figure."""
    return _greedy(p, m, k, "BFW")


def _bubble(table) -> float:
    return replay(table, **UNITS).bubble


def scale_of(p: int, m: int, k: int) -> dict[str, float]:
    """The figures a student's bubble is shown beside: the hinted design's, the bar, the
    course's, the bound, and the least bubble of whole backwards (computed: the judge's)."""
    hinted, course = _bubble(_hinted_table(p, m, k)), _bubble(_course_table(p, m, k))
    return {**design_scale(hinted, course), "course": course, "bound": cap_bound(p, m, k),
            "whole": whole_backward_bound(p, m, k)}


FIGURES = ("hinted", "bar", "course", "bound", "whole")


def design_sets() -> dict:
    """The visible case's figures, for ``data/<lab>/capped_design.pt``."""
    fig = scale_of(*VISIBLE)
    return {SET: {"seed": SEED, "case": torch.tensor(VISIBLE),
                  "figures": torch.tensor([fig[f] for f in FIGURES], dtype=torch.float64)}}


def capped_scale(p: int, m: int, k: int, visible: bool) -> dict[str, float]:
    """The scale for a case: stored for the visible one, computed (in the judge) else."""
    if visible and (p, m, k) == VISIBLE:
        from distlab.checks.stored import load
        return dict(zip(FIGURES, load(LAB, SET)["figures"].tolist()))
    try:
        return scale_of(p, m, k)
    except NotImplementedError:
        raise CheckFailed(
            f"No stored figures for world_size={p}, num_microbatches={m}, max_held={k}, and your "
            f"handout has no code to compute them (the grader computes the hidden cases). "
            f"Stored: world_size={VISIBLE[0]}, num_microbatches={VISIBLE[1]}, "
            f"max_held={VISIBLE[2]}. Call the check as the test cell does.") from None


def capped_figures() -> str:
    """The visible case's scale, as stored (the lab prints it before the exercise)."""
    p, m, k = VISIBLE
    fig = capped_scale(p, m, k, visible=True)
    return (f"p = {p}, m = {m}, max_held = {k} (bubble: idle over compute, t_F = t_B = t_W): "
            f"the hinted design {fig['hinted']:.3f} (first test), the bar {fig['bar']:.3f} "
            f"(second test), the course's design {fig['course']:.3f}, the bound "
            f"{fig['bound']:.3f}; whole backwards cannot go below {fig['whole']:.3f}")


def capped_verdict(capped_schedule) -> str:
    """The student's table for the visible case, replayed in the notebook, on the stored scale
    (the lab's last cell of the exercise)."""
    p, m, k = VISIBLE
    table = capped_schedule(p, m, k)
    mine = replay(table, placement=list(range(p)), **UNITS)
    fig = capped_scale(p, m, k, visible=True)
    peaks = "/".join(str(mine.peak[r]) for r in range(p))
    return (f"your table, p = {p}, m = {m}, max_held = {k}: {_comparison(fig, mine.bubble)}; "
            f"peak held per rank {peaks}; span {mine.span:g} units for {3 * m} of compute per "
            f"rank")


# ---------------------------------------------------------------------------------------------
# The table's shape, its replay and its run

def _as_table(got, p: int, m: int, what: str) -> list[list[tuple]]:
    """The table as lists of ``(op, i, r)`` tuples, or CheckFailed saying what is wrong."""
    if not isinstance(got, (list, tuple)) or len(got) != p:
        raise CheckFailed(f"{what} returned {got!r:.200}: expected a list of {p} lists, one per "
                          f"rank, of actions (op, microbatch, stage).")
    table = []
    for r, row in enumerate(got):
        try:
            actions = [tuple(a) for a in row]
            ok = all(len(a) == 3 and a[0] in ("F", "B", "W") for a in actions)
        except TypeError:
            ok = False
        if not ok:
            raise CheckFailed(f"{what}: rank {r}'s list {row!r:.200} is not a list of actions "
                              f"(op, i, stage) with op 'F', 'B' or 'W'.")
        table.append([(op, int(i), int(s)) for op, i, s in actions])
    return table


def _check_complete(table, p: int, m: int, what: str) -> None:
    """Every F and B of every microbatch once on its rank, each W at most once."""
    for r, row in enumerate(table):
        wrong = [a for a in row if a[2] != r or not 0 <= a[1] < m]
        if wrong:
            raise CheckFailed(f"{what}: rank {r} has {wrong[0]!r}: here stage r runs on rank r "
                              f"(one stage per rank) and microbatches are 0..{m - 1}.")
        for op in "FBW":
            seen = [i for o, i, _ in row if o == op]
            twice = sorted({i for i in seen if seen.count(i) > 1})
            if twice:
                raise CheckFailed(f"{what}: rank {r} runs ({op!r}, {twice[0]}, {r}) "
                                  f"{seen.count(twice[0])} times: each action runs once.")
            missing = sorted(set(range(m)) - set(seen))
            if missing and op != "W":
                raise CheckFailed(f"{what}: rank {r} never runs ({op!r}, {missing[0]}, {r}) "
                                  f"({len(missing)} {op} missing): every microbatch goes forward "
                                  f"and back through every stage.")


def _replayed(table, what: str):
    try:
        return replay(table, placement=list(range(len(table))), name="your table", **UNITS)
    except (RuntimeError, ValueError) as err:
        raise CheckFailed(f"{what}: on paper, {err}. Each action waits for its input: F(i) on "
                          f"rank r for F(i) on r-1, B(i) for B(i) on r+1 (the last rank's for its "
                          f"own F(i)), W(i) for the rank's own B(i).") from None


def _run_on_ranks(table, p: int, m: int, seed: int | None) -> str:
    """The course's executor runs the table on ``p`` ranks; loss and gradients compared with one
    process's here. Returns what was verified."""
    from distlab.labs.pipeline import PipeSpec
    from distlab.labs.pipeline.executor import run_tables, single_process_step
    spec = PipeSpec(num_layers=p, hidden=8, batch=2 * m, seed=SEED if seed is None else seed)
    from distlab.runtime.outcome import DistributedError, RankError
    try:
        got = run_tables({"yours": (table, list(range(p)))}, spec, m,
                         dtype=torch.float64)["yours"]
    except (NotImplementedError, RankError) as err:
        if not isinstance(err, NotImplementedError) and err.exc_type != "NotImplementedError":
            raise _failed(p, err) from None
        # a handout without the course's executor (a student's kernel): the grader runs it
        return ("the run on real ranks: the grader's (your handout's executor is the one you "
                "write in Section 3)")
    except DistributedError as err:
        raise _failed(p, err) from None
    loss, grads = single_process_step(spec, torch.float64)
    where = f"your table run on {p} ranks"
    assert_close(torch.tensor(got["loss"]), reference(torch.tensor(loss)),
                 what=f"{where}: the loss", **TOL)
    for name, want in grads.items():
        assert_close(got["grads"].get(name), reference(want), what=f"{where}: grad of {name}",
                     hint="Every microbatch's B (and W) must run once on every rank.", **TOL)
    return f"on {p} real ranks the loss and all {len(grads)} gradients equal one process's"


def _failed(p: int, err) -> CheckFailed:
    from distlab.checks.rank_failures import ranks_failed
    return ranks_failed(f"your table run by the course's executor on {p} ranks", err,
                        "A table whose replay ends runs on ranks: tell the course's staff.")


# One run grades both tests: the first test's table, replay and run, by submitted function and
# case (a hidden case's first seed serves the second test's, as Labs 8 and 9 do).
_RUNS = DesignRuns()


def _answer(fn, p: int, m: int, k: int, what: str):
    """What the student's function returns for the case, run on one rank."""
    from distlab.checks.rank_failures import ranks_failed
    from distlab.checks.ranks import call_each
    from distlab.runtime.outcome import DistributedError
    try:
        return list(call_each(fn, [(p, m, k)]))[0]
    except DistributedError as err:
        raise ranks_failed(what, err, "") from None


def _measure(fn, p: int, m: int, k: int, seed: int | None) -> dict:
    what = f"capped_schedule({p}, {m}, {k})"
    got = _answer(fn, p, m, k, what)
    table = _as_table(got, p, m, what)
    _check_complete(table, p, m, what)
    replayed = _replayed(table, what)
    peaks = [replayed.peak[r] for r in range(p)]
    over = [r for r in range(p) if peaks[r] > k]
    if over:
        r = over[0]
        raise CheckFailed(
            f"{what}: rank {r} holds {peaks[r]} microbatches' activations at once (from the "
            f"start of an F to the end of its W, or of its B when it has no W); the cap is "
            f"max_held = {k} on every rank. Peaks per rank: {peaks}. Before a forward on a rank "
            f"that holds {k}, some W (or whole B) must have ended.")
    ran = _run_on_ranks(table, p, m, seed)
    case = "the visible case" if seed is None else f"a hidden case, seed {seed}"
    return {"what": what, "case": case, "bubble": replayed.bubble, "peaks": peaks, "ran": ran,
            "figures": capped_scale(p, m, k, visible=seed is None), "k": k}


def _comparison(fig: dict, bubble: float) -> str:
    return (f"bubble on paper {bubble:.3f}; the hinted design {fig['hinted']:.3f}, the bar "
            f"{fig['bar']:.3f} (halfway to the course's {fig['course']:.3f}), the bound "
            f"{fig['bound']:.3f}")


def grade_capped(fn, world_size: int, num_microbatches: int, max_held: int, seed: int | None,
                 level: str) -> str:
    """Both tests: the properties, and the bubble within ``level`` ("hinted" or "bar");
    returns the verdict line."""
    p, m, k = int(world_size), int(num_microbatches), int(max_held)
    got = _RUNS.run(fn, (p, m, k, seed is None), lambda: _measure(fn, p, m, k, seed),
                    first=level == "hinted")
    fig, bubble = got["figures"], got["bubble"]
    limit, name = fig[level], ("hinted design's bubble" if level == "hinted" else "bar")
    case = got["case"]     # the first test's seed, where its run serves the second test
    if bubble > limit + 1e-9:
        advice = ("Split every backward: which of B and W does the rank upstream wait for, and "
                  "when must a W run at the latest?" if level == "hinted" else
                  "When rank 0 cannot start a forward, what is it waiting for? When a rank "
                  "could run either a forward or a B, which hands rank 0 its gradient sooner?")
        raise CheckFailed(f"{got['what']} ({case}): {_comparison(fig, bubble)}. This test's "
                          f"limit is the {name}, {limit:.3f}. {advice}")
    return (f"{got['what']} ({case}): {_comparison(fig, bubble)}: within the {name}; peak held "
            f"per rank {'/'.join(map(str, got['peaks']))} (cap {got['k']}); {got['ran']}")


# What ``distlab.checks.lab11`` adds to its COURSE_CODE: the two designs and the list scheduler
# they are made with (an answer that calls one earns nothing; a handout has none).
DESIGN_SHIPPED = (names(__name__, "_greedy", "_hinted_table", "_course_table")
                  + names("distlab.labs.pipeline.tables", "greedy_table", "_ready"))
# Section 2's tables too (torch's, and the course's through kept code): where the cap allows
# it (k >= p, a hidden case), torch's ZB-H1 table would be a design copied.
from distlab.checks.lab11_tables import THROUGH_COURSE, TABLES_SHIPPED, TORCH_TABLES  # noqa: E402
COURSE_CODE = dict.fromkeys(["check_capped_schedule", "check_capped_schedule_bar"],
                            CourseCode(forbidden=DESIGN_SHIPPED,
                                       watched=TABLES_SHIPPED + TORCH_TABLES + THROUGH_COURSE))

