"""One training step of a rank of Lab 7's mesh run (``distlab.labs.mesh.train_on_mesh``) and
its loss: plain forward and backward, or one 1F1B pipeline step over two micro-batches."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def token_cross_entropy(logits, targets):
    """Mean cross-entropy of the next-token targets: logits (B, T, V), targets (B, T)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))  # (B*T, V)


def replica_step(stage):
    """Without pipelining: forward and backward of this replica's share of the batch."""
    def step(x, y):
        loss = token_cross_entropy(stage(x), y)
        loss.backward()
        return loss
    return step


def _half_loss(logits, targets):
    """A micro-batch's share of the step's mean loss, one of two micro-batches."""
    return token_cross_entropy(logits, targets) / 2


def pipeline_step(stage, shape: MeshShape, pp_i: int, mesh, device, cfg: TinyConfig):
    """A function (tokens, targets) -> mean loss (last stage) or None (other stages) that runs
    one 1F1B pipeline step with two micro-batches; backward runs inside the schedule."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    first, last = pp_i == 0, pp_i == shape.pp - 1
    # What a stage takes and gives per micro-batch, stated: unstated, the first step runs every
    # stage on fake tensors and passes the shapes along, a third of an 8-rank run's CPU time.
    # (Activations and logits require grad: their gradients go back along the pipeline.)
    rows = cfg.batch // shape.dp // 2
    inputs = torch.empty(rows, cfg.seq, dtype=torch.long, device="meta") if first else \
        torch.empty(rows, cfg.seq, cfg.dim, device="meta", requires_grad=True)
    outputs = torch.empty(rows, cfg.seq, cfg.vocab if last else cfg.dim, device="meta",
                          requires_grad=True)
    pipe = PipelineStage(stage, pp_i, shape.pp, device, input_args=inputs, output_args=outputs,
                         group=mesh["pp"].get_group())
    # Each micro-batch's loss divided by m = 2, not each gradient after backward (the schedule's
    # default): the same update (a power of two scales exactly), without a division of every
    # gradient, a DTensor op whose sharding each rank's first step works out afresh.
    schedule = Schedule1F1B(pipe, n_microbatches=2, loss_fn=_half_loss, scale_grads=False)

    def step(x, y):
        losses = []
        args = (x,) if first else ()
        kwargs = {"target": y, "losses": losses} if last else {}
        schedule.step(*args, **kwargs)
        return torch.stack(losses).sum() if last else None    # the mean of the two micro-batches

    return step
