"""Pipeline parallelism (lab 5): stages, measured schedules, the bubble, and a schedule simulator.

A model of ``L`` equal blocks is cut into ``p`` contiguous *stages*, one per rank. Stage ``s``
receives its input activation from rank ``s-1`` and sends its output to rank ``s+1``; in backward
the gradient of the stage's output comes from ``s+1`` and the gradient of its input goes to ``s-1``.
Only stage boundaries communicate: activations forward, gradients backward.

With ``m`` equal microbatches, forward time ``t_f`` and backward time ``t_b`` per microbatch and
stage, GPipe and 1F1B both take ``(m + p - 1)(t_f + t_b)`` for work worth ``m (t_f + t_b)``, so each
rank idles for the *bubble fraction* ``(p - 1) / (m + p - 1)``. 1F1B does not shrink the bubble; it
bounds the microbatches whose activations a stage holds at once to ``p - s`` instead of ``m``.

What lives here (the submodules ``model``, ``stages``, ``runs``, ``schedules``, ``plots``;
the names below are re-exported here, where the lab imports them):
- the model (``make_model``, ``PipeSpec``) and its split (``partition_layers``, ``stage_layers``);
- ``TimedStage``: a stage module that records, per microbatch, when its forward and its backward
  started and ended, and how many activation bytes autograd holds (``Event``, ``peak_in_flight``);
- ``run_schedules``: runs step functions (yours, or ``library_step`` for
  ``torch.distributed.pipelining``) on real ranks and returns grads, events and timings;
- ``measured_bubble``, ``plot_schedule``, ``schedule_table``: the bubble and the Gantt chart;
- ``schedule_order``, ``simulate``, ``schedule_explorer``: the same schedules on paper;
  ``replay`` times any per-stage order on paper, ``recorded_orders`` reads one from a run.

Lab 11 extends ``replay`` to tables of ``(op, microbatch, stage)`` with op F, B or W (backward
split into the input's and the weights' gradients) and several stages per rank (a ``Replay``:
events, bubble, peak activations); ``tables`` writes interleaved 1F1B, ZB-H1 and a V-shaped
zero-bubble schedule; ``torch_tables`` reads torch's own tables in the same form.
"""
from distlab.labs.losses import loss_fn
from distlab.labs.pipeline.model import (PipeSpec, ResidualLayer, make_model, partition_layers,
                                         reference_step, stage_layers)
from distlab.labs.pipeline.plots import plot_runs, plot_schedule, plot_simulations, schedule_explorer
from distlab.labs.pipeline.runs import ScheduleRun, grad_error, library_step, run_schedules, schedule_table
from distlab.labs.pipeline.schedules import (SCHEDULES, Replay, StageEvent, boundary_traffic,
                                             recorded_orders, replay, schedule_order, simulate)
from distlab.labs.pipeline.stages import (Event, TimedStage, measured_bubble, peak_in_flight,
                                          theoretical_bubble)

__all__ = ["PipeSpec", "ResidualLayer", "make_model", "partition_layers", "reference_step",
           "stage_layers", "loss_fn", "Event", "TimedStage", "measured_bubble", "peak_in_flight",
           "theoretical_bubble", "ScheduleRun", "grad_error", "library_step", "run_schedules",
           "schedule_table", "SCHEDULES", "boundary_traffic", "schedule_order", "simulate",
           "replay", "recorded_orders", "Replay", "StageEvent",
           "plot_runs", "plot_schedule", "plot_simulations", "schedule_explorer"]
