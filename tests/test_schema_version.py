"""A new gradebook's schema version, read from nbgrader's migration scripts instead of asked of a
fresh ``alembic`` interpreter (distlab/grading/schema_version.py)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from distlab.grading import schema_version


def test_the_head_read_is_the_one_alembic_gives():
    from nbgrader.dbutil import _temp_alembic_ini
    alembic = str(Path(sys.executable).parent / "alembic")
    with _temp_alembic_ini("sqlite:////tmp/unused-gradebook.db") as ini:
        told = subprocess.check_output([alembic, "-c", ini, "heads"], text=True)
    assert schema_version.head() is not None
    assert told.split()[0] == schema_version.head()


def _scripts(folder: Path, chain: dict) -> Path:
    for revision, parent in chain.items():
        (folder / f"{revision}_step.py").write_text(
            f'"""a step"""\nrevision = {revision!r}\ndown_revision = {parent!r}\n\n'
            f"def upgrade():\n    pass\n")
    return folder


def test_a_chain_has_one_head_and_anything_else_none(tmp_path):
    chain = tmp_path / "chain"
    chain.mkdir()
    assert schema_version.head(_scripts(chain, {"a1": None, "b2": "a1", "c3": "b2"})) == "c3"
    branched = tmp_path / "branched"
    branched.mkdir()
    assert schema_version.head(_scripts(branched, {"a1": None, "b2": "a1", "x9": "a1"})) is None
    unplain = tmp_path / "unplain"
    unplain.mkdir()
    _scripts(unplain, {"a1": None})
    (unplain / "b2_step.py").write_text("revision = make_revision()\ndown_revision = 'a1'\n")
    assert schema_version.head(unplain) is None


def test_a_new_gradebook_records_the_version_without_a_subprocess(tmp_path, monkeypatch):
    import nbgrader.api
    from sqlalchemy import text

    def no_subprocess(*args, **kwargs):
        raise AssertionError(f"nbgrader started {args[0]}")
    monkeypatch.setattr(nbgrader.api.sp, "check_output", no_subprocess)
    monkeypatch.setattr(nbgrader.api, "get_alembic_version", nbgrader.api.get_alembic_version)
    schema_version.read_not_run()
    with nbgrader.api.Gradebook(f"sqlite:///{tmp_path / 'gradebook.db'}", "distlab") as gb:
        recorded = gb.db.execute(text("SELECT version_num FROM alembic_version")).scalar()
    assert recorded == schema_version.head()


def test_where_nothing_reads_plainly_nbgrader_asks_alembic_as_before(monkeypatch):
    import nbgrader.api
    monkeypatch.setattr(nbgrader.api, "get_alembic_version", lambda: "asked")
    monkeypatch.setattr(schema_version, "head", lambda: None)
    schema_version.read_not_run()
    assert nbgrader.api.get_alembic_version() == "asked"


def test_installing_twice_wraps_once(monkeypatch):
    import nbgrader.api
    monkeypatch.setattr(nbgrader.api, "get_alembic_version", nbgrader.api.get_alembic_version)
    schema_version.read_not_run()
    first = nbgrader.api.get_alembic_version
    schema_version.read_not_run()
    assert nbgrader.api.get_alembic_version is first
