"""Lab 12, Section 2: save and load with ``torch.distributed.checkpoint``, and resharding (the
judge serves only ``distlab.checks.lab12``'s ``check_*``: ``check_resharding`` there calls
``grade_resharding`` here).

``save(model, optimizer, folder)`` and ``load(model, optimizer, folder)`` for the FSDP2
``Trainer``'s model and AdamW. They take the model and the optimizer, never Section 1's state, so
a mistake there cannot cost this test.

The judge draws a whole state (parameters, AdamW's moments and step counts:
``shards.drawn_state``) and hands each writer its own rows of it (``PerRank``: the rows FSDP2 gives
that rank), which the rank installs in a trainer and saves with the student's ``save`` into a
folder of its own: in grading, a rank may write nowhere else. The judge merges the folders
(``layout.merge_rank_folders``) and reads, outside the ranks, what the save made: a DCP checkpoint
(``.metadata``) whose shards every writer wrote itself (``layout.writers``). Then readers of the
other world size, each a fresh trainer, get the checkpoint's files and ``load`` them; each returns
what it holds, and the judge compares it, row for row, with the rows of the drawn state that rank
owns now, exactly (a load copies bytes).

Both ways in three launches: 2 ranks save state A; 4 ranks load it (2 -> 4) and, in the same
launch, save state B; 2 ranks load that (4 -> 2). A is for the lab's model, B for one whose
widths 4 does not divide (FSDP2's last of 4 ranks then holds fewer rows, or none). There is no
hidden case: the call without a seed draws both states from a seed of the system's, new at every
call (said in the verdict), so nothing in the check can be known ahead and written in (with a
fixed seed, a load could draw the state itself with ``drawn_state`` and ignore the files), and a
second call would cost three launches more. A seed (tests) draws both states and A's widths.
"""
from __future__ import annotations

import os
import shutil
import tempfile

from distlab.checks.assertions import CheckFailed
from distlab.checks.rank_failures import ranks_failed
from distlab.checks.ranks import rank_timeout
from distlab.labs.checkpoint.layout import merge_rank_folders, writers as writers_of
from distlab.labs.checkpoint.refusals import CheckpointRefused
from distlab.labs.checkpoint.run_state import RunSpec
from distlab.labs.checkpoint.shards import (FOLDER_PREFIX, drawn_state, load_files,
                                            load_then_save, row_range, rows_of, save_drawn,
                                            state_rows)
from distlab.runtime.per_rank import PerRank, reference

MAX_BYTES = 32 << 20      # a checkpoint of this model is tens of kilobytes
UNEVEN = ((6, 10), (10, 6), (6, 14), (10, 18))   # (d, hidden): widths 4 does not divide


def _cases(seed):
    """[(spec, the drawn state's seed, writers, readers)] of the two legs, and where."""
    import random
    base = random.SystemRandom().randrange(1 << 30) if seed is None else seed
    d, hidden = UNEVEN[0 if seed is None else seed % len(UNEVEN)]
    legs = [(RunSpec(), base, 2, 4), (RunSpec(d=d, hidden=hidden), base + 1, 4, 2)]
    return legs, (f"the check's states, drawn now (seed {base})" if seed is None
                  else f"fresh states (seed {seed})")


def _run(fn, world_size, what, *args, hint=""):
    import distlab
    from distlab.runtime.outcome import DistributedError
    try:
        return distlab.run(fn, world_size, *args, backend="gloo", timeout=rank_timeout())
    except DistributedError as err:
        raise ranks_failed(what, err, DCP_HINT if "CheckpointException" in str(err) else hint) \
            from None


def _reading(writers: int, readers: int) -> str:
    return (f"This load reads on {readers} ranks a checkpoint {writers} ranks wrote: each rank's "
            f"rows of a tensor are none of the writers' (not even as many, where {readers} does "
            f"not divide a width). Ask the checkpoint for the rows this rank owns now, by each "
            f"tensor's name and global shape: DCP reads them from the writers' chunks when you "
            f"load into this run's own state dicts.")


DCP_HINT = ("torch.distributed.checkpoint refused the save or the load. Every rank must call "
            "dcp.save (and dcp.load) with the same keys: its own shards of every tensor, as "
            "DTensors (get_state_dict gives them), so that together they tile each tensor.")


def _is_own(folder, rank: int) -> bool:
    """Whether ``folder`` is one rank ``rank`` made for its save (``shards.save_drawn``): the
    rank's own folder, not a link to another (whose files the checker would read)."""
    return (isinstance(folder, str) and os.path.isdir(folder) and not os.path.islink(folder)
            and os.path.basename(folder).startswith(f"{FOLDER_PREFIX}{rank}-"))


def _remove(folders: list) -> None:
    """The writers' folders removed, those that are theirs (``_is_own``) only."""
    for rank, folder in enumerate(folders):
        if _is_own(folder, rank):
            shutil.rmtree(folder, ignore_errors=True)


def _folders(out, world_size: int) -> list[str]:
    """The folders the writers report, each checked to be one the rank made for its save."""
    folders = []
    for rank in range(world_size):
        folder = out[rank]
        if not _is_own(folder, rank):
            _remove([out[r] for r in range(world_size)])
            raise CheckFailed(f"rank {rank}'s save left no folder of its own ({folder!r})")
        folders.append(folder)
    return folders


def _plain_files(folders: list[str], what: str) -> None:
    """Every entry of the writers' folders is a plain file of the folder's own: the checker
    reads them and hands them on to the readers, so a link (to a file the ranks may not read)
    or a folder is refused, never followed."""
    import stat
    for rank, folder in enumerate(folders):
        for name in sorted(os.listdir(folder)):
            if not stat.S_ISREG(os.lstat(os.path.join(folder, name)).st_mode):
                raise CheckFailed(f"{what}: rank {rank}'s save left {name!r}, which is not a "
                                  f"plain file (a link or a folder); a checkpoint is the files "
                                  f"dcp.save writes")


def _merged_files(folders: list[str], world_size: int, what: str) -> dict[str, bytes]:
    """The writers' folders merged into one checkpoint, checked and read: name -> bytes. The
    folders (the ranks' own, made for this check) and the merged copy are removed."""
    root = tempfile.mkdtemp(prefix="lab12-merge-")
    try:
        _plain_files(folders, what)
        total = sum(os.path.getsize(os.path.join(f, n)) for f in folders for n in os.listdir(f))
        if total > MAX_BYTES:
            raise CheckFailed(f"{what}: the ranks wrote {total:,} bytes; this model's checkpoint "
                              f"is tens of kilobytes")
        try:
            merged = merge_rank_folders(folders, os.path.join(root, "checkpoint"))
        except CheckpointRefused as err:
            raise CheckFailed(f"{what}: the merged folders are no checkpoint DCP can read: "
                              f"{err.reason}") from None
        except (ValueError, OSError) as err:
            raise CheckFailed(f"{what}: {err}. save must write with dcp.save: rank r writes "
                              f"__r_0.distcp into its folder and the coordinator .metadata "
                              f"(the checker gives each rank a folder of its own).") from None
        count = writers_of(merged)
        if count != world_size:
            raise CheckFailed(f"{what}: the checkpoint's metadata names {count} shard file(s) for "
                              f"{world_size} ranks. Every rank writes its own shards (dcp.save on "
                              f"every rank, each with its own state dict).")
        return {name: open(os.path.join(merged, name), "rb").read()
                for name in sorted(os.listdir(merged))}
    finally:
        shutil.rmtree(root, ignore_errors=True)
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)


def _label(key: str) -> str:
    """ "0.lin1.weight.exp_avg" -> "AdamW's exp_avg of 0.lin1.weight"."""
    for kind in ("exp_avg_sq", "exp_avg", "step"):
        if key.endswith(f".{kind}"):
            return f"AdamW's {kind} of {key.removesuffix('.' + kind)}"
    return key


WRONG_ROWS = ("The values are the checkpoint's but not this rank's rows. With {readers} ranks "
              "rank r owns other rows of every tensor than the writer of the same number did: "
              "each rank must ask for the rows it owns now, by the tensor's name and global "
              "shape (DCP does, from the metadata, when you load into DTensor state dicts), "
              "never a slice of the writers' shards laid end to end.")


OTHER_LAYOUT = ("A shard of the writers' layout came back as it was saved: a state dict written "
                "with torch.save and read with torch.load keeps the rows its writer held, and "
                "one rank's save holds one rank's rows. Save every rank's shards of the model "
                "and of AdamW's state with dcp.save, and load them into this run's own state "
                "dicts, so that each rank gets the rows it owns now.")
NOT_LOADED = ("These are the fresh trainer's own values (its initial weights; AdamW's state as a "
              "fresh optimizer makes it, zeros): nothing of the checkpoint reached them. After "
              "dcp.load fills your state dict, put it back into the model and the optimizer.")


def _fresh(spec: RunSpec, key: str, rows, rank: int, readers: int) -> bool:
    """Whether ``rows`` are what rank ``rank`` of a fresh trainer holds for ``key``: its
    initial weights' rows, or AdamW's zeros."""
    import torch
    initial = dict(spec.model().named_parameters()).get(key)
    if initial is not None:
        return torch.equal(rows, rows_of(initial.detach(), rank, readers))
    return rows.numel() > 0 and not bool(rows.any())


def _compare(back, expected, readers: int, what: str, spec: RunSpec) -> int:
    """Each reader's rows against the drawn state's; the number of entries compared."""
    import torch
    compared = 0
    for rank in range(readers):
        mine = back[rank]
        for key, value in expected.items():
            got = mine.get(key)
            start, stop = row_range(value, rank, readers) if value.dim() else (0, 0)
            rows = f" (rows {start} to {stop - 1} of {value.shape[0]})" if value.dim() else ""
            where = f"{what}: rank {rank}'s {_label(key)}{rows}"
            if got is None:
                raise CheckFailed(f"{where} is missing after load: the optimizer holds no state "
                                  f"for it. Save AdamW's state beside the model's, every "
                                  f"rank its own, and load it back.")
            want = state_rows({key: value}, rank, readers)[key]
            if got.shape != want.shape or got.dtype != want.dtype:
                raise CheckFailed(f"{where}: shape {list(got.shape)}, {got.dtype}; this rank "
                                  f"holds {list(want.shape)}, {want.dtype}.\n{OTHER_LAYOUT}")
            if not torch.equal(got, want):
                hint = (NOT_LOADED if _fresh(spec, key, got, rank, readers)
                        else WRONG_ROWS.format(readers=readers))
                raise CheckFailed(f"{where} differs from what the writers saved "
                                  f"({int((got != want).sum())} of {want.numel()} values).\n"
                                  f"{hint}")
            compared += 1
    return compared


def _leg(spec, writers, readers, where) -> str:
    return (f"{writers} ranks -> {readers}, widths {spec.d} and {spec.hidden} "
            f"({where})")


def grade_resharding(save, load, seed=None) -> str:
    """2 ranks save a drawn state, 4 load it and save another, 2 load that (module doc): every
    save a DCP checkpoint of every writer's shards, every reader holding its rows exactly."""
    __tracebackhide__ = True  # noqa: F841
    legs, where = _cases(seed)
    (spec_a, seed_a, w_a, r_a), (spec_b, seed_b, w_b, r_b) = legs
    state_a, state_b = drawn_state(spec_a, seed_a), drawn_state(spec_b, seed_b)
    what_a, what_b = (_leg(spec_a, w_a, r_a, where), _leg(spec_b, w_b, r_b, where))
    out = _run(save_drawn, w_a, f"save on {w_a} ranks ({what_a})", save,
               PerRank([state_rows(state_a, r, w_a) for r in range(w_a)]), spec_a)
    files_a = _merged_files(_folders(out, w_a), w_a, f"save on {w_a} ranks ({what_a})")
    out = _run(load_then_save, r_a, f"load ({what_a}), then save on {w_b} ranks ({what_b})",
               load, files_a, spec_a, save,
               PerRank([state_rows(state_b, r, w_b) for r in range(w_b)]), spec_b,
               hint=_reading(w_a, r_a))
    try:
        compared = _compare([o["loaded"] for o in out], reference(state_a), r_a,
                            f"save and load, {what_a}", spec_a)
    except CheckFailed:
        _remove([o["folder"] for o in out])      # the second save's, never merged
        raise
    files_b = _merged_files(_folders([o["folder"] for o in out], w_b), w_b,
                            f"save on {w_b} ranks ({what_b})")
    back = _run(load_files, r_b, f"load on {r_b} ranks ({what_b})", load, files_b, spec_b,
                hint=_reading(w_b, r_b))
    compared += _compare(back, reference(state_b), r_b, f"save and load, {what_b}", spec_b)
    sizes = "; ".join(f"{len(f)} files, {sum(map(len, f.values())):,} bytes from {w} writers"
                      for f, w in ((files_a, w_a), (files_b, w_b)))
    return (f"saved on 2 ranks, loaded on 4; saved on 4, loaded on 2 ({where}; the lab's "
            f"model, then widths {spec_b.d} and {spec_b.hidden}): every rank wrote its own shards "
            f"({sizes}, DCP metadata naming each writer); after each load every rank holds "
            f"exactly its rows of every parameter and of AdamW's state ({compared} tensors)")
