"""The labs as people use them, in a real headless Chromium driven by Playwright.

- JupyterLab on a free local port with a token, in a scratch copy of the course: a student opens
  Lab 1 from the file browser and runs all cells; an instructor runs Lab 5's nbgrader source and
  moves its schedule widget's slider; nbgrader's formgrader lists the labs.
- The rendered site (the build tests/conftest.py shares), served over HTTP as a static host
  would, at phone (390 px) and desktop width, with every request that would leave the machine
  aborted in the browser's network stack (and the test failed): the index and every lab page,
  their figures, formulas, links, line length and sideways scrolling; search; dark mode; and the
  JavaScript twins of Lab 5's schedule explorer and Lab 7's planner, each control moved and the
  numbers drawn compared with the Python functions.

Screenshots of every page go to build/artifacts/screenshots/ (git-ignored).

The browser is the system's Chromium (Debian: `apt-get install chromium`);
Playwright's own browser download is not used. Without it these tests skip, saying how to enable
them, unless DISTLAB_REQUIRE_BROWSER=1 (.ci/run sets it): there they fail.
"""
from __future__ import annotations

import dataclasses
import functools
import http.server
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import INSTALL_HELP, SITE_LABS

from distlab.course import notebooks

REPO = notebooks.REPO
SHOTS = REPO / "build" / "artifacts" / "screenshots"
# Headless, and without the background services (updates, sync, field trials) that try to reach
# Google: a closed network refuses them, which slows or breaks the pages under test.
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
STDERR = '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'
# distlab's notices that the machine is busy (the rank launcher still importing torch, ranks still
# joining their group) are progress on a loaded machine, not trouble in the lab.
BUSY = re.compile(r"distlab\.run: .*the machine is busy\)?")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def chromium() -> str | None:
    """The browser binary: $DISTLAB_CHROMIUM, else the first Chromium or Chrome on PATH."""
    names = ("chromium", "chromium-browser", "google-chrome")
    return os.environ.get("DISTLAB_CHROMIUM") or next(filter(None, map(shutil.which, names)), None)


def missing_browser() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright is not installed (`.venv/bin/pip install -e '.[test]'`)"
    return None if chromium() else "no Chromium on PATH"


@pytest.fixture(scope="module")
def browser():
    missing = missing_browser()
    if missing and os.environ.get("DISTLAB_REQUIRE_BROWSER") == "1":
        pytest.fail(f"browser tests are mandatory here (DISTLAB_REQUIRE_BROWSER=1) but {missing}: "
                    "install it (`apt-get install chromium`; .ci/run does)")
    if missing:
        pytest.skip(f"browser tests skipped: {missing}. To run them, install Chromium (Debian/Ubuntu: "
                    f"`sudo apt-get install chromium`; see {INSTALL_HELP}) or set DISTLAB_CHROMIUM to a "
                    "Chrome binary, then `make test` again")
    from playwright.sync_api import sync_playwright
    with sync_playwright() as pw:
        launched = pw.chromium.launch(executable_path=chromium(), args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture
def page(browser):
    """A fresh tab that records the page's uncaught errors and the requests that failed."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    tab = context.new_page()
    tab.problems = []
    tab.on("pageerror", lambda e: tab.problems.append(f"page error: {e}"))
    tab.on("requestfailed", lambda r: tab.problems.append(f"{r.url[:120]} failed: {r.failure}"))
    tab.on("response",
           lambda r: r.status >= 400 and tab.problems.append(f"{r.url[:120]}: HTTP {r.status}"))
    yield tab
    context.close()


def screenshot(tab, name: str, element=None, full_page: bool = False) -> None:
    """Keep what the page shows as build/artifacts/screenshots/<name>.png (``element`` on top)."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    if element is not None:
        element.evaluate("e => e.scrollIntoView({block: 'start'})")
        tab.wait_for_timeout(300)  # let the notebook render what scrolled in
    tab.screenshot(path=str(SHOTS / f"{name}.png"), full_page=full_page)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def images_loaded(tab, scope: str = "") -> list[int]:
    """The natural width of every image in ``scope`` once all have loaded (0: a broken one)."""
    tab.wait_for_function(
        f"() => [...document.querySelectorAll('{scope} img')].every(i => i.complete)")
    return tab.eval_on_selector_all(f"{scope} img", "imgs => imgs.map(i => i.naturalWidth)")


# ----------------------------------------------------------------------------- JupyterLab


@dataclasses.dataclass
class JupyterLab:
    url: str
    token: str
    proc: subprocess.Popen
    log: Path

    def api(self, path: str, method: str = "GET"):
        request = urllib.request.Request(f"{self.url}/api/{path}", method=method,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
        return json.loads(body) if body else None

    def wait_ready(self, limit: float = 120) -> None:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"JupyterLab exited with {self.proc.returncode}:\n"
                            f"{self.log.read_text()[-3000:]}")
            try:
                self.api("status")
                return
            except OSError:
                time.sleep(0.3)
        pytest.fail(f"JupyterLab did not answer in {limit:.0f} s:\n{self.log.read_text()[-3000:]}")

    def kernel_state(self, path: str) -> str | None:
        states = [s["kernel"]["execution_state"] for s in self.api("sessions") if s["path"] == path]
        return states[0] if states else None

    def stop(self) -> None:
        """Shut down (the server stops its kernels, and they their ranks), then make sure."""
        try:
            self.api("shutdown", method="POST")
            self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            pass
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def scratch_course(root: Path) -> None:
    """The course as an instructor has it, in ``root``: grader/nbgrader_config.py, the student labs
    in notebooks/, nbgrader's sources in build/source/ and grading/ for the gradebook. Running
    cells there leaves the repository untouched."""
    (root / "grader").mkdir(parents=True)
    shutil.copy2(REPO / "grader" / "nbgrader_config.py", root / "grader")
    shutil.copytree(notebooks.NOTEBOOKS, root / "notebooks",
                    ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    for lab in notebooks.labs():
        notebooks.write_course_source(lab, root / "build" / "source")
    (root / "grading").mkdir()


def quiet_settings(folder: Path) -> None:
    """JupyterLab's user settings: no "Jupyter news?" pop-up over the page."""
    path = folder / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"fetchNews": "false"}))


@pytest.fixture(scope="module")
def jupyterlab(browser, tmp_path_factory):
    """JupyterLab started from the scratch course's grader/ folder (where nbgrader reads its
    config) with the course as its root, as `make formgrader` does; stopped at the end."""
    tmp = tmp_path_factory.mktemp("jupyterlab")
    course = tmp / "course"
    scratch_course(course)
    quiet_settings(tmp / "settings")
    port, token = free_port(), secrets.token_hex(16)
    # nbgrader runs `alembic`, a script of this interpreter's environment
    env = dict(os.environ,
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
               JUPYTER_CONFIG_DIR=str(tmp / "config"), JUPYTER_RUNTIME_DIR=str(tmp / "runtime"),
               JUPYTERLAB_SETTINGS_DIR=str(tmp / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp / "workspaces"))
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           f"--ServerApp.token={token}", f"--ServerApp.root_dir={course}"]
    if os.geteuid() == 0:
        cmd.append("--allow-root")  # Jupyter refuses root otherwise (containers, CI)
    log = tmp / "jupyterlab.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=course / "grader", env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    server = JupyterLab(f"http://127.0.0.1:{port}", token, proc, log)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def open_lab(tab, server: JupyterLab) -> None:
    """JupyterLab with a fresh workspace (no tabs left open by an earlier test)."""
    tab.goto(f"{server.url}/lab?reset&token={server.token}")
    tab.locator(".jp-DirListing-item").first.wait_for(timeout=120_000)


def open_from_file_browser(tab, server: JupyterLab, path: str):
    """Double-click each folder of ``path``, then the notebook; its panel once shown."""
    open_lab(tab, server)
    for name in path.split("/"):
        tab.locator(".jp-DirListing-item", has_text=name).first.dblclick()
    panel = tab.locator(".jp-NotebookPanel:visible")
    panel.locator(".jp-Cell").first.wait_for(timeout=60_000)
    return panel


def wait_until(condition, what: str, limit: float, tab) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not after {limit:.0f} s")
        tab.wait_for_timeout(250)


def run_all_cells(tab, server: JupyterLab, path: str, panel, limit: float = 300) -> None:
    """Run > Run All Cells once the kernel is up; returns when the run is over (every cell ran,
    or JupyterLab stopped at an error)."""
    wait_until(lambda: server.kernel_state(path) == "idle", f"kernel of {path} idle", 120, tab)
    tab.get_by_role("menuitem", name="Run", exact=True).click()
    tab.get_by_role("menuitem", name="Run All Cells", exact=True).click()
    running = panel.locator(".jp-InputPrompt", has_text="[*]")
    wait_until(lambda: running.count() > 0, f"{path} running", 60, tab)
    calm = []  # idle with nothing queued, three times in a row: not a pause between two cells

    def finished():
        calm.append(running.count() == 0 and server.kernel_state(path) == "idle")
        return calm[-3:] == [True] * 3
    wait_until(finished, f"Run All Cells of {path} finished", limit, tab)


def trouble(panel) -> list[str]:
    """The text of every stderr output in the notebook but distlab's busy-machine notices (text
    content, not inner text: JupyterLab leaves cells outside the viewport unrendered)."""
    return [text for text in panel.locator(STDERR).all_text_contents()
            if not all(BUSY.fullmatch(line) for line in text.splitlines() if line.strip())]


def test_student_runs_lab_1_until_the_first_exercise(page, jupyterlab):
    path = "notebooks/01_collectives/01_collectives.ipynb"
    panel = open_from_file_browser(page, jupyterlab, path)
    run_all_cells(page, jupyterlab, path, panel)
    ranks = panel.get_by_text("[rank 0] hello from rank 0 of 4")
    assert ranks.count() == 1, "rank-prefixed output of the first cell is not shown"
    screenshot(page, "jupyterlab-01-student-rank-output",
               panel.locator(".jp-CodeCell", has_text="[rank 0] hello from rank 0 of 4"))
    widths = images_loaded(page, ".jp-NotebookPanel:not(.lm-mod-hidden)")
    assert len(widths) >= 9 and all(widths), f"figures of the demos: widths {widths}"
    errors = trouble(panel)
    assert len(errors) == 1, errors     # the run stopped at the first stub
    assert "NotImplementedError" in errors[0]
    screenshot(page, "jupyterlab-01-student-first-exercise",
               # the cell of the stub's error (on a busy machine a demo's cell has a notice too)
               panel.locator(".jp-CodeCell", has=page.locator(STDERR, has_text="NotImplementedError")))


def test_instructor_runs_lab_5_clean_and_its_schedule_widget_redraws(page, jupyterlab):
    path = "build/source/05_pipeline_parallel/05_pipeline_parallel.ipynb"
    panel = open_from_file_browser(page, jupyterlab, path)
    run_all_cells(page, jupyterlab, path, panel)
    assert trouble(panel) == []
    widths = images_loaded(page, ".jp-NotebookPanel:not(.lm-mod-hidden)")
    assert len(widths) >= 3 and all(widths), f"figures: widths {widths}"

    explorer = panel.locator(".widget-interact")
    chart = explorer.locator(".widget-output img")
    before = chart.get_attribute("src")
    screenshot(page, "jupyterlab-05-schedule-explorer-m8", explorer)
    slider = explorer.locator(".widget-slider", has_text="micro m").locator("[role=slider]")
    slider.focus()
    slider.press("ArrowRight")   # what a person does with the keyboard; a drag moves it the same
    wait_until(lambda: chart.count() == 1 and chart.get_attribute("src") != before,
               "the schedule chart redrawn after the slider moved", 60, page)
    assert slider.get_attribute("aria-valuenow") == "9.0"
    screenshot(page, "jupyterlab-05-schedule-explorer-m9", explorer)


def test_formgrader_lists_the_labs(page, jupyterlab):
    open_lab(page, jupyterlab)
    page.get_by_role("menuitem", name="Nbgrader", exact=True).click()
    page.get_by_role("menuitem", name="Formgrader", exact=True).click()
    formgrader = page.frame_locator("iframe").first
    for lab in notebooks.labs():
        formgrader.get_by_role("link", name=lab, exact=True).wait_for(timeout=60_000)
    screenshot(page, "jupyterlab-formgrader")


# ----------------------------------------------------------------------------- the site


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def site_url(browser, course_site):
    """The built site served over HTTP, as a static host would serve it."""
    folder, _, _ = course_site
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(folder)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


WIDTHS = {"phone": (390, 844), "desktop": (1280, 800)}


@pytest.fixture(params=list(WIDTHS))
def offline_tab(request, browser, site_url):
    """A tab at phone or desktop size whose every request that would leave the machine is
    aborted in the browser's network stack (Playwright's routing: the DevTools protocol's Fetch
    domain) and recorded; the test fails if the page attempted one."""
    width, height = WIDTHS[request.param]
    context = browser.new_context(viewport={"width": width, "height": height})
    left = []

    def gate(route):
        url = route.request.url
        if url.startswith((site_url, "data:", "blob:")):
            route.continue_()
        else:
            left.append(url)
            route.abort("blockedbyclient")
    context.route("**/*", gate)
    tab = context.new_page()
    tab.width, tab.problems = width, []
    tab.on("pageerror", lambda e: tab.problems.append(f"page error: {e}"))
    tab.on("response",
           lambda r: r.status >= 400 and tab.problems.append(f"{r.url[:120]}: HTTP {r.status}"))
    yield tab
    context.close()
    assert left == [], f"pages tried to reach the network: {sorted(set(left))[:10]}"


def local_links_work(tab) -> list[str]:
    """Every link of the page to another page of the site, each fetched: the broken ones."""
    hrefs = tab.eval_on_selector_all("a[href]", "as => as.map(a => a.href)")
    local = {h.split("#")[0] for h in hrefs if h.startswith(tab.url.rsplit("/", 1)[0])}
    assert local, f"{tab.url} links to no page of the site"
    return [h for h in sorted(local) if tab.request.get(h).status != 200]


def readable(tab) -> dict:
    """What a reader notices first: sideways overflow of the page, characters per line of the
    prose, and the rendered width of each output figure."""
    return tab.evaluate("""() => {
      const ps = [...document.querySelectorAll('article p')].filter(p => p.textContent.length > 300);
      const perLine = ps.map(p => {
        const lines = Math.round(p.getBoundingClientRect().height / parseFloat(getComputedStyle(p).lineHeight));
        return p.textContent.length / Math.max(lines, 1); });
      return {overflow: document.documentElement.scrollWidth - window.innerWidth,
              chars: perLine.length ? Math.max(...perLine) : 0,
              figures: [...document.querySelectorAll('div.cell_output img')].map(i => [i.width, i.naturalWidth]),
              pre: [...document.querySelectorAll('div.cell_output pre')].map(p => getComputedStyle(p).whiteSpace)};
    }""")


def test_site_every_page_reads_well_offline(offline_tab, site_url, course_site):
    tab, (_, pages, _) = offline_tab, course_site
    tab.goto(site_url + "index.html")
    assert local_links_work(tab) == []
    screenshot(tab, f"site-index-{tab.width}", full_page=tab.width > 400)
    for lab in (p for p in pages if p.lab in SITE_LABS):   # every kind of page (conftest.py)
        tab.goto(site_url + "index.html")
        tab.locator("article").get_by_role("link", name=lab.title).click()   # as a reader would
        tab.wait_for_url(f"**/{lab.file}")
        if lab.lab == "02_data_parallel":
            tab.locator("mjx-container").first.wait_for(timeout=60_000)
        widths = images_loaded(tab, "article")
        assert widths and all(widths), f"{lab.file}: image widths {widths}"
        seen = readable(tab)
        assert seen["overflow"] <= 1, f"{lab.file} scrolls sideways at {tab.width} px"
        assert 30 < seen["chars"] <= 95, f"{lab.file}: {seen['chars']:.0f} characters a line"
        assert set(seen["pre"]) == {"pre"}, "printed tables must scroll, not wrap"
        if tab.width < 400:   # a phone: figures at a legible size, scrolled sideways
            assert all(w >= min(n, 600) for w, n in seen["figures"]), seen["figures"]
        assert tab.locator("nav.bd-links a", has_text=lab.title).count() == 1  # the sidebar's
        assert local_links_work(tab) == [], lab.file
        screenshot(tab, f"site-{lab.lab}-{tab.width}")
    assert tab.problems == []


def test_site_search_finds_a_lab_offline(offline_tab, site_url):
    tab = offline_tab
    tab.goto(site_url + "search.html?q=bubble")
    hit = tab.locator("#search-results a", has_text="Pipeline parallelism").first
    hit.wait_for(timeout=30_000)
    assert tab.problems == []


def test_site_dark_mode_follows_the_system(browser, site_url):
    context = browser.new_context(viewport={"width": 1280, "height": 800}, color_scheme="dark")
    tab = context.new_page()
    tab.goto(site_url + "01_collectives.html")
    assert tab.evaluate("document.documentElement.dataset.theme") == "dark"
    background = tab.evaluate("getComputedStyle(document.body).backgroundColor")
    assert sum(map(int, background[background.index("(") + 1:-1].split(",")[:3])) < 200, background
    screenshot(tab, "site-01_collectives-dark")
    context.close()


# Boxes wider than the content column (tests/test_site.py's issue 40): Lab 10's memory table (a
# printed table) and Lab 8's import cell (code), each found by a line of its text.
WIDE_BOXES = {"10_context_parallel": "peak KiB", "08_sharded_data_parallel": "import itertools"}


def edge_shading(box) -> dict:
    """How far the pixels along the left and the right edge of ``box`` (a ``pre``) are from its
    background colour, in 8-bit levels, and the contrast of its text with that background: the
    distlab.css shadow that says "more this way". Sampled in the top padding, where no text is."""
    import io

    from PIL import Image

    style = box.evaluate("""e => { const s = getComputedStyle(e), body = getComputedStyle(document.body);
      return {back: s.backgroundColor, text: s.color, left: parseFloat(s.borderLeftWidth),
              right: parseFloat(s.borderRightWidth), pad: parseFloat(s.paddingTop)}; }""")
    image = Image.open(io.BytesIO(box.screenshot())).convert("RGB")
    back, text = (tuple(map(float, c[c.index("(") + 1:-1].split(",")[:3]))
                  for c in (style["back"], style["text"]))
    y = int(style["pad"] / 2)   # halfway down the top padding

    def off(x: int) -> float:
        return max(abs(a - b) for a, b in zip(image.getpixel((x, y)), back))

    return {"left": off(int(style["left"]) + 2), "right": off(image.width - int(style["right"]) - 3),
            "contrast": max(abs(a - b) for a, b in zip(text, back))}


def test_site_wide_tables_and_code_scroll_in_their_box_with_a_cue(offline_tab, site_url):
    tab = offline_tab
    for lab, line in WIDE_BOXES.items():
        tab.goto(site_url + f"{lab}.html")
        box = tab.locator("article pre", has_text=line).first
        box.evaluate("e => e.scrollIntoView({block: 'center'})")
        seen = box.evaluate("""e => ({wide: e.scrollWidth - e.clientWidth, scroll: getComputedStyle(e).overflowX,
                                      page: document.documentElement.scrollWidth - window.innerWidth})""")
        assert seen["wide"] > 0 and seen["scroll"] == "auto", f"{lab}: {seen}"   # it scrolls...
        assert seen["page"] <= 1, f"{lab} scrolls the page sideways at {tab.width} px"  # ...alone
        # A shadow on the side with more to see, none on the side at its end. The shade drawn is
        # a fraction (35 %, distlab.css) of the text's contrast, fading out from the edge; a plain
        # edge is the background colour give or take one level of antialiasing.
        start = edge_shading(box)
        screenshot(tab, f"site-{lab}-wide-start-{tab.width}")
        box.evaluate("e => { e.scrollLeft = e.scrollWidth; }")
        tab.wait_for_function("e => e.scrollLeft > 0", arg=box.element_handle())
        end = edge_shading(box)
        screenshot(tab, f"site-{lab}-wide-end-{tab.width}")
        shaded = start["contrast"] * 0.35 / 4
        assert start["right"] >= shaded and start["left"] <= 1, f"{lab} at its start: {start}"
        assert end["left"] >= shaded and end["right"] <= 1, f"{lab} scrolled to its end: {end}"
    assert tab.problems == []


def python_schedule(kind: str, p: int, m: int, ratio: float) -> dict:
    """What Lab 5's schedule explorer prints for these inputs, from the Python functions."""
    from distlab.labs.pipeline.schedules import simulate
    from distlab.labs.pipeline.stages import measured_bubble, peak_in_flight, theoretical_bubble

    events = simulate(kind, p, m, t_fwd=1.0, t_bwd=ratio)
    mm = 1 if kind == "naive" else m
    return {"bubble": f"{measured_bubble(events, p):.3f}",
            "theory": f"{theoretical_bubble(p, mm):.3f}",
            "in-flight": str(list(peak_in_flight(events).values()))}


def test_site_lab_5_schedule_twin_redraws_as_the_python_computes(offline_tab, site_url):
    tab = offline_tab
    tab.goto(site_url + "05_pipeline_parallel.html")
    twin = tab.locator('.distlab-twin[data-twin="schedule"]')
    twin.locator("svg.distlab-gantt").wait_for()

    def drawn():
        kind, p, m, ratio = twin.get_attribute("data-state").split(",")
        shown = {k: twin.locator(f'[data-out="{k}"]').inner_text()
                 for k in ("bubble", "theory", "in-flight")}
        bars = twin.locator("svg rect").count()
        return (kind, int(p), int(m), float(ratio)), shown, bars

    def same_as_python():
        (kind, p, m, ratio), shown, bars = drawn()
        assert shown == python_schedule(kind, p, m, ratio), (kind, p, m, ratio)
        assert bars == p * 2 * (1 if kind == "naive" else m)        # one bar per F and B
        return kind, p, m, ratio

    assert same_as_python() == ("1f1b", 4, 8, 2.0)                  # the lab's defaults
    screenshot(tab, f"site-05-twin-start-{tab.width}", twin)
    for name, presses in (("p", ["ArrowRight", "ArrowRight"]), ("m", ["ArrowLeft"] * 5),
                          ("ratio", ["ArrowLeft", "ArrowLeft"]), ("m", ["End"]), ("p", ["Home"])):
        for key in presses:
            before = drawn()
            twin.locator(f'input[name="{name}"]').press(key)
            assert drawn() != before, f"{name}: {key} redrew nothing"
            same_as_python()
    for kind in ("gpipe", "naive", "1f1b"):
        twin.locator('select[name="kind"]').select_option(kind)
        assert same_as_python()[0] == kind
    assert drawn()[0] == ("1f1b", 2, 16, 1.0)
    screenshot(tab, f"site-05-twin-moved-{tab.width}", twin)
    assert tab.problems == []


def python_plan(state: dict) -> dict:
    """What Lab 7's planner computes for these inputs (its ``show``), from the Python functions:
    the layout chosen, memory per GPU (GB), bubble, GB sent per axis and the step's seconds."""
    from distlab.labs import planning as pl

    model = pl.model_of_size(state["params_b"])
    cluster = pl.Cluster("", state["nodes"], state["gpus_per_node"], state["gpu_mem_gb"])
    seqs = max(cluster.gpus, cluster.gpus * round(state["batch_m_tokens"] * 1e6 / state["seq_len"]
                                                  / cluster.gpus))
    job = pl.Job(seq_len=state["seq_len"], global_batch=seqs, zero_stage=state["zero_stage"],
                 recompute=state["recompute"], zero_accumulation=state["zero_accumulation"])
    try:
        cfg = pl.reference_choose_degrees(model, cluster, job)
    except ValueError:
        return {}
    comm, step = pl.comm_bytes_per_step(model, cfg), pl.step_time(model, cluster, cfg)
    return {"layout": str(cfg), "memory": pl.memory_per_gpu(model, cfg)["total"] / pl.GB,
            "bubble": pl.bubble_fraction(cfg.pp, cfg.microbatches),
            "tp": comm["tp"] / pl.GB, "pp": comm["pp"] / pl.GB, "dp": comm["dp"] / pl.GB,
            "step": step["total"]}


def test_site_lab_7_planner_twin_computes_as_the_python(offline_tab, site_url):
    tab = offline_tab
    tab.goto(site_url + "07_3d_parallelism.html")
    twin = tab.locator('.distlab-twin[data-twin="planner"]')
    twin.locator("pre.distlab-plan").wait_for()

    def same_as_python() -> dict:
        state = json.loads(twin.get_attribute("data-state"))
        drawn, expected = json.loads(twin.get_attribute("data-plan")), python_plan(state)
        assert drawn.keys() == expected.keys(), (state, drawn, expected)
        for key, value in expected.items():
            if key == "layout":
                assert drawn[key] == value, (state, key)
            else:   # the page shows the Python's number, rounded to the digits it prints
                digits = len(drawn[key].split(".")[1])
                assert abs(float(drawn[key]) - value) <= 0.5 * 10 ** -digits + 1e-9, (state, key)
        if expected:
            assert expected["layout"] in twin.locator("pre").inner_text()
        return state

    start = same_as_python()
    assert (start["params_b"], start["nodes"], start["gpu_mem_gb"]) == (70, 16, 80)
    screenshot(tab, f"site-07-planner-start-{tab.width}", twin)
    sliders = ("params_b", "seq_len", "gpus_per_node", "nodes", "gpu_mem_gb", "batch_m_tokens")
    for name in sliders:
        for key in ("ArrowLeft", "ArrowRight", "ArrowLeft"):
            before = twin.get_attribute("data-state")
            twin.locator(f'input[name="{name}"]').press(key)
            assert twin.get_attribute("data-state") != before, f"{name}: {key} changed nothing"
            same_as_python()
    for name, options in (("zero_stage", ["3", "0", "2"]), ("recompute", ["full", "none"]),
                          ("zero_accumulation", ["resident", "regather"])):
        for option in options:
            twin.locator(f'select[name="{name}"]').select_option(option)
            same_as_python()
    twin.locator('input[name="params_b"]').press("End")           # 1000B: nothing fits
    assert same_as_python()["params_b"] == 1000
    assert "No (TP, PP, DP) layout fits" in twin.locator("pre").inner_text()
    screenshot(tab, f"site-07-planner-moved-{tab.width}", twin)
    assert tab.problems == []
