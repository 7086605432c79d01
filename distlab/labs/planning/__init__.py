"""Planning 3D parallelism (Lab 7), one job per module:

- ``shapes``: Model, Cluster, Job, ParallelConfig and the published Llama 3 models and run;
- ``memory``: memory per GPU by term on the heaviest pipeline stage (ZeRO, activations, logits);
- ``communication``: bytes per step on each axis and the links they run on;
- ``step_time``: compute, bubble and communication seconds per step, and the MFU they imply;
- ``degrees``: valid layouts, the fastest, its near ties, and what a defensible answer is;
- ``reports``: the tables, figures and planner the lab shows;
- ``context``: the context-parallel axis (Lab 10): memory and traffic with each sequence cut over
  ``ParallelConfig.cp`` GPUs, and Llama 3 405B's 128K-token stage.
"""
from distlab.labs.planning.communication import (axis_bandwidth, comm_bytes_per_step, dp_traffic,
                                                 tp_collectives_per_layer, zero_charge)
from distlab.labs.planning.degrees import (RESOLUTION, acceptable_layout, candidates, divisors,
                                           near_ties, reference_choose_degrees, valid_layouts,
                                           why_invalid)
from distlab.labs.planning.memory import (GATHERED_LAYERS, LOGIT_BYTES, activation_bytes_per_layer,
                                          inflight_microbatches, llama_activation_bytes_per_layer,
                                          logits_bytes, memory_per_gpu, rule_of_thumb_gpus,
                                          stage_params, zero_divides)
from distlab.labs.planning.reports import (ZERO_OPTIONS, layout_summary, memory_table,
                                           near_tie_table, plan_report, planner, plot_memory,
                                           published_comparison, published_report,
                                           published_verdict, zero_options_table)
from distlab.labs.planning.shapes import (GB, H100_16x8, LLAMA3_8B, LLAMA3_70B, LLAMA3_405B,
                                          LLAMA3_405B_CLUSTER, LLAMA3_405B_JOB, LLAMA3_405B_MFU,
                                          LLAMA3_405B_PUBLISHED, LLAMA3_405B_TFLOPS, TERMS,
                                          ZERO_ACCUMULATION, Cluster, Job, Model, ParallelConfig,
                                          model_of_size, with_job)
from distlab.labs.planning.step_time import (bubble_fraction, measured_step_seconds, model_flops,
                                             model_mfu, step_time)
