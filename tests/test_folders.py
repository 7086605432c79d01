"""Nothing a user made is deleted: every command that writes a folder replaces (or writes into)
only a folder that is absent, empty or its own output (distlab.grading.folders), refuses any
other, naming it and leaving it as it was, and replaces it with --force.

The commands that write a folder, and what each does to one that exists:
- ``distlab release OUT``: replaces OUT whole if it is a previous handout (``.distlab-release``,
  or an older handout's README); otherwise refuses, unless ``--force``;
- ``distlab site --out`` (build/site): the same with ``.distlab-site`` (or an older site's
  index.html beside _static/twins.js); its scratch folder is a fresh temporary one beside it;
- ``distlab grade --workdir`` (./grading) and ``distlab merge --workdir``: write into a previous
  run's work directory (``.distlab-grade``, or its run.json or results/) or nbgrader's grading
  folder (only gradebook.db, submitted/, autograded/, feedback/, exchange/ in it), resuming as
  before; refuse any other folder with something in it (no --force: give another folder);
- ``distlab build``: writes notebooks/<lab>/ and build/source/<lab>/, refusing a lab whose
  folder holds a file the build does not write (JupyterLab's checkpoints aside), unless
  ``--force``;
- ``distlab references``: rewrites data/<lab>/'s sets and manifest, deleting only a set the
  previous manifest named; other files stay;
- ``bench/grading_scale.py --keep DIR``: writes into DIR if it is new, empty or an earlier --keep
  folder (``.distlab-grading-scale``), else refuses unless ``--force``.
``distlab doctor`` writes nothing. A whole handout is built and rebuilt by
tests/test_release.py; a grading run resuming in its own work directory is
tests/test_grade_resume.py's.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from distlab.course import notebooks, references, site
from distlab.grading import folders, grade, merge, records

REPO = Path(__file__).resolve().parents[1]
LAB1 = "01_collectives"


@pytest.fixture
def users(tmp_path) -> Path:
    """A folder a user made: their notes."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("my notes")
    return folder


def kept(folder: Path) -> bool:
    return (folder / "notes.txt").read_text() == "my notes"


# ---------------------------------------------------------------------------------------------
# The rule

def test_a_users_folder_is_refused_with_its_name_and_what_to_do(users):
    with pytest.raises(folders.FolderInUse) as info:
        folders.claim(users, "release")
    message = str(info.value)
    assert str(users) in message and "notes.txt" in message and "--force" in message
    assert "Nothing was changed" in message and kept(users)


def test_absent_empty_own_and_forced_folders_may_be_written(tmp_path, users):
    folders.claim(tmp_path / "new", "site")
    (tmp_path / "empty").mkdir()
    folders.claim(tmp_path / "empty", "site")
    folders.claim(users, "site", force=True)
    folders.mark(users, "site")
    folders.claim(users, "site")                       # its own output now
    with pytest.raises(folders.FolderInUse):           # another command's is not
        folders.claim(users, "release")
    assert "distlab site" in folders.marker(users, "site").read_text()


def test_a_file_is_never_replaced_even_with_force(tmp_path):
    path = tmp_path / "scores"
    path.write_text("a file")
    with pytest.raises(folders.FolderInUse, match="is a file, not a folder"):
        folders.claim(path, "release", force=True)
    assert path.read_text() == "a file"


# ---------------------------------------------------------------------------------------------
# release OUT (a handout is built and rebuilt by tests/test_release.py)

def test_release_refuses_a_users_folder_before_building(users):
    done = subprocess.run([sys.executable, "-m", "distlab.cli", "release", str(users)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and str(users) in done.stderr and "--force" in done.stderr
    assert sorted(p.name for p in users.iterdir()) == ["notes.txt"] and kept(users)


def test_release_help_says_when_out_is_replaced():
    done = subprocess.run([sys.executable, "-m", "distlab.cli", "release", "--help"],
                          capture_output=True, text=True, timeout=300)
    text = " ".join(done.stdout.split())
    assert "replaced whole only when it is a previous handout" in text and "--force" in text


def test_a_handout_made_before_the_marker_is_still_a_handout(tmp_path):
    from distlab.course import release
    old = tmp_path / "build" / "release"
    (old / "notebooks").mkdir(parents=True)
    (old / "README.md").write_text(release.README)
    release._claim(old, force=False)
    (old / "README.md").write_text("# my own project\n")
    with pytest.raises(folders.FolderInUse):
        release._claim(old, force=False)


# ---------------------------------------------------------------------------------------------
# site --out

def test_site_refuses_a_users_folder_before_running_a_lab(users, capsys, monkeypatch):
    monkeypatch.setattr(site, "run_lab", lambda *a: pytest.fail("a lab ran"))
    assert site.main([LAB1, "--out", str(users)]) == 1
    err = capsys.readouterr().err
    assert str(users) in err and "--force" in err and kept(users)


def test_site_replaces_its_own_output_and_with_force_a_users_folder(tmp_path, users):
    with site.swapped_in(users, force=True) as scratch:
        (scratch / "index.html").write_text("the first site")
    assert not (users / "notes.txt").exists()
    assert (users / "index.html").read_text() == "the first site"
    with site.swapped_in(users) as scratch:            # its own output: no --force needed
        (scratch / "index.html").write_text("the second site")
    assert (users / "index.html").read_text() == "the second site"
    assert folders.marker(users, "site").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["mine"]   # no scratch left beside it


def test_a_site_made_before_the_marker_is_still_a_site(tmp_path):
    old = tmp_path / "site"
    (old / "_static").mkdir(parents=True)
    (old / "index.html").write_text("an old site")
    (old / "_static" / "twins.js").write_text("")
    with site.swapped_in(old) as scratch:
        (scratch / "index.html").write_text("the new site")
    assert (old / "index.html").read_text() == "the new site"


# ---------------------------------------------------------------------------------------------
# grade --workdir and merge --workdir

def _one_submission(tmp_path: Path) -> Path:
    folder = tmp_path / "submitted" / "alice" / LAB1
    folder.mkdir(parents=True)
    shutil.copy(REPO / "notebooks" / LAB1 / f"{LAB1}.ipynb", folder)
    return tmp_path / "submitted"


def test_grade_refuses_a_users_folder_as_its_workdir(tmp_path, users, capsys):
    subs = _one_submission(tmp_path)
    out = tmp_path / "scores.csv"
    assert grade.main([str(subs), "--workdir", str(users), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert str(users) in err and "Give a new or empty folder" in err
    assert sorted(p.name for p in users.iterdir()) == ["notes.txt"] and kept(users)
    assert not out.exists()


def test_a_grading_workdir_is_resumed_by_its_marker_or_its_records(tmp_path):
    marked, old = tmp_path / "marked", tmp_path / "old"
    folders.mark(marked, "grade")
    (marked / "scores.csv").write_text("")
    (old / "results").mkdir(parents=True)              # a run's records, from before the marker
    (old / "students").mkdir()
    formgrader = tmp_path / "grading"                  # the repository's, as nbgrader keeps it
    (formgrader / "submitted").mkdir(parents=True)
    (formgrader / "gradebook.db").write_text("")
    for workdir in (marked, old, formgrader):
        records.claim_workdir(workdir)
    (formgrader / "notes.txt").write_text("my notes")
    with pytest.raises(folders.FolderInUse):
        records.claim_workdir(formgrader)


def test_merge_refuses_a_users_folder_as_its_workdir(tmp_path, users, capsys):
    shard = tmp_path / "shard"
    shard.mkdir()
    assert merge.main([str(shard), "--workdir", str(users), "--out",
                       str(tmp_path / "scores.csv")]) == 1
    err = capsys.readouterr().err
    assert str(users) in err and kept(users)


# ---------------------------------------------------------------------------------------------
# build: notebooks/<lab>/ and build/source/<lab>/

def test_build_keeps_files_it_did_not_write_unless_forced(tmp_path):
    out = tmp_path / "notebooks"
    built = {f"{LAB1}.ipynb": "{}\n"}
    notebooks.write_student_notebooks(LAB1, built, out=out)
    notebooks.write_student_notebooks(LAB1, {f"{LAB1}.ipynb": "{ }\n"}, out=out)   # its own
    (out / LAB1 / ".ipynb_checkpoints").mkdir()        # JupyterLab's: not the user's work
    (out / LAB1 / "trace.json").write_text("a trace the lab left")
    with pytest.raises(folders.FolderInUse) as info:
        notebooks.write_student_notebooks(LAB1, built, out=out)
    assert str(out / LAB1) in str(info.value) and "trace.json" in str(info.value)
    assert "distlab build --force" in str(info.value)
    assert (out / LAB1 / "trace.json").is_file() and (out / LAB1 / f"{LAB1}.ipynb").read_text() == "{ }\n"
    notebooks.write_student_notebooks(LAB1, built, out=out, force=True)
    assert sorted(p.name for p in (out / LAB1).iterdir()) == [f"{LAB1}.ipynb"]


def test_build_keeps_files_in_nbgraders_source_folder_unless_forced(tmp_path):
    source = tmp_path / "source"
    notebooks.write_course_source(LAB1, source)
    notebooks.write_course_source(LAB1, source)                        # its own
    (source / LAB1 / "notes.txt").write_text("my notes")
    with pytest.raises(folders.FolderInUse, match="notes.txt"):
        notebooks.write_course_source(LAB1, source)
    assert kept(source / LAB1)
    notebooks.write_course_source(LAB1, source, force=True)
    assert not (source / LAB1 / "notes.txt").exists()
    assert (source / LAB1 / f"{LAB1}.ipynb").is_file()


# ---------------------------------------------------------------------------------------------
# references: data/<lab>/

def test_references_delete_only_sets_their_manifest_named(tmp_path, monkeypatch):
    made = {"first": {"a.pt": b"A", "b.pt": b"B"}, "then": {"a.pt": b"A2"}}
    step = {"now": "first"}

    def make(lab):
        files = made[step["now"]]
        return files, {"lab": lab, "files": {name: {} for name in files}}
    monkeypatch.setattr(references, "make", make)
    folder = references.write(LAB1, out=tmp_path)
    (folder / "mine.pt").write_bytes(b"a user's tensors")
    step["now"] = "then"
    references.write(LAB1, out=tmp_path)
    assert sorted(p.name for p in folder.iterdir()) == ["a.pt", references.MANIFEST, "mine.pt"]
    assert sorted(json.loads((folder / references.MANIFEST).read_text())["files"]) == ["a.pt"]


# ---------------------------------------------------------------------------------------------
# bench/grading_scale.py --keep

def test_grading_scale_refuses_a_users_keep_folder_before_grading(users):
    done = subprocess.run([sys.executable, str(REPO / "bench" / "grading_scale.py"), "--keep",
                           str(users), "--students", "1", "--labs", LAB1],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and str(users) in done.stderr and "--force" in done.stderr
    assert "students x" not in done.stdout           # refused before any grading
    assert sorted(p.name for p in users.iterdir()) == ["notes.txt"] and kept(users)
