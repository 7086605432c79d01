"""A profiler timeline of one expert-parallel step on every rank (Lab 6's view): the dispatch
all-to-all, the local experts' compute and the combine all-to-all, each inside a named range."""
from __future__ import annotations

import torch

from distlab.labs.experts.moe import make_moe
from distlab.labs.experts.parallel import ep_moe_forward, local_experts
from distlab.runtime.devices import device as rank_device


class PhaseMarks:
    """Named ranges around the phases of a ``moe_forward`` that marks none itself (a reader's):
    "dispatch all-to-all" from the call to the first local expert (routing and the count
    exchange included), "experts" until every local expert has run once, "combine all-to-all"
    from there to the return. Forward hooks on the experts find the boundaries."""

    def __init__(self, experts):
        self.count, self.calls, self.current = len(experts), 0, None
        for expert in experts:
            expert.register_forward_pre_hook(self._first)
            expert.register_forward_hook(self._last)

    def _switch(self, name: str | None) -> None:
        from torch.profiler import record_function
        if self.current is not None:
            self.current.__exit__(None, None, None)
        self.current = None if name is None else record_function(name)
        if self.current is not None:
            self.current.__enter__()

    def _first(self, module, args) -> None:
        if self.calls == 0 and self.current is not None:
            self._switch("experts")

    def _last(self, module, args, out) -> None:
        self.calls += 1
        if self.calls == self.count and self.current is not None:
            self._switch("combine all-to-all")

    def run(self, forward):
        """``forward()`` with its phases marked."""
        self.calls = 0
        self._switch("dispatch all-to-all")
        try:
            return forward()
        finally:
            self._switch(None)


def moe_step(rank: int, world_size: int, tokens: int = 512, hidden: int = 128, ffn: int = 512,
             experts: int = 4, k: int = 2, seed: int = 0, moe_forward=None):
    """Build this rank's part of the layer; return ``step()``: forward, backward, SGD. The layer
    is ``moe_forward`` (a reader's, its phases marked by PhaseMarks), else the course's."""
    import os
    from torch.profiler import record_function
    # The profiler's own log (USDT ... profiler_start/stop, STAGE ...) is not the lesson: kineto
    # reads its level when it first starts in this rank, after this.
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    dev = rank_device()
    moe = make_moe(hidden, ffn, experts, k, seed).to(dev)
    mine = local_experts(moe, rank, world_size).to(dev)
    params = [*moe.router.parameters(), *mine.parameters()]
    opt = torch.optim.SGD(params, lr=1e-3)
    g = torch.Generator().manual_seed(seed + 10 + rank)
    x = torch.randn(tokens, hidden, generator=g).to(dev)             # (T, h) this rank's tokens
    marks = None if moe_forward is None else PhaseMarks(mine)

    def step():
        # the phases are the outermost ranges of the forward (the view draws outermost ranges)
        if marks is None:
            y = ep_moe_forward(x, moe.router, mine, experts, k, marks=record_function)
        else:
            y = marks.run(lambda: moe_forward(x, moe.router, mine, experts, k, None))
        with record_function("backward"):
            (y ** 2).mean().backward()
        with record_function("optimizer"):
            opt.step()
            opt.zero_grad()
    return step


def profile_moe_step(moe_forward=None, world_size: int = 2, steps: int = 1, tokens: int = 512,
                     hidden: int = 128, ffn: int = 512, experts: int = 4, k: int = 2):
    """Profile ``steps`` steps of ``moe_forward``'s layer (the lab passes the reader's; None:
    the course's) on every rank and draw the timeline; returns the Profile."""
    import matplotlib.pyplot as plt
    from distlab.labs.timelines.profiling import profile_ranks
    from distlab.labs.timelines.views import plot
    prof = profile_ranks(moe_step, world_size, tokens, hidden, ffn, experts, k, 0, moe_forward,
                         steps=steps, warmup=1,
                         label=f"one expert-parallel MoE step, {world_size} ranks")
    fig, ax = plt.subplots(figsize=(11, 1.2 + 1.1 * world_size))
    plot(prof.timeline, ax=ax)
    _colour_phases(prof.timeline, ax)
    plt.show()
    return prof


PHASE_COLOURS = {"dispatch all-to-all": "#E377C2", "experts": "#17BECF",
                 "combine all-to-all": "#9467BD"}


def _colour_phases(timeline, ax) -> None:
    """Draw the MoE phases over the view's range row in their own colours, and add them to the
    legend (Lab 6's view colours only forward/backward/optimizer)."""
    from matplotlib.patches import Patch
    from distlab.labs.timelines.trace import ROW_OF
    n = timeline.world_size
    for s in timeline.spans:
        if s.kind == "range" and s.name in PHASE_COLOURS:
            y = (n - 1 - s.rank) * 4 + (2 - ROW_OF["range"])
            ax.broken_barh([(s.start * 1e3, s.duration * 1e3)], (y + 0.1, 0.8),
                           facecolors=PHASE_COLOURS[s.name], edgecolor="none")
    legend = ax.get_legend()
    handles = [h for h in legend.legend_handles if h.get_label() != "other range"]
    handles += [Patch(color=c, label=k) for k, c in PHASE_COLOURS.items()]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))


def phase_times(timeline) -> list[dict]:
    """Milliseconds each rank spent in each named phase and in all-to-all, from the timeline."""
    rows = []
    for r in range(timeline.world_size):
        row = {"rank": r}
        for name in ("dispatch all-to-all", "experts", "combine all-to-all", "backward"):
            row[name] = round(sum(s.duration for s in timeline.spans
                                  if s.rank == r and s.kind == "range" and s.name == name) * 1e3, 2)
        row["all-to-all (comm lane)"] = round(sum(s.duration for s in timeline.spans if s.rank == r
                                                  and s.kind == "comm" and "all" in s.op) * 1e3, 2)
        rows.append(row)
    return rows
