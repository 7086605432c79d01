"""The rendered course site (distlab.course.site): what its pages contain, that they need no network,
and that a lab that fails stops the build with the lab and the cell named. What the pages look
like in a browser is tests/test_browser.py's."""
from __future__ import annotations

import io
import json
import random
import re
import shutil
import subprocess
import tarfile
from html import unescape

import nbformat
import pytest

from distlab.course import notebooks

from distlab.course import site, site_assets, site_pages, site_settings, site_sphinx
from distlab.grading import folders

from conftest import INSTALL_HELP

pytestmark = pytest.mark.timeout(900)
# README.md's one-lab site (`distlab site LAB`): the lab cheapest to run, since its run is a second
# run of a lab `make site` ran already (Lab 3: 10.6 CPU-s, 15 s, against Lab 1's 16.0 CPU-s, 34 s,
# kernel, zygote and ranks together, at load 7 on 2 cores).
ONE_LAB = "03_tensor_parallel_mlp"


@pytest.mark.slow
def test_index_lists_every_lab_with_summary_and_time(course_site):
    out, pages, _ = course_site
    index = (out / "index.html").read_text()
    for page in pages:
        assert f'href="{page.file}"' in index and page.title in index
        assert page.summary and page.summary.split(",")[0] in index
        assert page.seconds > 0 and f"{page.seconds:.0f} s" in index


def _texts(out, pages):
    return {p.lab: (out / p.file).read_text() for p in pages}


# Each open design exercise's two test cells (issue 42: the site shows, for the reference
# solution, the design's figure beside the hinted design's, the bar and the bound).
DESIGN_TESTS = {"05_pipeline_parallel": ("test_budget_step", "test_budget_step_bar"),
                "06_timelines": ("test_plan_buckets", "test_plan_buckets_bar"),
                "07_3d_parallelism": ("test_place_mesh", "test_place_mesh_bar"),
                "08_sharded_data_parallel": ("test_design", "test_design_bar"),
                "09_expert_parallel": ("test_padded_moe", "test_padded_moe_bar"),
                "10_context_parallel": ("test_causal_layout", "test_causal_layout_better"),
                "11_pipeline_schedules": ("test_capped_schedule", "test_capped_schedule_bar"),
                "12_checkpoint_restart": ("test_checkpoint_plan", "test_checkpoint_plan_bar")}
# A figure measured on ranks, not on paper, as it may differ between two runs: Lab 8's peak (a
# run in eight measures about 1 KB more, by when the ranks' buffers are freed).
MEASURED = {"08_sharded_data_parallel": r"(?<=peak )[\d,]+(?= bytes per rank)"}


def design_verdicts(lab: str, monkeypatch) -> list[str]:
    """The verdict lines the design's test cells show on the site, made here: the reader's
    cells (no hidden tests) run on the solution, as the site's kernel runs them, each check's
    returned line recorded."""
    import importlib
    from distlab.course.solutions import solution_namespace
    module = importlib.import_module(f"distlab.checks.lab{lab[:2]}")
    said = []

    def recorded(check):
        def call(*args, **kwargs):
            verdict = check(*args, **kwargs)
            said.append(str(verdict))
            return verdict
        return call
    for name in [n for n in vars(module) if n.startswith("check_")]:
        monkeypatch.setattr(module, name, recorded(getattr(module, name)))
    cells = {c.metadata.get("nbgrader", {}).get("grade_id"): c.source
             for c in notebooks.reader_notebook(lab).cells}
    # The solution cells, and the import cells they need, which take the recorded checks.
    namespace = solution_namespace(lab, setup=tuple(g for g in cells if str(g).endswith("imports")))
    for test in DESIGN_TESTS[lab]:
        exec(compile(cells[test], f"<{lab}:{test}>", "exec"), namespace)
    return said


@pytest.mark.slow
def test_lab_pages_have_outputs_figures_and_links(course_site, monkeypatch):
    out, pages, _ = course_site
    text = _texts(out, pages)
    for lab, tests in DESIGN_TESTS.items():      # each test cell's line, figures and scale
        shown, lines = unescape(text[lab]), design_verdicts(lab, monkeypatch)
        assert len(lines) >= len(tests) and all("bar" in line for line in lines), (lab, lines)
        if lab in MEASURED:
            shown, lines = (re.sub(MEASURED[lab], "N", shown),
                            [re.sub(MEASURED[lab], "N", line) for line in lines])
        for line in lines:
            on_page = [row for row in shown.splitlines() if line[:20] in row]
            assert all(part in shown for part in line.splitlines()), (lab, line, on_page)
    assert "[rank 0] hello from rank 0 of 4" in text["01_collectives"]
    figures = re.findall(r'<img [^>]*src="(_images/[^"]+\.png)"', text["01_collectives"])
    assert len(figures) >= 5 and all((out / f).is_file() for f in figures)
    assert re.search(r'href="02_data_parallel.html"[^>]*><span[^>]*>Lab 2<', text["01_collectives"])
    for i, page in enumerate(pages):
        html = text[page.lab]
        assert "BEGIN SOLUTION" not in html and "HIDDEN TESTS" not in html
        assert "Author name not set" not in html                  # Sphinx's placeholder
        for other in pages:                                        # the sidebar of labs
            assert f'href="{other.file}"' in html or other is page
        if i > 0:                                                  # previous / next
            assert re.search(rf'class="left-prev"[^>]*href="{pages[i - 1].file}"|'
                             rf'href="{pages[i - 1].file}"[^>]*class="left-prev"', html)
        assert 'class="page-toc tocsection onthispage"' in html    # in-page contents
        assert '<link rel="stylesheet" type="text/css" href="_static/distlab.css' in html


@pytest.mark.slow
def test_solutions_are_folded_under_a_link_to_the_student_notebook(course_site):
    out, pages, _ = course_site
    for page in pages:
        html = (out / page.file).read_text()
        nb = notebooks.reader_notebook(page.lab)
        solutions = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution")]
        assert solutions
        folds = re.findall(r'<details class="admonition hide above-input">\s*<summary[^>]*>\s*'
                           r'<p class="collapsed admonition-title">Show solution</p>', html)
        dropdowns = html.count('<p class="admonition-title">Show solution</p>')
        assert len(folds) + dropdowns == len(solutions), page.lab
        tries = re.findall(r'distlab-try.*?href="(_downloads/[^"]+)"', html, re.S)
        assert len(tries) == len(solutions)
        student = (notebooks.NOTEBOOKS / page.lab / f"{page.lab}.ipynb").read_bytes()
        assert all((out / t).read_bytes() == student for t in tries)


@pytest.mark.slow
def test_each_page_says_how_to_run_it(course_site):
    out, pages, _ = course_site
    commands = site_pages.setup_commands()
    assert commands == ["make lab", "make test"]                  # README's "Two commands"
    for page in pages:
        html = (out / page.file).read_text()
        box = re.search(r'<div class="distlab-run[^"]*">(.*?)</p>\n</div>', html, re.S).group(1)
        downloads = re.findall(r'href="(_downloads/[^"]+\.ipynb)"', box)
        executed, student = (nbformat.reads((out / d).read_text(), as_version=4) for d in downloads)
        assert any(c.get("outputs") for c in executed.cells if c.cell_type == "code")
        assert not any(c.get("outputs") for c in student.cells if c.cell_type == "code")
        for command in commands:
            assert command.replace(" ", '<span class="w"> </span>') in box.replace(
                '<span class="nb">test</span>', "test")
        assert "Not on Colab: this lab starts several processes" in box   # every lab here does


@pytest.mark.slow
def test_demo_table_columns_are_apart(course_site):
    out, _, _ = course_site
    html = (out / "01_collectives.html").read_text()
    rows = re.findall(r"rank \d +\[[\d ]+\] +(\[[\d ]+\])(\S*)", html)
    assert len(rows) >= 8 and all(after == "" for _, after in rows), rows[:4]
    assert "]all_gather" not in html and "]reduce_scatter" not in html


@pytest.mark.slow
def test_widgets_are_twins_or_marked_snapshots_and_math_loads_only_where_needed(course_site):
    out, pages, _ = course_site
    text = _texts(out, pages)
    lab5 = text["05_pipeline_parallel"]
    assert 'data-twin="schedule"' in lab5 and "_static/twins.js" in lab5
    assert "widget-state+json" not in lab5 and "embed-amd.js" not in lab5   # no snapshot left
    lab7 = text["07_3d_parallelism"]
    assert 'data-twin="planner"' in lab7 and "widget-state+json" not in lab7
    assert "$$" in text["02_data_parallel"] or "\\[" in text["02_data_parallel"]
    assert 'src="_static/mathjax/es5/tex-svg.js' in text["02_data_parallel"]
    assert "tex-svg.js" not in text["01_collectives"]                  # no formula, no MathJax


def test_hints_stay_folded_on_the_site(course_site):
    out, pages, _ = course_site
    text = _texts(out, pages)
    # scaffolding fades from Lab 4 on (CONTRIBUTING, "A lab"): every later lab hides its method
    for lab in (p.lab for p in pages if int(p.lab[:2]) >= 4):
        assert "<details><summary>Hint 1</summary>" in text[lab], lab
        assert "<details open" not in text[lab], lab


@pytest.mark.slow
def test_search_index_covers_the_labs(course_site):
    out, pages, _ = course_site
    assert (out / "search.html").is_file()
    index = (out / "searchindex.js").read_text()
    for page in pages:
        assert f'"{page.lab}"' in index


@pytest.mark.slow
def test_pages_load_nothing_from_the_network(course_site):
    out, pages, _ = course_site
    for name in ["index.html", "search.html"] + [p.file for p in pages]:
        html = (out / name).read_text()
        # what a page loads (links the reader may follow are fine)
        remote = re.findall(r'<(?:script|img|link|iframe)[^>]*(?:src|href)="(https?://[^"]+)"', html)
        remote = [u for u in remote if 'rel="' not in u]
        assert remote == [], f"{name} loads {remote}"
        for local in re.findall(r'src="(_static/[^"?]+)', html):
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
    folders.mark(out, "site")
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
    assert [p.name for p in tmp_path.iterdir()] == ["site"]   # no partial site beside it


AUTHOR, URL = "Ada Example and the distlab course", "https://git.example.org/course/distlab"
# Output of `distlab site` a reader cannot act on (issue 40): Sphinx's placeholder author, and
# the warning every kernel printed when it ran over TCP without encryption.
NOISE = ("not set", "without encryption")


def _settings_file(tmp_path, author: str, repository: str):
    path = tmp_path / "course.cfg"
    path.write_text(f"# the instructor's\n[course]\nauthor = {author}\nrepository = {repository}\n")
    return path


def test_course_settings_come_from_one_file_and_the_command_line_overrides_its_url(tmp_path):
    path = _settings_file(tmp_path, AUTHOR, URL)
    assert site_settings.read_settings(path) == site_settings.SiteSettings(AUTHOR, URL)
    assert site_settings.site_settings(path=path).repository == URL
    assert site_settings.site_settings("https://other.example/x", path).repository == \
        "https://other.example/x"
    assert site_settings.read_settings(tmp_path / "none.cfg") == site_settings.SiteSettings()
    shipped = site_settings.read_settings(notebooks.REPO / "grader" / "course.cfg")
    assert isinstance(shipped, site_settings.SiteSettings)          # the course's own file parses
    (tmp_path / "bad.cfg").write_text("author: x\n")                # no [course] section header
    with pytest.raises(site.SiteError, match="bad.cfg is not a course settings file"):
        site_settings.read_settings(tmp_path / "bad.cfg")


def test_an_empty_setting_leaves_its_line_out_rather_than_a_placeholder():
    empty = site_settings.SiteSettings()
    assert site_sphinx.sphinx_config("distlab", empty)["author"] == ""   # the theme omits "By"
    assert site_sphinx.sphinx_config("distlab", empty)["html_theme_options"]["use_repository_button"] is False
    # the header's button only where the theme knows the host (it stops the build on any other)
    theme = {url: site_sphinx.sphinx_config("distlab", site_settings.SiteSettings("", url))
             ["html_theme_options"]["repository_url"] for url in (URL, "https://github.com/o/r")}
    assert theme == {URL: "", "https://github.com/o/r": "https://github.com/o/r"}
    nb = _notebook(("ranks", "out = run(fn, world_size=4)"))
    for text in (site_pages.run_box("01_x", nb, None), site_pages.index_md([], "solutions", "x", "")):
        assert "http" not in text and "clone" not in text.lower()
        assert "in your copy of the course's folder, run:" in text.lower()
    for text in (site_pages.run_box("01_x", nb, URL), site_pages.index_md([], "solutions", "x", "", URL)):
        assert f"clone the course's repository, [{URL}]({URL}), then, in its folder:" in text.lower()


def configured(text: str, author: str, repository: str) -> str:
    """The course's settings file ``text`` with ``author`` and ``repository`` set, as the
    instructor sets them (README.md: `author = ...`, `repository = https://...`)."""
    text = re.sub(r"^author *=.*$", f"author = {author}", text, count=1, flags=re.M)
    return re.sub(r"^repository *=.*$", f"repository = {repository}", text, count=1, flags=re.M)


def assert_one_lab_site_shows_the_settings_and_prints_no_noise(out, printed: str) -> None:
    """`distlab site ONE_LAB` (the cheapest lab), with the course's settings file naming
    AUTHOR and URL, made ``out`` and printed ``printed`` (the kernels' output included: they
    write to the same terminal): every page shows both, none a placeholder, and nothing printed
    is a line a reader cannot act on. tests/test_readme.py's test_site_commands runs it, the
    README's own command (one run of the lab for both)."""
    lines = printed.splitlines()
    assert [line for line in lines if any(n in line for n in NOISE)] == []
    assert any(line.startswith(f"{ONE_LAB}: ran in") for line in lines)   # it did print
    lab, index = ((out / name).read_text() for name in (f"{ONE_LAB}.html", "index.html"))
    for html in (lab, index):
        assert "not set" not in html
        footer = re.search(r'<p class="component-author">\s*(.*?)\s*</p>', html, re.S).group(1)
        assert footer == f"By {AUTHOR}"
        assert f'<a class="reference external" href="{URL}">{URL}</a>' in html   # Clone <URL>
    box = re.search(r'<div class="distlab-run[^"]*">(.*?)</div>', lab, re.S).group(1)
    assert f'href="{URL}"' in box


def test_the_course_s_settings_file_takes_an_author_and_a_url_in_place(tmp_path):
    shipped = (notebooks.REPO / "grader" / "course.cfg").read_text()
    path = tmp_path / "course.cfg"
    path.write_text(configured(shipped, AUTHOR, URL))
    assert site_settings.read_settings(path) == site_settings.SiteSettings(AUTHOR, URL)
    assert path.read_text().splitlines()[:3] == shipped.splitlines()[:3]   # its comments kept


def test_lab_mentions_become_links_to_other_labs_on_the_site():
    pages = [site.Page("01_collectives", "Lab 1 — C", ""), site.Page("03_tp", "Lab 3 — T", "")]
    text = "Lab 1 and Lab 3's layers; Lab 2 is not here; [Lab 3](x.html) stays; Labs 1–5."
    assert site.link_lab_mentions(text, pages, "03_tp") == (
        "[Lab 1](01_collectives.ipynb) and Lab 3's layers; Lab 2 is not here; [Lab 3](x.html) "
        "stays; Labs 1–5.")


def test_solution_cells_fold_and_widgets_become_twins_or_snapshots():
    nb = _notebook(("answer", "x = 1"), ("plain", "y = 2"))
    nb.cells[1].metadata["nbgrader"]["solution"] = True
    for i, call in ((1, "schedule_explorer()"), (2, "other_widget()")):
        nb.cells[i].source += f"\n{call}"
        nb.cells[i].outputs = [nbformat.v4.new_output(
            "display_data", data={site_pages.WIDGET_VIEW: {"model_id": "m"}})]
    nb.metadata["widgets"] = {"state": {}}
    site_pages.fold_solutions(nb, "01_collectives")
    site_pages.twin_or_notice(nb)
    kinds = [(c.cell_type, c.metadata.get("tags", []), c.source[:30]) for c in nb.cells]
    assert "distlab-try" in kinds[1][2] and kinds[2][1] == ["hide-input", "remove-output"]
    assert nb.cells[2].metadata["mystnb"]["code_prompt_show"] == "Show solution"
    assert 'data-twin="schedule"' in nb.cells[3].source
    assert "snapshot: run the lab to interact" in nb.cells[5].source
    assert "widgets" in nb.metadata                   # the snapshot still needs its saved state


def test_colab_only_for_labs_that_start_no_processes():
    single = _notebook(("plain", "print(1 + 1)"))
    ranks = _notebook(("ranks", "out = run(fn, world_size=4)"))
    repo = "https://github.com/example/distlab"
    assert "colab.research.google.com/github/example/distlab/blob/main/notebooks/01_x/01_x.ipynb" \
        in site_pages.run_box("01_x", single, repo)
    box = site_pages.run_box("01_x", ranks, repo)
    assert "colab.research" not in box and "Not on Colab" in box and f"]({repo})" in box


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


def _twins_in_node(calls: str) -> list:
    """Evaluate ``calls`` (a JavaScript expression over ``twins``, the functions twins.js exports)
    in Node.js, the JSON it returns."""
    node = shutil.which("node")
    if node is None:
        pytest.skip(f"Node.js is not installed (it comes with npm: see {INSTALL_HELP})")
    twins = site_sphinx.OWN_STATIC / "twins.js"
    script = ("global.window = {}; global.document = {readyState: 'complete', "
              "querySelectorAll: () => []};\n"
              f"require({json.dumps(str(twins))}); const twins = window.distlabTwins;\n"
              f"console.log(JSON.stringify({calls}));")
    done = subprocess.run([node, "-e", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_schedule_twin_simulates_as_the_python():
    from distlab.labs.pipeline.schedules import SCHEDULES, simulate
    from distlab.labs.pipeline.stages import measured_bubble, peak_in_flight

    cases = [(k, p, m, r) for k in SCHEDULES for p in (2, 3, 5, 8) for m in (1, 4, 7, 16)
             for r in (0.5, 2.0, 3.0)]
    js = _twins_in_node("%s.map(([k, p, m, r]) => { const e = twins.simulate(k, p, m, 1.0, r); "
                        "return [e.length, twins.measuredBubble(e, p), twins.peakInFlight(e, p), "
                        "Math.max(...e.map(x => x.end))]; })" % json.dumps(cases))
    for (kind, p, m, r), (count, bubble, inflight, end) in zip(cases, js):
        events = simulate(kind, p, m, t_fwd=1.0, t_bwd=r)
        assert count == len(events) and end == max(e.end for e in events)
        assert bubble == pytest.approx(measured_bubble(events, p), abs=1e-12)
        assert inflight == list(peak_in_flight(events).values()), (kind, p, m, r)


def test_planner_twin_plans_as_the_python_on_random_inputs():
    from distlab.labs import planning as pl

    rng = random.Random(0)
    states = [{"params_b": 10 ** (rng.randint(0, 30) / 10),
               "seq_len": rng.choice([1024, 2048, 4096, 8192, 16384, 32768]),
               "gpus_per_node": rng.choice([1, 2, 4, 8]), "nodes": 2 ** rng.randint(0, 11),
               "gpu_mem_gb": rng.choice([16, 24, 40, 48, 80, 96, 141, 192]),
               "batch_m_tokens": rng.choice([0.5, 1, 2, 4, 8, 16]), "zero_stage": rng.randint(0, 3),
               "recompute": rng.choice(["none", "selective", "full"]),
               "zero_accumulation": rng.choice(["regather", "resident"])} for _ in range(200)]
    js = _twins_in_node("%s.map(s => { const r = twins.plan(s); return r.cfg ? "
                        "[r.cfg.tp, r.cfg.pp, r.cfg.dp, r.memory.total, r.bubble, r.comm.tp, "
                        "r.comm.pp, r.comm.dp, r.step.total] : null; })" % json.dumps(states))
    fits = 0
    for state, got in zip(states, js):
        model = pl.model_of_size(state["params_b"])
        cluster = pl.Cluster("", state["nodes"], state["gpus_per_node"], state["gpu_mem_gb"])
        seqs = max(cluster.gpus, cluster.gpus * round(
            state["batch_m_tokens"] * 1e6 / state["seq_len"] / cluster.gpus))
        job = pl.Job(seq_len=state["seq_len"], global_batch=seqs, zero_stage=state["zero_stage"],
                     recompute=state["recompute"], zero_accumulation=state["zero_accumulation"])
        try:
            cfg = pl.reference_choose_degrees(model, cluster, job)
        except ValueError:
            assert got is None, state
            continue
        fits += 1
        comm = pl.comm_bytes_per_step(model, cfg)
        want = [cfg.tp, cfg.pp, cfg.dp, pl.memory_per_gpu(model, cfg)["total"],
                pl.bubble_fraction(cfg.pp, cfg.microbatches), comm["tp"], comm["pp"], comm["dp"],
                pl.step_time(model, cluster, cfg)["total"]]
        assert got == pytest.approx(want, rel=1e-9), state
    assert 50 < fits < 190          # the draw covers layouts that fit and ones that do not


def test_a_widget_given_the_readers_own_functions_still_has_its_twin():
    nb = _notebook(("planner", "planner(choose_degrees, memory_per_gpu)"))
    nb.cells[1].outputs = [nbformat.v4.new_output(
        "display_data", data={site_pages.WIDGET_VIEW: {"model_id": "m"}})]
    nb.metadata["widgets"] = {"state": {}}
    site_pages.twin_or_notice(nb)
    assert any('data-twin="planner"' in c.source for c in nb.cells)
