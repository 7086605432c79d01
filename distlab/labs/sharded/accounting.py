"""Where a rank's memory and communication go under ZeRO stages 0-3: computed from the ZeRO
paper's terms and measured on ranks (Lab 8, sections 1, 5 and 6).

Computed (Rajbhandari et al. 2020, arXiv:1910.02054, sec. 3.1 and 5, Figure 1): mixed-precision
Adam keeps per parameter 2 bytes of fp16/bf16 weights, 2 of gradients and K = 12 of optimizer
state (fp32 master weights 4, Adam's moments 4 + 4): 16 bytes. Hugging Face's Transformers
documentation ("Model training anatomy") counts 18: gradients kept in fp32 (4 bytes). On W
ranks stage 1 divides the optimizer state by W, stage 2 also the gradients, stage 3 also the
weights.

Measured: the lab's stack trained in float32 on W ranks, one step per stage, the bytes of live
tensors on each rank at the end of each phase (start, forward, backward, step): parameters
(storages behind the model's parameters; ZeRO-3's shards), gradients (``.grad`` of parameters
and shards), optimizer state (AdamW's state tensors; for the hand-written ZeRO-1/2 also the fp32
shard copy they step, which plays the master weights' part) and saved activations. Computed for
this float32 run: weights 4, gradients 4, optimizer 8 (+4 for ZeRO-1/2's shard copy) bytes per
parameter, divided by W as the stage says.

Communication (ZeRO paper sec. 7): per step each rank moves 2 Psi for an all-reduce of Psi bytes,
Psi for an all-gather or a reduce-scatter (the ring's (W-1)/W dropped): data parallelism 2 Psi,
ZeRO-1 and ZeRO-2 2 Psi, ZeRO-3 3 Psi.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from distlab.labs.activation_memory import ActivationMeter
from distlab.labs.losses import loss_fn
from distlab.labs.sharded.flat import storage_bytes
from distlab.labs.sharded.harness import grad_bytes
from distlab.labs.sharded.problem import ShardSetup, padded_flat, rank_batch
from distlab.labs.tables import format_table
from distlab.runtime.devices import device

CONVENTIONS = {"ZeRO paper (fp16 gradients)": (2, 2, 12), "Hugging Face (fp32 gradients)": (2, 4, 12)}
STAGE_NAMES = ["stage 0 (DP)", "stage 1 (optimizer)", "stage 2 (+gradients)", "stage 3 (+weights)"]
PAPER_VOLUME = {"DP": 2, "ZeRO-1": 2, "ZeRO-2": 2, "ZeRO-3": 3}  # units of Psi, sec. 7
# float32 training, as measured: (weights, gradients, optimizer) bytes per parameter.
MEASURED_SETUP = ShardSetup(d=64, hidden=256, blocks=4, batch=16, dtype=torch.float32)
PHASES = ("start", "forward", "backward", "step")


def stage_bytes_per_param(weights: float, grads: float, optimizer: float, stage: int,
                          world_size: int) -> dict:
    """Per-parameter bytes of each term on one of W ranks under ZeRO ``stage``."""
    return {"weights": weights / (world_size if stage >= 3 else 1),
            "gradients": grads / (world_size if stage >= 2 else 1),
            "optimizer": optimizer / (world_size if stage >= 1 else 1)}


def bytes_per_param(world_sizes=(4, 64)) -> list[dict]:
    """Rows (convention, W, stage, weights, gradients, optimizer, total): bytes per parameter."""
    rows = []
    for name, terms in CONVENTIONS.items():
        for w in world_sizes:
            for stage in range(4):
                row = stage_bytes_per_param(*terms, stage, w)
                rows.append({"convention": name, "world_size": w, "stage": stage, **row,
                             "total": sum(row.values())})
    return rows


def format_bytes_per_param(rows: list[dict]) -> str:
    """``bytes_per_param``'s rows as a table: bytes per parameter of each term on one rank."""
    terms = ("weights", "gradients", "optimizer", "total")
    return format_table([{"convention": r["convention"], "W": r["world_size"], "stage": r["stage"],
                          **{k: f"{r[k]:.3f}" for k in terms}} for r in rows])


# ---------------------------------------------------------------------------------------------
# The course's ZeRO-1 (Lab 2's exercise, written again for this lab's stage-1 measurement)

class CourseZero1:
    """ZeRO-1 per bucket: after ``step``, every rank holds the parameters AdamW gives on the
    ranks' averaged gradients, and AdamW's state of its own shard of each bucket only; full
    gradients live through backward. Collectives: a reduce-scatter and an all-gather per bucket."""

    def __init__(self, buckets, **adamw_kwargs):
        self.buckets = [list(b) for b in buckets]
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.shards = []
        for params in self.buckets:
            full = padded_flat(params, self.world_size)
            s = full.numel() // self.world_size
            self.shards.append(full[self.rank * s:(self.rank + 1) * s].clone().requires_grad_())
        self.local_optimizer = torch.optim.AdamW(self.shards, **adamw_kwargs)

    def zero_grad(self) -> None:
        for p in (q for b in self.buckets for q in b):
            p.grad = None

    def step(self) -> None:
        # `with`, not the @torch.no_grad() decorator: a decorated method's code is torch's shared
        # wrapper, which a guard against this class would then see in every decorated library call
        with torch.no_grad():
            for params, shard in zip(self.buckets, self.shards):
                grad = torch.empty_like(shard)
                dist.reduce_scatter_single(grad, padded_flat([p.grad for p in params],
                                                             self.world_size))
                shard.grad = grad.div_(self.world_size)
            self.local_optimizer.step()
            for params, shard in zip(self.buckets, self.shards):
                full = shard.new_empty(self.world_size * shard.numel())
                dist.all_gather_single(full, shard.detach())
                for p, piece in zip(params, full[:sum(p.numel() for p in params)].split(
                        [p.numel() for p in params])):
                    p.copy_(piece.view_as(p))


class _ParamAwareMeter(ActivationMeter):
    """ActivationMeter that recognises parameters whose storage moves (ZeRO-3 regathers them)."""

    def __init__(self, params):
        super().__init__()
        self.params = list(params)

    def _pack(self, t):
        if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() in {
                p.untyped_storage().data_ptr() for p in self.params}:
            return t
        return super()._pack(t)


def _state_bytes(optimizer) -> int:
    return storage_bytes(v for state in optimizer.state.values() for v in state.values()
                         if isinstance(v, torch.Tensor))


def _one_stage(stage: int, rank: int, world_size: int, zero2_cls, zero3_cls, setup) -> dict:
    dev = device()
    model = setup.model().to(dev)
    x, y = (rank_batch(t, rank, world_size).to(dev) for t in setup.data())
    buckets = [list(b.parameters()) for b in model]
    kw = dict(lr=setup.lr, weight_decay=setup.weight_decay)
    shards, master = [], []
    if stage == 0:
        optimizer, local = setup.optimizer(model.parameters()), None
    elif stage in (1, 2):
        optimizer = (CourseZero1 if stage == 1 else zero2_cls)(buckets, **kw)
        local = optimizer.local_optimizer
        master = [p for g in local.param_groups for p in g["params"]]
    else:
        shards = [zero3_cls(block).shard for block in model]
        optimizer = local = setup.optimizer(shards)
    opt = local or optimizer
    params = list(model.parameters())

    def measure(activations: int) -> dict:
        return {"weights": storage_bytes(params + shards),
                "gradients": grad_bytes(params + shards + master),
                "optimizer": _state_bytes(opt) + storage_bytes(master),
                "activations": activations}

    dist.barrier()
    start = time.perf_counter()
    optimizer.zero_grad()
    phases = {"start": measure(0)}
    with _ParamAwareMeter(params) as meter:
        loss = loss_fn(model(x), y)
    phases["forward"] = measure(meter.live)
    loss.backward()
    if stage == 0:
        for p in params:
            dist.all_reduce(p.grad)
            p.grad.div_(world_size)
    phases["backward"] = measure(meter.live)
    optimizer.step()
    phases["step"] = measure(0)
    return {"stage": stage, "phases": phases, "window": (start, time.perf_counter())}


def _stages_rank(rank: int, world_size: int, zero2_cls, zero3_cls, setup) -> list[dict]:
    return [_one_stage(s, rank, world_size, zero2_cls, zero3_cls, setup) for s in range(4)]


def measure_stages(zero2_cls, zero3_cls, world_size: int = 2,
                   setup: ShardSetup = MEASURED_SETUP) -> dict:
    """One step of each ZeRO stage on ``world_size`` ranks (stage 2: ``zero2_cls``, stage 3:
    ``zero3_cls``, the lab's exercises). Returns the phases measured on every rank, the step's
    collectives per rank and the parameter count."""
    from distlab import run
    out = run(_stages_rank, world_size, zero2_cls, zero3_cls, setup, timeout=120)
    blocks = [sum(p.numel() for p in block.parameters()) for block in setup.model()]
    numel = sum(blocks)
    comms = [[[c for c in out.comms[r] if lo <= c.start <= hi and c.op != "barrier"]
              for lo, hi in (s["window"] for s in out[r])] for r in range(world_size)]
    return {"world_size": world_size, "numel": numel, "block_numels": blocks, "element_size": 4,
            "ranks": [list(out[r]) for r in range(world_size)], "comms": comms}


def computed_stage_bytes(stage: int, numel: int, world_size: int) -> dict:
    """What the float32 run should hold after its step, from the terms (module doc)."""
    optimizer = 8 + (4 if stage in (1, 2) else 0)
    terms = stage_bytes_per_param(4, 4, optimizer, stage, world_size)
    return {k: v * numel for k, v in terms.items()}


def stage_table(stages: dict) -> list[dict]:
    """Per stage, rank 0: computed and measured bytes (weights and optimizer after the step,
    gradients after backward)."""
    rows = []
    for rec in stages["ranks"][0]:
        stage = rec["stage"]
        computed = computed_stage_bytes(stage, stages["numel"], stages["world_size"])
        measured = {"weights": rec["phases"]["step"]["weights"],
                    "gradients": rec["phases"]["backward"]["gradients"],
                    "optimizer": rec["phases"]["step"]["optimizer"]}
        rows.append({"stage": stage, "computed": computed, "measured": measured,
                     "activations": rec["phases"]["forward"]["activations"]})
    return rows


def format_stage_memory(stages: dict) -> str:
    """``stage_table`` as text: per stage, computed / measured bytes of each term on rank 0."""
    rows = [{"stage": STAGE_NAMES[r["stage"]],
             **{k: f"{r['computed'][k]:,.0f} / {r['measured'][k]:,}"
                for k in ("weights", "gradients", "optimizer")},
             "activations": f"{r['activations']:,}"} for r in stage_table(stages)]
    return (f"W = {stages['world_size']}, {stages['numel']:,} float32 parameters; bytes on rank 0 "
            f"(computed / measured)\n" + format_table(rows))


def volume_rows(stages: dict) -> list[dict]:
    """Per scheme, rank 0: collectives and bytes of the step, and the volume in units of Psi."""
    psi = stages["numel"] * stages["element_size"]
    rows = []
    for (name, paper), comms in zip(PAPER_VOLUME.items(), stages["comms"][0]):
        moved = sum((2 if c.op == "all_reduce" else 1) * c.bytes for c in comms)
        ops = {}
        for c in comms:
            ops[c.op] = ops.get(c.op, 0) + 1
        rows.append({"scheme": name, "ops": ops, "bytes": moved, "psi": moved / psi,
                     "paper": paper})
    return rows


def _predicted(predict, scheme: str, stages: dict) -> str:
    """``predict(scheme, block_numels, world_size, itemsize)``'s bytes (the lab's prediction
    exercise), or a dash while it is not written yet."""
    try:
        got = predict(scheme, list(stages["block_numels"]), stages["world_size"],
                      stages["element_size"])
        return f"{int(got):,}"
    except NotImplementedError:
        return "-"


def format_volume(stages: dict, predict=None) -> str:
    """``volume_rows`` as text: the step's collectives and bytes on rank 0, measured and the
    paper's volume in units of Psi; with ``predict``, its bytes beside the measured ones."""
    return format_table([{"scheme": r["scheme"],
                          "collectives per step": ", ".join(f"{n} {op}"
                                                            for op, n in sorted(r["ops"].items())),
                          **({"predicted": _predicted(predict, r["scheme"], stages)} if predict
                             else {}),
                          "bytes moved": f"{r['bytes']:,}", "measured": f"{r['psi']:.2f}Ψ",
                          "paper": f"{r['paper']}Ψ"} for r in volume_rows(stages)])
