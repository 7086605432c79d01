"""The rendered course site (distlab.course.site): what its pages contain, that they need no network,
and that a lab that fails stops the build with the lab and the cell named. What the pages look
like in a browser is tests/test_browser.py's."""
from __future__ import annotations

import io
import re
import tarfile

import nbformat
import pytest

from distlab.course import notebooks

from distlab.course import site, site_assets

pytestmark = pytest.mark.timeout(900)


@pytest.mark.slow
def test_index_lists_every_lab_with_summary_and_time(course_site):
    out, pages, _ = course_site
    index = (out / "index.html").read_text()
    for page in pages:
        assert f'href="{page.file}"' in index and page.title in index
        assert page.summary and page.summary.split(",")[0] in index
        assert page.seconds > 0 and f"{page.seconds:.0f} s" in index


@pytest.mark.slow
def test_lab_pages_have_outputs_figures_widgets_and_links(course_site):
    out, pages, _ = course_site
    text = {p.lab: (out / p.file).read_text() for p in pages}
    assert "[rank 0] hello from rank 0 of 4" in text["01_collectives"]
    assert text["01_collectives"].count('src="data:image/png;base64,') >= 5
    assert 'href="02_data_parallel.html">Lab 2</a>' in text["01_collectives"]   # "Lab 2" in the text
    assert "application/vnd.jupyter.widget-state+json" in text["05_pipeline_parallel"]
    assert "micro m" in text["05_pipeline_parallel"]              # the slider, in the saved state
    assert "$$" in text["02_data_parallel"]                       # left for MathJax to typeset
    for i, page in enumerate(pages):
        nav = site.nav_html(pages, i)
        assert text[page.lab].count(nav) == 2                     # above and below the lab
        assert "BEGIN SOLUTION" not in text[page.lab] and "HIDDEN TESTS" not in text[page.lab]


@pytest.mark.slow
def test_pages_load_nothing_from_the_network(course_site):
    out, pages, _ = course_site
    for name in ["index.html"] + [p.file for p in pages]:
        html = (out / name).read_text()
        # what a page loads (links the reader may follow are fine)
        remote = re.findall(r'<(?:script|img|link|iframe)[^>]*(?:src|href)="(https?://[^"]+)"', html)
        assert remote == [], f"{name} loads {remote}"
        for local in re.findall(r'src="(_static/[^"]+)"', html):
            assert (out / local).is_file(), f"{name} loads {local}, which the site lacks"


def _notebook(*cells):
    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": dict(notebooks.KERNELSPEC)}
    nb.cells = [nbformat.v4.new_markdown_cell("# Lab 1 — Collectives and their cost")]
    for gid, source in cells:
        cell = nbformat.v4.new_code_cell(source)
        cell.metadata["nbgrader"] = {"grade_id": gid, "locked": True}
        nb.cells.append(cell)
    return nb


@pytest.mark.timeout(300)
def test_a_failing_lab_names_lab_and_cell_and_keeps_the_old_site(tmp_path, monkeypatch):
    out = tmp_path / "site"
    out.mkdir()
    (out / "index.html").write_text("the previous site")
    failing = _notebook(("fine", "x = 1"), ("divide", "x / 0"), ("never", "print('not run')"))
    monkeypatch.setattr(site, "lab_notebook", lambda lab, version: failing)
    monkeypatch.setattr(site, "copy_static", lambda *args: None)
    with pytest.raises(site.SiteError) as info:
        site.build_site(["01_collectives"], out=out, log=lambda line: None)
    message = str(info.value)
    assert message.startswith("Lab 01_collectives failed to execute at cell 3 of 4 "
                              "(grade_id divide: 'x / 0'): ZeroDivisionError: division by zero")
    assert "distlab site 01_collectives" in message          # what to do
    assert (out / "index.html").read_text() == "the previous site"
    assert not (tmp_path / "site.partial").exists()


def test_lab_mentions_become_links_to_other_labs_on_the_site():
    pages = [site.Page("01_collectives", "Lab 1 — C", ""), site.Page("03_tp", "Lab 3 — T", "")]
    text = "Lab 1 and Lab 3's layers; Lab 2 is not here; [Lab 3](x.html) stays; Labs 1–5."
    assert site.link_lab_mentions(text, pages, "03_tp") == (
        "[Lab 1](01_collectives.html) and Lab 3's layers; Lab 2 is not here; [Lab 3](x.html) "
        "stays; Labs 1–5.")


def test_nav_links_previous_index_and_next():
    pages = [site.Page(f"0{i}_x", f"Lab {i} — X", "") for i in (1, 2, 3)]
    assert site.nav_html(pages, 0).count("<a ") == 2                  # no previous lab
    middle = site.nav_html(pages, 1)
    assert '<a href="01_x.html">← Lab 1 — X</a>' in middle and 'href="index.html"' in middle
    assert '<a href="03_x.html">Lab 3 — X →</a>' in middle


def test_reader_notebook_keeps_solutions_and_drops_hidden_tests():
    nb = notebooks.reader_notebook("05_pipeline_parallel")
    text = "\n".join(c.source for c in nb.cells)
    assert "base, extra = divmod(num_layers, num_stages)" in text       # a solution line
    assert "fresh_seed()" not in text.replace("import fresh_seed", "")  # hidden tests only
    assert "### BEGIN" not in text and "### END" not in text


def test_every_lab_has_a_one_line_summary():
    for lab in notebooks.labs():
        summary = notebooks.lab_summary(lab)
        assert 40 < len(summary) < 200 and "\n" not in summary, (lab, summary)


def _tarball(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"package/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_vendored_files_are_checked_against_the_pin(tmp_path, monkeypatch):
    blob = _tarball({"dist/embed-amd.js": b"js", "dist/x.js.map": b"map", "README.md": b"r"})

    def pack(asset, dest):
        (dest / "pkg.tgz").write_bytes(blob)
        return dest / "pkg.tgz"

    monkeypatch.setattr(site_assets, "_npm_pack", pack)
    tarball = tmp_path / "pkg.tgz"
    tarball.write_bytes(blob)
    good = site_assets.NpmAsset("pkg", "1.0.0", site_assets._sha512(tarball), ("dist/*.js",), "pkg")
    folder = site_assets.vendored(good, tmp_path / "vendor")
    assert sorted(p.name for p in folder.rglob("*") if p.is_file()) == [".complete", "embed-amd.js"]

    bad = site_assets.NpmAsset("other", "1.0.0", "sha512-AAAA", ("dist/*.js",), "other")
    with pytest.raises(site.SiteError, match="not the pinned sha512-AAAA"):
        site_assets.vendored(bad, tmp_path / "vendor")
    assert not (tmp_path / "vendor" / "other-1.0.0").exists()


def test_without_npm_the_error_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(site_assets.shutil, "which", lambda name: None)
    with pytest.raises(site.SiteError, match=r"npm is not installed.*apt-get install npm"):
        site_assets.vendored(site_assets.ASSETS[0], tmp_path)
