"""Submissions that hand in the course's own implementations as their answers.

For every lab, every graded exercise that the package ships an implementation of (or whose check
has a reference function) is answered by that implementation, by one route per sample. A lab is
sampled by a few of the routes, not all (``design()``, chosen by ``covering_design``): every lab by
two different routes or more, every route on three labs or more, and every route that makes a
class otherwise than a function on a lab with a class answer and on one with a function answer.
So every route, every lab and every delegated object is graded, in a fraction of the notebooks
that every route on every lab would take (24 of 96 with 8 routes and 12 labs). The routes:

- ``alias``: ``from distlab... import Thing as answer``;
- ``importlib``: a function whose body finds the course's function with ``importlib`` and
  ``getattr`` (seen only at run time), or a class whose base is found that way;
- ``default``: a function that calls the course's function through a default argument (seen
  only at run time), or a class that subclasses the course's;
- ``getsource``: the course object's source text, obtained at run time (``inspect.getsource``)
  and executed in a copy of its module's namespace (new code objects, from ``<string>``);
- ``file``: the same, but the source read from the instructor's package file itself;
- ``code``: a copy of the course function's code object with one attribute changed, made into a
  new function (``types.FunctionType``), or of the course class's namespace;
- ``eval``: an eval'd one-line lambda (or class) that calls the course's object;
- ``unguarded``: a wrapper that turns the guard off (``sys.setprofile(None)``) before it calls.

Under the grader, the student's code imports the lab's student package, where each of these
finds a stub ("... is yours to write in Lab N") or a file it may not read.

Each graded exercise listed scores zero with feedback naming the course object. The others
are left as handed out, so grading stops them at once (a sample costs what an untouched lab
costs, not a whole solution's run; the solutions' full marks are tests/test_grader.py's, with
the call guard watching them too). Lab 1's two all-reduce exercises and Lab 2's four, Lab 5's
schedules, Lab 8's three ZeRO classes, and Lab 12's save/load on a model and optimizer and its
checkpoint plan have no shipped implementation of their signature to delegate to.
"""
from __future__ import annotations

from collections import Counter
from functools import cache

import nbformat

from . import solved

ROUTES = ("alias", "importlib", "default", "getsource", "file", "code", "eval", "unguarded")
# (parameters, arguments) of a wrapper whose course function takes other arguments than the
# exercise: Lab 3's shard_column(weight, bias, rank, world_size) is column_shard(linear, ...).
_LINEAR = ("weight, bias, rank, world_size",
           "__import__('types').SimpleNamespace(weight=weight, bias=bias), rank, world_size")
_PLAIN = ("*args, **kwargs", "*args, **kwargs")
# Lab 8's choose_checkpoints(profile, budget) is best_checkpoint_choice(problem, budget)[0], the
# problem rebuilt from the profile's widths.
_CHECKPOINTS = ("profile, budget",
                "__import__('distlab.labs.sharded', fromlist=['CheckpointProblem']).CheckpointProblem("
                "widths=tuple(b['hidden'] for b in profile)), budget")

# {lab: {solution cell: [(name in the notebook, "module:qualname" of the course's object[,
#                         (wrapper's parameters, its call's arguments)])]}}
DELEGATED = {
    "01_collectives": {
        "bandwidths": [("bandwidths", "distlab.checks.lab01:reference_bandwidths")],
        "alpha_beta": [("fit_alpha_beta", "distlab.labs.collectives:reference_fit")],
    },
    "02_data_parallel": {
        "predict_state_bytes": [("predict_state_bytes",
                                 "distlab.checks.lab02_prediction:_state_bytes")],
    },
    "03_tensor_parallel_mlp": {
        "shard": [("shard_column", "distlab.labs.tensor_parallel.layers:column_shard", _LINEAR),
                  ("shard_row", "distlab.labs.tensor_parallel.layers:row_shard", _LINEAR)],
        "conjugate_ops": [
            ("CopyToTensorParallel", "distlab.labs.tensor_parallel.ops:CopyToTensorParallel"),
            ("ReduceFromTensorParallel",
             "distlab.labs.tensor_parallel.ops:ReduceFromTensorParallel")],
        "parallel_layers": [
            ("ColumnParallelLinear", "distlab.labs.tensor_parallel.layers:ColumnParallelLinear"),
            ("RowParallelLinear", "distlab.labs.tensor_parallel.layers:RowParallelLinear"),
            ("TensorParallelMLP", "distlab.labs.tensor_parallel.layers:TensorParallelMLP"),
            ("TensorParallelSwiGLU", "distlab.labs.tensor_parallel.layers:TensorParallelSwiGLU")],
        "sequence_parallel": [
            ("GatherFromSequenceParallel",
             "distlab.labs.tensor_parallel.ops:GatherFromSequenceParallel"),
            ("ReduceScatterToSequenceParallel",
             "distlab.labs.tensor_parallel.ops:ReduceScatterToSequenceParallel"),
            ("SequenceParallelBlock",
             "distlab.labs.tensor_parallel.sequence_parallel:TensorParallelBlock")],
    },
    "04_tensor_parallel_attention": {
        "split_qkv": [("split_qkv", "distlab.labs.attention.layout:split_qkv")],
        "tp_attention": [("TensorParallelAttention",
                          "distlab.labs.attention.parallel:TensorParallelAttention")],
        "tp_block": [("TensorParallelTransformerBlock",
                      "distlab.labs.attention.parallel:TensorParallelTransformerBlock")],
        "vocab_parallel_ce": [
            ("VocabParallelCrossEntropy", "distlab.labs.attention.parallel:VocabParallelCrossEntropy"),
            ("vocab_parallel_cross_entropy",
             "distlab.labs.attention.parallel:vocab_parallel_cross_entropy")],
    },
    "05_pipeline_parallel": {
        "partition": [("partition", "distlab.labs.pipeline.model:partition_layers")],
        "predict_sent_bytes": [("predict_sent_bytes",
                                "distlab.checks.lab05_design:_boundary_bytes")],
    },
    "06_timelines": {
        "collective_events": [("collective_events", "distlab.labs.timelines.trace:collective_events")],
        "intervals": [("merge_intervals", "distlab.labs.timelines.intervals:union"),
                      ("subtract", "distlab.labs.timelines.intervals:minus")],
        "comm_share": [("comm_share", "distlab.checks.lab06:reference_comm_share"),
                       ("exposed_comm", "distlab.checks.lab06:reference_exposed_comm")],
        "classify": [("classify", "distlab.checks.lab06:reference_classify")],
        "overlap_fraction": [("overlap_fraction", "distlab.checks.lab06:reference_overlap_fraction")],
        "predict_messages": [("predict_messages", "distlab.labs.timelines.runs:formula_messages")],
    },
    "07_3d_parallelism": {
        "memory_per_gpu": [("memory_per_gpu", "distlab.labs.planning.memory:memory_per_gpu")],
        "choose_degrees": [("choose_degrees",
                            "distlab.labs.planning.degrees:reference_choose_degrees")],
        "tp_plan": [("tp_plan", "distlab.labs.mesh:megatron_plan")],
        "predict_traffic": [("predict_traffic", "distlab.checks.lab07_prediction:formula_traffic")],
        "place_mesh": [("place_mesh", "distlab.labs.mesh_traffic:stage_layout")],
    },
    "08_sharded_data_parallel": {
        "predict_step_bytes": [("predict_step_bytes",
                                "distlab.checks.lab08_prediction:formula_step_bytes")],
        "choose_checkpoints": [("choose_checkpoints",
                                "distlab.labs.sharded.checkpointing:best_checkpoint_choice",
                                _CHECKPOINTS)],
        "design": [("design", "distlab.labs.sharded.budget:course_design")],
    },
    "09_expert_parallel": {
        "dispatch": [("plan_dispatch", "distlab.labs.experts.parallel:plan_dispatch")],
        "moe_forward": [("AllToAll", "distlab.labs.experts.parallel:AllToAll"),
                        ("moe_forward", "distlab.labs.experts.parallel:ep_moe_forward")],
        "capacity": [("expert_capacity", "distlab.labs.experts.moe:reference_capacity")],
        "aux_loss": [("load_balancing_loss", "distlab.labs.experts.moe:reference_aux_loss")],
        "predict_all_to_all_bytes": [("predict_all_to_all_bytes",
                                      "distlab.checks.lab09_prediction:_a2a_bytes")],
    },
    "10_context_parallel": {
        "merge": [("merge_partials", "distlab.labs.context.answers:merge_partials")],
        "ring_forward": [("ring_attention", "distlab.labs.context.answers:ring_attention")],
        "ring_backward": [("ring_attention_backward",
                           "distlab.labs.context.answers:ring_attention_backward")],
        "predict_contiguous_penalty": [("predict_contiguous_penalty",
                                        "distlab.checks.lab10_layout:contiguous_penalty_limit")],
        "causal_layout": [("causal_layout", "distlab.labs.context.answers:causal_layout")],
        "ulysses": [("ulysses_attention", "distlab.labs.context.answers:ulysses_attention")],
        "predict_ring_bytes": [("predict_ring_bytes",
                                "distlab.checks.lab10_plan:ring_bytes_formula")],
        "smallest_cp": [("smallest_cp", "distlab.checks.lab10_plan:reference_smallest_cp")],
    },
    "11_pipeline_schedules": {
        "split_backward": [("backward_input", "distlab.labs.pipeline.split_backward:backward_input"),
                           ("backward_weight",
                            "distlab.labs.pipeline.split_backward:backward_weight")],
        "predict_held_bytes": [("predict_held_bytes", "distlab.checks.lab11_split:_held_bytes")],
        "predict_interleaved": [("predict_interleaved", "distlab.checks.lab11_tables:formula_figures",
                                 ("p, m, v", "'interleaved', p, m, v"))],
        "interleaved_1f1b": [("interleaved_1f1b", "distlab.labs.pipeline.tables:interleaved_1f1b")],
        "zb_h1": [("zb_h1", "distlab.labs.pipeline.tables:zb_h1")],
        "zb_v": [("zb_v", "distlab.labs.pipeline.tables:zb_v")],
        "executor": [("run_table", "distlab.labs.pipeline.executor:run_table")],
        "capped_schedule": [("capped_schedule", "distlab.checks.lab11_design:_course_table")],
    },
    "12_checkpoint_restart": {
        "whole_state": [("whole_state", "distlab.labs.checkpoint.run_state:training_state"),
                        ("restore", "distlab.labs.checkpoint.run_state:restore_state")],
        "async_save_checkpoint": [("async_save_checkpoint",
                                   "distlab.labs.checkpoint.saving:async_save_checkpoint")],
        "train_resumable": [("train_resumable", "distlab.labs.checkpoint.restart:train_resumable",
                             ("rank, world_size, root, steps, save_every, save, load, spec=None",
                              "rank, world_size, root, steps, save_every, asynchronous=True"))],
        "predict_lost_fraction": [("predict_lost_fraction",
                                   "distlab.labs.checkpoint.interval:lost_fraction")],
    },
}

# The test cells each lab's delegation must zero (every one whose exercise is delegated).
ZEROED = {
    "01_collectives": ("test_bandwidths", "test_alpha_beta"),
    "02_data_parallel": ("test_predict_state_bytes",),
    "03_tensor_parallel_mlp": ("test_shard", "test_copy_to_tp", "test_reduce_from_tp",
                               "test_parallel_linears", "test_tp_mlp", "test_tp_swiglu",
                               "test_sp_ops", "test_sp_block"),
    "04_tensor_parallel_attention": ("test_split_qkv", "test_tp_attention_forward",
                                     "test_tp_attention_backward", "test_tp_block",
                                     "test_vocab_parallel_ce"),
    "05_pipeline_parallel": ("test_partition", "test_predict_sent_bytes"),
    "06_timelines": ("test_collective_events", "test_comm_share", "test_classify",
                     "test_overlap_fraction", "test_predict_messages"),
    "07_3d_parallelism": ("test_memory_per_gpu", "test_choose_degrees", "test_tp_plan",
                          "test_predict_traffic", "test_place_mesh", "test_place_mesh_bar"),
    "08_sharded_data_parallel": ("test_predict_step_bytes", "test_choose_checkpoints",
                                 "test_design", "test_design_bar"),
    "09_expert_parallel": ("test_dispatch", "test_moe_layer", "test_capacity", "test_aux_loss",
                           "test_predict_all_to_all_bytes"),
    "10_context_parallel": ("test_merge", "test_ring_forward", "test_ring_backward",
                            "test_predict_contiguous_penalty", "test_causal_layout",
                            "test_causal_layout_better", "test_ulysses", "test_predict_ring_bytes",
                            "test_smallest_cp"),
    "11_pipeline_schedules": ("test_split_backward", "test_predict_held_bytes",
                              "test_predict_interleaved", "test_interleaved_1f1b", "test_zb_h1",
                              "test_zb_v", "test_executor", "test_capped_schedule",
                              "test_capped_schedule_bar"),
    "12_checkpoint_restart": ("test_whole_state", "test_train_resumable",
                              "test_predict_lost_fraction"),
}


def _is_class(target: str) -> bool:
    from distlab.runtime.call_guard import resolve
    return isinstance(resolve(target), type)


def _run_time_copy(name: str, target: str, route: str, as_class: bool) -> str:
    """Code that rebuilds ``target`` as ``name`` at run time: from its source text (asked of
    ``inspect`` or read from the instructor's file), its code object, or an eval."""
    from distlab import paths
    module, _, qualname = target.partition(":")
    head = f"import inspect, types\nfrom {module} import {qualname} as _course_{name}\n"
    namespace = f"_ns_{name} = dict(vars(inspect.getmodule(_course_{name})))\n"
    if route in ("getsource", "file"):
        source = (f"inspect.getsource(_course_{name})" if route == "getsource" else
                  f"open({str(paths.PACKAGE.joinpath(*module.split('.')[1:]))!r} + '.py').read()")
        return head + namespace + f"exec({source}, _ns_{name})\n{name} = _ns_{name}[{qualname!r}]"
    if route == "eval":
        made = f"type({name!r}, (_course_{name},), {{}})" if as_class else \
            f"lambda *a, **k: _course_{name}(*a, **k)"
        return head + f"{name} = eval({made!r})"
    if as_class:   # route == "code": the class's namespace, copied
        return head + (f"{name} = type({name!r}, _course_{name}.__bases__, {{k: v for k, v in "
                       f"vars(_course_{name}).items() if k not in ('__dict__', '__weakref__')}})")
    return head + namespace + (
        f"{name} = types.FunctionType(_course_{name}.__code__.replace(co_firstlineno=1), "
        f"_ns_{name}, {name!r}, _course_{name}.__defaults__)")


def delegation(name: str, target: str, route: str, signature=_PLAIN, as_class=None) -> str:
    """Code that makes ``name`` the course's ``target`` by ``route`` (as a class or a function
    as ``target`` is one, unless ``as_class`` says)."""
    module, _, qualname = target.partition(":")
    params, call = signature
    as_class = _is_class(target) if as_class is None else as_class
    if route in ("getsource", "file", "code", "eval"):
        return _run_time_copy(name, target, route, as_class)
    if route == "unguarded":
        if as_class:
            return (f"import sys\nfrom {module} import {qualname} as _Course{name}\n"
                    f"class {name}(_Course{name}):\n"
                    f"    def __init__(self, *args, **kwargs):\n"
                    f"        sys.setprofile(None)\n        super().__init__(*args, **kwargs)")
        return (f"import sys\nfrom {module} import {qualname} as _course_{name}\n"
                f"def {name}({params}):\n    sys.setprofile(None)\n"
                f"    return _course_{name}({call})")
    if route == "alias":
        return f"from {module} import {qualname} as {name}"
    if as_class:
        if route == "importlib":
            return (f"import importlib\n"
                    f"class {name}(getattr(importlib.import_module({module!r}), {qualname!r})):\n"
                    f"    pass")
        return f"from {module} import {qualname} as _Course{name}\nclass {name}(_Course{name}):\n    pass"
    if route == "importlib":
        return (f"def {name}({params}):\n    import importlib\n"
                f"    return getattr(importlib.import_module({module!r}), {qualname!r})({call})")
    params = params.replace("**kwargs", "_impl=_course_" + name + ", **kwargs") \
        if "**kwargs" in params else f"{params}, _impl=_course_{name}"
    return (f"from {module} import {qualname} as _course_{name}\n"
            f"def {name}({params}):\n"
            f"    return _impl({call})")


def delegated(lab: str, route: str) -> nbformat.NotebookNode:
    """The notebook of ``lab`` with its delegated exercises answered and then rebound by
    ``route``; the other exercises are left as handed out (the grader stops them at once)."""
    nb = solved(lab, only=set(DELEGATED[lab]))
    cells = DELEGATED[lab]
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in cells:
            # The own answers go first: a route that fails must not leave them to be graded.
            own = ", ".join(entry[0] for entry in cells[gid])
            cell.source = cell.source.rstrip() + f"\n\n# the course's own, handed in\ndel {own}\n" + \
                "\n".join(delegation(*entry[:2], route, *entry[2:]) for entry in cells[gid])
    return nb


# ---------------------------------------------------------------------------------------------
# Which routes sample which labs

LABS_PER_ROUTE = 3   # each route on this many labs at least
ROUTES_PER_LAB = 2   # each lab by this many routes at least (more where LABS_PER_ROUTE needs it)


def answer_kinds(lab: str) -> frozenset[str]:
    """The kinds of answer ``lab`` delegates: "class", "function" or both."""
    return frozenset("class" if _is_class(entry[1]) else "function"
                     for cell in DELEGATED[lab].values() for entry in cell)


def has_class_variant(route: str) -> bool:
    """Whether ``route`` makes a class otherwise than a function (a base found at run time, a
    subclass, a copied namespace, ...): such a route is sampled on both kinds of answer."""
    target = next(entry[1] for cells in DELEGATED.values() for cell in cells.values()
                  for entry in cell if _is_class(entry[1]))
    return delegation("answer", target, route, as_class=True) != \
        delegation("answer", target, route, as_class=False)


def covering_design(kinds: dict[str, frozenset[str]], routes: tuple[str, ...],
                    varied: set[str]) -> dict[str, tuple[str, ...]]:
    """{lab: its routes}: each lab of ``kinds`` ({lab: the kinds of answer it delegates}) by
    ROUTES_PER_LAB different routes or more (as many as give each route LABS_PER_ROUTE labs, or
    let every route of ``varied`` meet both kinds), each route on LABS_PER_ROUTE labs or more, and
    each route of ``varied`` (those with a class variant) on a lab with a class answer and on one
    with a function answer: the fewest routes per lab that give all that."""
    fewest = max(ROUTES_PER_LAB, -(-LABS_PER_ROUTE * len(routes) // len(kinds)))
    if fewest > len(routes):
        raise ValueError(f"no covering design of {len(kinds)} labs and {len(routes)} routes: each "
                         f"lab would need {fewest} different routes (each route on "
                         f"{LABS_PER_ROUTE} labs, each lab by {ROUTES_PER_LAB} routes or more)")
    for per_lab in range(fewest, len(routes) + 1):
        design, lacking = _fill(kinds, routes, varied, per_lab)
        if not lacking:
            return design
    raise ValueError(f"no covering design of {len(kinds)} labs and {len(routes)} routes: even "
                     f"with every route on every lab these lack a kind or labs: {lacking}")


def _fill(kinds, routes, varied, per_lab) -> tuple[dict, dict]:
    """``per_lab`` routes for each lab, and {route: what it still lacks} of those that lack a kind
    or labs. The slots are filled in passes over the labs, those of the rarest kind first; a slot
    goes to the route that still lacks a kind the lab has, else to the route on fewest labs
    (``routes``' order breaks ties)."""
    rarity = Counter(kind for of_lab in kinds.values() for kind in of_lab)
    order = sorted(kinds, key=lambda lab: min(rarity[kind] for kind in kinds[lab]))
    lacks = {r: set().union(*kinds.values()) if r in varied else set() for r in routes}
    on = dict.fromkeys(routes, 0)
    design: dict[str, list[str]] = {lab: [] for lab in kinds}
    for _ in range(per_lab):
        for lab in order:
            route = min((r for r in routes if r not in design[lab]),
                        key=lambda r: (-len(lacks[r] & kinds[lab]), on[r], routes.index(r)))
            design[lab].append(route)
            on[route] += 1
            lacks[route] -= kinds[lab]
    lacking = {r: sorted(lacks[r]) + [f"{on[r]} labs"] for r in routes
               if lacks[r] or on[r] < LABS_PER_ROUTE}
    return {lab: tuple(design[lab]) for lab in kinds}, lacking


@cache
def design() -> dict[str, tuple[str, ...]]:
    """{lab: the routes that sample it}: the covering design of DELEGATED's labs and ROUTES."""
    return covering_design({lab: answer_kinds(lab) for lab in DELEGATED}, ROUTES,
                           {route for route in ROUTES if has_class_variant(route)})


def delegation_samples() -> dict[tuple[str, str], tuple[nbformat.NotebookNode, tuple[str, ...]]]:
    """{(student, lab): (notebook, the test cells it must score zero on)}: the student
    ``delegates_<route>`` for each route of the lab's design()."""
    return {(f"delegates_{route}", lab): (delegated(lab, route), ZEROED[lab])
            for lab, routes in design().items() for route in routes}
