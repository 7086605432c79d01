"""What a checkpoint folder holds: the files the ranks wrote and the metadata that lets another
world size read them (``FileSystemReader(folder).read_metadata()``)."""
from __future__ import annotations

import os

from distlab.labs.checkpoint.refusals import read_metadata


def files_written(folder: str) -> list[dict]:
    """One row per file in the folder: name and bytes (``__r_0.distcp``: rank r's shards)."""
    return [{"file": name, "bytes": os.path.getsize(os.path.join(folder, name))}
            for name in sorted(os.listdir(folder))]


def tensor_chunks(folder: str) -> list[dict]:
    """One row per tensor chunk the metadata maps: the key, its global shape, the chunk's offsets
    and sizes in it, and the file and bytes it lies in. Objects (RNG states, the step) are rows
    with no shape. This map is what resharding reads: a rank of another world size asks for the
    part of the global tensor its own shard covers, and the chunks that overlap it are read."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    metadata = read_metadata(folder)
    rows = []
    for index, info in sorted(metadata.storage_data.items(),
                              key=lambda kv: (kv[0].fqn, tuple(kv[0].offset or ()))):
        meta = metadata.state_dict_metadata[index.fqn]
        tensor = isinstance(meta, TensorStorageMetadata)
        chunk = next((c for c in meta.chunks if tuple(c.offsets) == tuple(index.offset)), None) \
            if tensor else None
        rows.append({"key": index.fqn,
                     "global shape": tuple(meta.size) if tensor else None,
                     "offsets": tuple(chunk.offsets) if chunk is not None else None,
                     "sizes": tuple(chunk.sizes) if chunk is not None else None,
                     "file": info.relative_path, "bytes": info.length})
    return rows


def writers(folder: str) -> int:
    """How many ranks wrote the checkpoint: the distinct shard files its metadata names."""
    return len({info.relative_path for info in read_metadata(folder).storage_data.values()})


def merge_rank_folders(folders: list[str], into: str) -> str:
    """One checkpoint folder from the folders the ranks of one save wrote to, each its own (a
    rank confined to a folder of its own, as the grader runs a student's ranks, cannot write
    where the others do; DCP lets every rank pass its own path: rank r writes ``__r_0.distcp``
    there and the coordinator ``.metadata``). Copies; refuses a name two folders hold, and an
    ``into`` that exists. Returns ``into``, ready for ``load_checkpoint`` on any world size."""
    import shutil
    if os.path.exists(into):
        raise FileExistsError(f"{into} exists: merge into a new folder (nothing is overwritten)")
    sources: dict[str, str] = {}
    for folder in folders:
        for name in sorted(os.listdir(folder)):
            if name in sources:
                raise ValueError(f"{name} is in both {sources[name]} and {folder}: these are not "
                                 f"the folders of one save's ranks")
            sources[name] = folder
    if ".metadata" not in sources:
        raise ValueError(f"none of {folders} holds .metadata: the save did not finish")
    os.makedirs(into)
    for name, folder in sources.items():
        shutil.copy2(os.path.join(folder, name), os.path.join(into, name))
    read_metadata(into)
    return into
