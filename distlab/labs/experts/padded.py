"""The capacity-padded all-to-all measured: a reader's ``padded_moe_forward`` (Lab 9's open design
exercise) run on the traffic table's problem at several capacity factors; per factor, the bytes
of each all-to-all from the collective records (``out.comms``) beside the reader's prediction,
and the share of assignments each rank dropped. GShard (§2.2) and Switch Transformer (§2.2) pad
every expert's buffer to the capacity C = ⌈c·T·k/E⌉ so that the all-to-all has a static shape;
the price is the padding's bytes and the dropped tokens, both set by c."""
from __future__ import annotations

import math

import torch

from distlab.labs.experts.moe import make_moe
from distlab.labs.experts.parallel import local_experts
from distlab.labs.experts.traffic import _batch
from distlab.labs.tables import format_table
from distlab.runtime.devices import device as rank_device

FACTORS = (1.0, 1.25, 2.0)


def _padded_rank(rank, world_size, padded_moe_forward, seed, tokens, hidden, ffn, experts, k,
                 factor):
    dev = rank_device()
    moe = make_moe(hidden, ffn, experts, k, seed).to(dev)
    mine = local_experts(moe, rank, world_size)
    x = _batch(seed, world_size * tokens, hidden)[0][rank * tokens:(rank + 1) * tokens].to(dev)
    with torch.no_grad():
        _, keep = padded_moe_forward(x, moe.router, mine, experts, k, factor, None)
    return 1 - torch.as_tensor(keep).float().mean().item()


def _dropless_dispatch(traffic_rows: list[dict]) -> list[int]:
    """Each rank's first forward token all-to-all (its dispatch) in the traffic table's EP rows."""
    out = {}
    for r in traffic_rows:
        if r["layout"] == "EP" and r["what"] == "tokens" and r["phase"] == "forward":
            out.setdefault(r["rank"], r["bytes"])
    return [out[rank] for rank in sorted(out)]


def padded_traffic(padded_moe_forward, predict_all_to_all_bytes, traffic_rows: list[dict],
                   world_size: int = 2, tokens: int = 64, hidden: int = 32, ffn: int = 64,
                   experts: int = 4, k: int = 2, seed: int = 0, factors=FACTORS) -> list[dict]:
    """The padded layer (the reader's) at each capacity factor against the dropless dispatch of
    the traffic table: predicted and measured bytes per all-to-all, the predicted fewest zeros
    beside what the padded message measures over the dropless one, dropped share per rank.
    Prints the table and returns its rows."""
    import distlab
    args = (seed, tokens, hidden, ffn, experts, k)
    dropless = _dropless_dispatch(traffic_rows)
    rows = [{"layout": "dropless (Exercise 1)", "C": "-", "your prediction": "-",
             "measured": str(dropless), "off the rank, predicted": "-",
             "padding, predicted": "-", "over the dropless, measured": "-",
             "dropped, per rank": "0%"}]
    for factor in factors:
        out = distlab.run(_padded_rank, world_size, padded_moe_forward, *args, factor)
        predicted = predict_all_to_all_bytes(tokens, hidden, experts, k, world_size, factor)
        measured = sorted({c.bytes for comms in out.comms for c in comms
                           if c.op.startswith("all_to_all")})
        rows.append({"layout": f"padded, c = {factor}",
                     "C": math.ceil(factor * tokens * k / experts),
                     "your prediction": predicted["padded"], "measured": str(measured),
                     "off the rank, predicted": f"{predicted['padded_off_rank']:.0f}",
                     "padding, predicted": predicted["padding"],
                     "over the dropless, measured": str(sorted({m - d for m in measured
                                                                for d in dropless})),
                     "dropped, per rank": str([f"{d:.0%}" for d in out])})
    print(format_table(rows))
    print(f"\nmeasured, in bytes, from out.comms: dropless, each rank's dispatch (section 7's "
          f"table); padded, the distinct sizes of every all-to-all (dispatch and combine) of "
          f"every rank, and what they send beyond a dropless dispatch. p = {world_size}, "
          f"T = {tokens}, h = {hidden}, E = {experts}, k = {k}, float32")
    return rows
