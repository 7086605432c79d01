"""The copy report's course side (similarity_course.py), computed once for given sources and kept.

Fingerprinting and compiling every function of the package's lab and check modules costs about
5 CPU-seconds, the same for every ``distlab grade`` run (and every Slurm shard) of an unchanged
course. So the result is kept in a JSON file named by a *key*: a digest of everything it is
computed from, namely the Python that tokenises and compiles (``sys.version``: ``ast.unparse`` and
bytecode change between versions), the code that computes it (this package's
``grading/similarity*.py``), and every source file read (its path in the package and its bytes).
A changed source, another interpreter or a changed algorithm is another key, computed afresh:
the file is never stale. The file is JSON, never pickle: reading it runs nothing.

Where: the user's cache folder, ``$XDG_CACHE_HOME/distlab`` (else ``~/.cache/distlab``), never a
checkout, a handout, a submissions folder or a grading workdir, so nothing a user made is ever
written over. A folder that cannot be written only costs the computation; a file that cannot be
read or parsed is computed again and replaced (written to a temporary file and renamed, so two
runs at once never read half a file). The ``KEEP`` most recently used files stay (two checkouts
of different versions side by side keep theirs); older ones are removed.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

PREFIX = "similarity-"          # the files here; nothing else in the folder is touched
KEEP = 8                        # files kept: the most recently used
ALGORITHM = tuple(sorted(Path(__file__).parent.glob("similarity*.py")))   # the code that computes


def cache_folder() -> Path | None:
    """``$XDG_CACHE_HOME/distlab``, else ``~/.cache/distlab``; None without a home."""
    base = os.environ.get("XDG_CACHE_HOME")
    if not base:
        try:
            base = Path.home() / ".cache"
        except RuntimeError:            # no HOME and no passwd entry: nowhere to keep it
            return None
    return Path(base) / "distlab"


def key(name: str, sources: Iterable[tuple[str, Path]]) -> str:
    """The digest of what a result named ``name`` is computed from: the interpreter, the
    algorithm's modules and ``sources`` ((label, path) pairs, in the order given)."""
    digest = hashlib.sha256(f"{name}\0{sys.version}\0".encode())
    for path in ALGORITHM:
        digest.update(f"{path.name}\0".encode() + path.read_bytes())
    for label, path in sources:
        digest.update(f"\0{label}\0".encode() + path.read_bytes())
    return f"{name}-{digest.hexdigest()[:32]}"


def cached(name: str, sources: Iterable[tuple[str, Path]], compute: Callable[[], dict],
           fields: tuple[str, ...] = ()) -> dict:
    """``compute()`` (a JSON-able dict with ``fields`` among its keys), read from the cache file
    of its key when there is one that has them."""
    where = cache_folder()
    path = where / f"{PREFIX}{key(name, sources)}.json" if where else None
    if path is not None:
        try:
            found = json.loads(path.read_text())
        except (OSError, ValueError):
            found = None                # none yet, or unreadable: computed and written again
        if isinstance(found, dict) and set(fields) <= set(found):
            try:
                os.utime(path)          # recently used: kept by _prune
            except OSError:
                pass                    # a file we may read but not touch: still the result
            return found
    result = compute()
    if path is not None:
        _store(path, result)
    return result


def _store(path: Path, result: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(result, f)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        _prune(path.parent)
    except OSError:
        pass                            # a folder we may not write: the result is not kept


def _prune(where: Path) -> None:
    """Keep the ``KEEP`` most recently used result files."""
    def used(p: Path) -> float:
        try:
            return p.stat().st_mtime
        except OSError:
            return 0.0
    files = sorted(where.glob(f"{PREFIX}*.json"), key=used, reverse=True)
    for old in files[KEEP:]:
        try:
            old.unlink()
        except OSError:
            pass
