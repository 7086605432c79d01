"""How Lab 6's stored sets (``data/06_timelines/<run>.pt``, made by ``lab06.make_references``)
hold what is not a tensor: each rank's collectives (the visible references of Exercise 1) and
the run's merged timeline, which a judge reads instead of merging the stored traces again for
every student (8 traces parsed and read into spans, about a CPU-second)."""
from __future__ import annotations

import dataclasses
import gzip
import json

import torch

from distlab.labs.timelines.trace import Span, Timeline


def collectives_tensors(events: list, rank: int) -> dict[str, torch.Tensor]:
    """``collective_events``' list of one rank as tensors: the ops (newline-joined, utf-8) and
    (bytes, start, duration) per collective."""
    return {f"collective_ops.rank{rank}": torch.tensor(list("\n".join(e[0] for e in events).encode()),
                                                       dtype=torch.uint8),
            f"collectives.rank{rank}": torch.tensor([e[1:] for e in events],
                                                    dtype=torch.float64).reshape(-1, 3)}


def stored_collectives(stored: dict, rank: int) -> list[tuple[str, int, float, float]]:
    ops = bytes(stored[f"collective_ops.rank{rank}"].tolist()).decode().split("\n")
    values = stored[f"collectives.rank{rank}"].tolist()
    return [(op, int(b), s, d) for op, (b, s, d) in zip(ops, values)] if values else []


def timeline_tensor(timeline: Timeline) -> torch.Tensor:
    """A merged timeline as gzipped JSON (uint8). JSON writes floats exactly (repr), so
    ``timeline_from`` reads back equal spans."""
    data = {"world_size": timeline.world_size, "source": timeline.source, "label": timeline.label,
            "spans": [dataclasses.astuple(s) for s in timeline.spans]}
    return torch.frombuffer(bytearray(gzip.compress(json.dumps(data).encode(), mtime=0)),
                            dtype=torch.uint8)


def timeline_from(stored: torch.Tensor) -> Timeline:
    """The timeline ``timeline_tensor`` stored."""
    data = json.loads(gzip.decompress(stored.numpy().tobytes()))
    return Timeline([Span(*s) for s in data["spans"]], data["world_size"], data["source"],
                    data["label"])
