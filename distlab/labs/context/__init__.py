"""Lab 10 (context parallelism): the sequence itself sharded over ranks. Ring attention (Liu et
al., arXiv 2310.01889), all-gather context parallelism as Llama 3 trains its long-context stage
(arXiv 2407.21783 §3.3.2), causal splits weighed on the ring's critical path, and
DeepSpeed-Ulysses (arXiv 2309.14509)."""
from distlab.labs.context.dense import block_attention, causal_mask, dense_attention  # noqa: F401
from distlab.labs.context.layout import (causal_work, contiguous_layout, critical_path,  # noqa: F401
                                         steps_table, striped_layout, work_table)
from distlab.labs.context.demos import ring_gradients, ring_with_layout  # noqa: F401
