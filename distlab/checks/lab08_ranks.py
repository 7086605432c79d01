"""How Lab 8's checks run the student's code on ranks (``distlab.checks.lab08``): a failure on the
ranks becomes a failed check that shows the student's frames (with the padding hint where the
sizes did not fit the world size), and the warnings the ranks recorded are shown once each."""
from __future__ import annotations

import re
import warnings

from distlab.checks.rank_failures import ranks_failed


def run_ranks(fn, world_size: int, what: str, *args):
    """``distlab.run`` of the harness; ranks that broke become a failed check whose traceback
    shows the student's frames only; the warnings the ranks recorded are shown once each."""
    from distlab import run
    from distlab.checks.ranks import rank_timeout
    from distlab.runtime.outcome import DistributedError
    __tracebackhide__ = True  # noqa: F841
    try:
        out = run(fn, world_size, *args, timeout=rank_timeout())
    except DistributedError as err:
        headline = str(err).split("\n", 1)[0]
        hint = PAD_HINT if re.search(r"world_?size", headline, re.IGNORECASE) else ""
        raise ranks_failed(f"{what} on {world_size} ranks", err, hint) from None
    _show_warnings(out)
    return out


PAD_HINT = ("A collective's sizes did not fit the world size: a reduce-scatter's input (and an "
            "all-gather's output) has W times the elements of a shard. Pad each bucket's flat "
            "parameters and gradients to W·s elements, s = ceil(P / W) (padded_flat does), even "
            "when W does not divide the bucket's P elements.")

DEPRECATED = {"reduce_scatter_tensor": "reduce_scatter_single",
              "all_gather_into_tensor": "all_gather_single"}


def _show_warnings(out) -> None:
    """The warnings the student's code raised on the ranks, once each (the ranks record them
    instead of printing one per call and rank), with what to use for a deprecated collective."""
    seen = dict.fromkeys(w for res in out for w in res.get("warnings", ()))
    for text in seen:
        use = [f"dist.{new} instead of dist.{old}" for old, new in DEPRECATED.items() if old in text]
        advice = f" Use {' and '.join(use)}: the same collective, its current name." if use else ""
        warnings.warn(f"on the ranks, your code raised: {text}{advice}", UserWarning, stacklevel=3)
