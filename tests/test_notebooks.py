"""Every lab's source is fit to grade, its student version is what `distlab build` makes (with no
solution or hidden test in it), and its stored references are what `distlab references` makes."""
from __future__ import annotations

import json

import pytest

from distlab.course import notebooks

from distlab.course import references

LABS = notebooks.labs()


@pytest.fixture(scope="module")
def built():
    """One nbgrader build of every lab (it costs seconds per lab)."""
    return notebooks.build_student_notebooks(LABS)


@pytest.mark.parametrize("lab", LABS)
def test_nbgrader_metadata(lab):
    assert notebooks.lint(lab) == []


@pytest.mark.parametrize("lab", LABS)
def test_student_notebook_up_to_date(built, lab):
    assert notebooks.stale(lab, built[lab]) == [], \
        f"notebooks/{lab}/ differs from its source; run `distlab build {lab}`"


@pytest.mark.parametrize("lab", LABS)
def test_no_solution_or_hidden_test_in_student_notebook(built, lab):
    assert notebooks.leaks(lab, built[lab][f"{lab}.ipynb"]) == []


@pytest.mark.parametrize("lab", LABS)
def test_student_notebook_has_no_outputs(built, lab):
    nb = json.loads(built[lab][f"{lab}.ipynb"])
    assert all(not c.get("outputs") and c.get("execution_count") is None
               for c in nb["cells"] if c["cell_type"] == "code")


@pytest.mark.stored_data
@pytest.mark.parametrize("lab", references.labs_with_references())
def test_references_reproducible(lab, course_references):
    """data/<lab> is what make_references() gives on this machine: what README.md's
    `make references` wrote afresh in the session's copy of the course (conftest.py's
    ``course_references``), compared with the checkout's."""
    problems = references.differences(lab, made=course_references)
    assert not problems, (f"data/{lab}/ is not what make_references() gives; run "
                          f"`distlab references {lab}`:\n" + "\n".join(problems))


def test_reproducibility_check_sees_a_changed_value(tmp_path, monkeypatch):
    lab = references.labs_with_references()[0]
    module = references.checks_module(lab)
    original = module.make_references

    def shifted():
        sets = original()
        name = sorted(sets)[0]
        key = next(k for k, v in sets[name].items() if k != "seed" and v.is_floating_point())
        sets[name][key] = sets[name][key] + 1e-3
        return sets

    monkeypatch.setattr(module, "make_references", shifted)
    assert any("Tensor-likes are not close" in p or "differ" in p for p in references.differences(lab))


def test_lint_catches_broken_metadata(monkeypatch):
    import nbformat
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("x = 1"),  # no metadata
        nbformat.v4.new_code_cell("### BEGIN SOLUTION\ny = 2"),  # unbalanced
        nbformat.v4.new_code_cell("check()"),  # test, unlocked, no points
    ]
    nb.cells[1].metadata["nbgrader"] = {"grade_id": "a", "solution": True, "grade": False, "locked": False}
    nb.cells[2].metadata["nbgrader"] = {"grade_id": "a", "solution": False, "grade": True, "locked": False}
    monkeypatch.setattr(notebooks, "source_notebook", lambda lab: nb)
    problems = "\n".join(notebooks.lint("x"))
    for expected in ("without nbgrader metadata", "without '### END SOLUTION'", "used twice",
                     "without positive points", "test cell not locked"):
        assert expected in problems


def test_references_refuse_a_tampered_file(tmp_path):
    lab = "01_collectives"
    folder = tmp_path / lab
    folder.mkdir()
    for f in (references.DATA / lab).iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    assert "expected" in references.load(lab, "all_reduce_ws2", data=tmp_path)
    blob = bytearray((folder / "all_reduce_ws2.pt").read_bytes())
    blob[-30] ^= 1
    (folder / "all_reduce_ws2.pt").write_bytes(bytes(blob))
    with pytest.raises(ValueError, match="sha256"):
        references.load(lab, "all_reduce_ws2", data=tmp_path)


def test_course_folder_is_where_the_nbgrader_config_looks():
    """`distlab build` fills nbgrader's source folder and gradebook for the formgrader: they must
    be the ones grader/nbgrader_config.py names."""
    from pathlib import Path

    from traitlets.config.loader import PyFileConfigLoader
    cfg = PyFileConfigLoader("nbgrader_config.py", path=str(notebooks.REPO / "grader")).load_config()
    root = Path(cfg.CourseDirectory.root)
    assert root / cfg.CourseDirectory.source_directory == notebooks.COURSE_SOURCE
    assert cfg.CourseDirectory.db_url == f"sqlite:///{notebooks.GRADEBOOK}"


def test_the_source_notebook_is_parsed_once_per_text_and_never_shared(tmp_path, monkeypatch):
    # course_dir.source_notebook keeps the parse of each source text (the suite's samples ask
    # for the same labs hundreds of times): an edited source is read anew, and every caller gets
    # a notebook of its own to edit.
    from distlab import paths
    from distlab.grading import course_dir
    lab = LABS[0]
    source = tmp_path / f"{lab}.py"
    source.write_text(paths.lab_source(lab).read_text())
    monkeypatch.setattr(paths, "lab_source", lambda name: source)
    first, second = course_dir.source_notebook(lab), course_dir.source_notebook(lab)
    assert first == second and first is not second
    first.cells[0].source = "edited by one caller"
    assert course_dir.source_notebook(lab).cells[0].source == second.cells[0].source != \
        "edited by one caller"
    source.write_text(source.read_text().replace("# %% [markdown]", "# %% [markdown]\n# added", 1))
    edited = course_dir.source_notebook(lab)
    assert edited.cells[0].source.startswith("added") and edited != second


def test_the_build_reads_the_grader_s_template_made_once_per_version(tmp_path, monkeypatch):
    # build_student_notebooks reads nbgrader's release from the grader's template in the
    # checkout's build folder (intake.course_template): made once, then read, for as long as the
    # sources and nbgrader are the same (tests/test_grade_resume.py: a changed lab is made anew).
    from distlab import paths
    from distlab.grading import course_dir
    made = []
    generate = course_dir.generate

    def counted(labs, root):
        made.append(list(labs))
        return generate(labs, root)
    monkeypatch.setattr(course_dir, "generate", counted)
    monkeypatch.setattr(notebooks, "generate", counted)
    monkeypatch.setattr(paths, "build", lambda: tmp_path / "build")
    monkeypatch.setattr(notebooks, "_in_checkout", lambda: True)
    lab = LABS[0]
    first = notebooks.build_student_notebooks([lab])
    again = notebooks.build_student_notebooks([lab])
    assert made == [[lab]] and first == again
    assert notebooks.stale(lab, first[lab]) == []          # what the committed notebooks are
    # elsewhere (an installed course: ./build of the folder it runs in) a throw-away folder
    assert [p.parent.parent.name for p in (tmp_path / "build").glob("*/*/release")] == \
        ["grading-templates"]
    monkeypatch.setattr(paths, "build", lambda: tmp_path / "elsewhere" / "build")
    monkeypatch.setattr(notebooks, "_in_checkout", lambda: False)
    assert notebooks.build_student_notebooks([lab]) == first and len(made) == 2
    assert not (tmp_path / "elsewhere").exists()
