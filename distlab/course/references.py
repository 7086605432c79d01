"""Stored reference outputs for the visible tests: ``distlab references [LAB...]``.

Each lab's checks module (``distlab.checks.labNN`` for lab ``NN_name``) has
``make_references() -> {name: {"seed": int, <key>: tensor, ...}}``: for each reference set, the
seed it was drawn from and the named tensors (inputs and the plain single-process result). This
command writes every set to ``data/<lab>/<name>.pt`` (``torch.save`` of the dict of tensors) and
``data/<lab>/manifest.json`` with the seed, the shape and dtype of every tensor, the torch version
and the sha256 of every file. A set the previous manifest named and the lab no longer makes is
deleted; a file no manifest named (not the command's) is left where it is.

Rebuilding gives the same seeds, shapes and dtypes, and the same values up to float rounding:
float32 matrix products change in their last bits with the BLAS build, the thread count and the
CPU's instruction set, and so do float32 random draws, so ``differences(lab)`` compares values
within ``distlab.checks.stored.tolerance``, not bytes.

Checks read a set with ``load(lab, name)``, which refuses a file whose sha256 is not the
manifest's: a stale or edited reference is an error, not a silent wrong grade.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import sys
from pathlib import Path

import torch

from distlab import paths
from distlab.checks import checks_module
# load: the reader of what this writes
from distlab.checks.stored import MANIFEST, load, tolerance  # noqa: F401

REPO = paths.root()
DATA = paths.data()
# The longest optimizer run a set stores (Labs 2 and 8: 3 AdamW steps): differences() does not
# know which tensors are trajectories, so it allows every one what such a run may carry.
TRAJECTORY_STEPS = 3


def serialize(tensors: dict[str, torch.Tensor]) -> bytes:
    buf = io.BytesIO()
    torch.save({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, buf)
    return buf.getvalue()


def make(lab: str) -> tuple[dict[str, bytes], dict]:
    """The files of ``data/<lab>/`` and its manifest, computed afresh (nothing written)."""
    sets = checks_module(lab).make_references()
    files, entries = {}, {}
    for name, content in sorted(sets.items()):
        tensors = {k: v for k, v in content.items() if k != "seed"}
        blob = serialize(tensors)
        files[f"{name}.pt"] = blob
        entries[f"{name}.pt"] = {
            "seed": content["seed"],
            "tensors": {k: {"shape": list(v.shape), "dtype": str(v.dtype).removeprefix("torch.")}
                        for k, v in tensors.items()},
            "sha256": hashlib.sha256(blob).hexdigest(),
        }
    manifest = {"lab": lab, "torch": torch.__version__.split("+")[0], "files": entries}
    return files, manifest


def write(lab: str, out: Path = DATA) -> Path:
    files, manifest = make(lab)
    folder = out / lab
    folder.mkdir(parents=True, exist_ok=True)
    for old in _previous_sets(folder):   # only what an earlier run wrote: a set dropped since
        if old not in files:
            (folder / old).unlink(missing_ok=True)
    for name, blob in files.items():
        (folder / name).write_bytes(blob)
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return folder


def _previous_sets(folder: Path) -> list[str]:
    """The reference files the folder's manifest names (none without one)."""
    try:
        return sorted(json.loads((folder / MANIFEST).read_text())["files"])
    except (OSError, ValueError, KeyError, TypeError):
        return []


def written(data: Path, lab: str) -> tuple[dict[str, bytes], dict]:
    """The files and manifest that ``write`` (`distlab references`) wrote for ``lab`` under
    ``data``: what ``make`` returns, read back."""
    manifest = json.loads((data / lab / MANIFEST).read_text())
    return {name: (data / lab / name).read_bytes() for name in manifest["files"]}, manifest


def differences(lab: str, made: Path | None = None) -> list[str]:
    """What differs between ``data/<lab>/`` and a fresh ``make_references()`` (or, with ``made``,
    the data folder a fresh `distlab references` wrote, in a copy of the course: the same
    computation, read back): missing or extra sets, other seeds, shapes or dtypes, or values
    beyond float rounding."""
    files, manifest = make(lab) if made is None else written(made, lab)
    stored = json.loads((DATA / lab / MANIFEST).read_text())["files"]
    problems = [f"{name}: only in {where}" for name, where in
                [(n, "data/") for n in stored if n not in files] +
                [(n, "make_references()") for n in files if n not in stored]]
    for name in sorted(set(files) & set(stored)):
        fresh = manifest["files"][name]
        if (fresh["seed"], fresh["tensors"]) != (stored[name]["seed"], stored[name]["tensors"]):
            problems.append(f"{name}: seed, shapes or dtypes differ")
            continue
        old = load(lab, name.removesuffix(".pt"))
        new = torch.load(io.BytesIO(files[name]), weights_only=True)
        for key, value in new.items():
            try:
                torch.testing.assert_close(value, old[key],
                                           **tolerance(old[key], steps=TRAJECTORY_STEPS))
            except AssertionError as err:
                problems.append(f"{name}[{key}]: {str(err).splitlines()[0]}")
    return problems


def labs_with_references() -> list[str]:
    """Labs whose checks module defines ``make_references``."""
    from distlab.course.notebooks import labs

    found = []
    for lab in labs():
        try:
            module = checks_module(lab)
        except ModuleNotFoundError:
            continue
        if hasattr(module, "make_references"):
            found.append(lab)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="distlab references",
        description="Write data/<lab>/ from distlab.checks.labNN.make_references(), with a manifest.")
    parser.add_argument("labs", nargs="*", metavar="LAB", help="labs (default: every lab that has references)")
    args = parser.parse_args(argv)
    for lab in args.labs or labs_with_references():
        folder = write(lab)
        manifest = json.loads((folder / MANIFEST).read_text())
        print(f"{lab}: wrote {len(manifest['files'])} reference sets to {folder.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
