"""nbgrader in a grading worker without its repeated work (distlab.grading.nbgrader_plugins
.faster_nbgrader): the same validation errors, the same gradebook; and the feedback's one-time
costs paid in the worker server (``warm_up_feedback``): the same page."""
import copy
import subprocess
import sys
import textwrap

import jsonschema
import pytest

from distlab.grading.nbgrader_plugins import faster_nbgrader


@pytest.fixture(scope="module")
def faster():
    from nbgrader import api
    from nbgrader.nbgraderformat import common
    before = (common.jsonschema, api.create_engine)
    faster_nbgrader()
    faster_nbgrader()   # idempotent: wrapped once
    yield common
    common.jsonschema, api.create_engine = before


GOOD = {"grade": True, "grade_id": "test_x", "locked": True, "points": 3, "schema_version": 3,
        "solution": False, "task": False}
BAD = [{**GOOD, "points": "three"}, {**GOOD, "grade_id": 7}, {**GOOD, "locked": None},
       {**GOOD, "grade": 1, "solution": []}, {**GOOD, "points": -1, "grade_id": 2.5}]


def _error(validate, meta, schema):
    try:
        validate(copy.deepcopy(meta), schema)
    except jsonschema.ValidationError as exc:
        return exc.message, list(exc.path), list(exc.schema_path)
    return None


def test_cell_metadata_validates_as_with_jsonschema_s_own_validate(faster):
    from nbgrader.nbgraderformat import MetadataValidator
    schema = MetadataValidator().schema
    assert faster.jsonschema.validate is not jsonschema.validate
    for meta in [GOOD, *BAD]:
        assert _error(faster.jsonschema.validate, meta, schema) == \
            _error(jsonschema.validate, meta, schema), meta
    assert all(_error(faster.jsonschema.validate, meta, schema) for meta in BAD)
    assert faster.jsonschema.ValidationError is jsonschema.ValidationError


def test_gradebooks_of_one_database_share_an_engine_and_its_data(faster, tmp_path):
    from nbgrader.api import Gradebook
    from distlab.grading.schema_version import read_not_run
    read_not_run()   # as the worker does (course_dir.nbgrader_api): no alembic command
    url = f"sqlite:///{tmp_path / 'gradebook.db'}"
    with Gradebook(url, "distlab") as first:
        first.add_student("alice", first_name="Alice")
        engine = first.engine
    with Gradebook(url, "distlab") as second:   # the first one's engine, disposed of: reopened
        assert second.engine is engine
        assert [s.id for s in second.students] == ["alice"]
        second.add_student("bob")
    with Gradebook(f"sqlite:///{tmp_path / 'other.db'}", "distlab") as other:
        assert other.engine is not engine and other.students == []
    with Gradebook(url, "distlab") as third:
        assert sorted(s.id for s in third.students) == ["alice", "bob"]


def test_a_feedback_page_is_the_same_after_the_warm_up():
    # In a fresh interpreter: the first page made cold, then the warm-up, then the same page.
    code = textwrap.dedent("""
        import nbformat, sys
        from distlab import paths
        from distlab.grading.nbgrader_plugins import feedback_page, warm_up_feedback
        lab = "06_timelines"
        nb = nbformat.read(paths.notebooks() / lab / f"{lab}.ipynb", as_version=4)
        nb.metadata["language_info"] = {"name": "python", "pygments_lexer": "ipython3"}
        for cell in nb.cells:   # what nbgrader's GetGrades adds
            cell.metadata.get("nbgrader", {}).update(score=0, comment=None)
        cold = feedback_page(nb, lab)
        assert warm_up_feedback()
        assert feedback_page(nb, lab) == cold
        assert len(cold) > 100_000, len(cold)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
