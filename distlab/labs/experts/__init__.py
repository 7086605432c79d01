"""Lab 9, expert parallelism: the single-process MoE layer (``moe``), expert parallelism by hand
with all-to-all (``parallel``), and what the lab shows with them: communication measured from the
collective records, the capacity-padded all-to-all measured (``padded``), EP × DP on a 2 × 2
mesh, training with and without the load-balancing loss, and a profiler timeline of one step."""
from distlab.labs.experts.moe import (Expert, MoE, make_moe, owner, reference_aux_loss,  # noqa: F401
                                      reference_capacity, reference_keep)
from distlab.labs.experts.parallel import (AllToAll, DispatchPlan, ep_moe_forward,  # noqa: F401
                                           local_experts, plan_dispatch)
from distlab.labs.experts.demos import moe_closing_note, show_routing  # noqa: F401,E402
from distlab.labs.experts.ep_dp import ep_dp_step  # noqa: F401,E402
from distlab.labs.experts.padded import padded_traffic  # noqa: F401,E402
from distlab.labs.experts.timeline import phase_times, profile_moe_step  # noqa: F401,E402
from distlab.labs.experts.training import ToyTask, compare_training, train  # noqa: F401,E402
from distlab.labs.experts.traffic import (format_wire_bytes, measure_traffic,  # noqa: F401,E402
                                          traffic_summary, wire_bytes)
