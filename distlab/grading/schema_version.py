"""The version of nbgrader's gradebook schema, read from its migration scripts.

A new gradebook records the schema version it was made with. nbgrader finds it by running the
``alembic heads`` command: a fresh interpreter that loads the migrations, 2-3 CPU-seconds for every
new gradebook (each grading run's template, each Slurm shard, each release). The version is the
one migration that no other names as its parent, and each script states both in a line of its own
(``revision = '...'``, ``down_revision = '...'``), so reading them gives the same answer in
milliseconds. Where the scripts do not read that way (another nbgrader), nbgrader's own way runs.
"""
from __future__ import annotations

import functools
import re
from pathlib import Path

_REVISION = re.compile(r"^revision\s*=\s*['\"](\w+)['\"]\s*$", re.M)
_PARENTS = re.compile(r"^down_revision\s*=\s*(.*)$", re.M)


@functools.lru_cache(maxsize=None)
def head(versions: Path | None = None) -> str | None:
    """The head revision of the migration scripts in ``versions`` (nbgrader's by default); None
    when a script does not state its revision and parent plainly, or there is not exactly one."""
    if versions is None:
        import nbgrader.dbutil
        versions = Path(nbgrader.dbutil.ALEMBIC_DIR) / "versions"
    revisions, parents = set(), set()
    for script in sorted(versions.glob("*.py")):
        text = script.read_text()
        revision, parent = _REVISION.findall(text), _PARENTS.findall(text)
        if len(revision) != 1 or len(parent) != 1:
            return None
        revisions.add(revision[0])
        parents.update(re.findall(r"['\"](\w+)['\"]", parent[0]))
    heads = revisions - parents
    return heads.pop() if len(heads) == 1 and parents <= revisions else None


def read_not_run() -> None:
    """Make nbgrader take the schema version from ``head`` (its own subprocess where that finds
    none) in this process, for every gradebook it makes from now on."""
    import nbgrader.api
    if getattr(nbgrader.api.get_alembic_version, "_read_not_run", False):
        return
    run = nbgrader.api.get_alembic_version

    def get_alembic_version() -> str:
        return head() or run()
    get_alembic_version._read_not_run = True
    nbgrader.api.get_alembic_version = get_alembic_version
