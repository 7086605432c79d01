"""The rendered course for self-learners: ``distlab site [LAB...] [--version solutions|student]``.

Every lab runs top to bottom in a fresh kernel (nbclient, widget state kept) and nbconvert renders
it into ``build/site/``: ``index.html`` lists the labs with their one-line summary (the
``distlab: summary:`` header of the lab's source) and the time each took to run; each lab page has
its text, code, output, figures and widgets, a link to the previous lab, the next and the index,
and every "Lab N" of its text links to that lab's page.

Pages work offline and from ``file://``: figures are data URIs inside the page, and what
nbconvert's pages would fetch from CDNs (require.js, the Jupyter widget manager, MathJax) is copied
into ``_static/`` from npm packages, fetched once with ``npm pack`` into ``build/vendor/`` and
checked against the sha512 pinned in ``distlab.course.site_assets.ASSETS``.

``--version solutions`` (the default, for self-learners) renders the solutions without the hidden
tests; ``--version student`` renders ``notebooks/`` as handed out, not executed (their exercises
are stubs, so a run would stop at the first one).

The site is built in a scratch folder and moved into place only when every lab ran: a lab that
fails stops the build naming the lab, the cell and the error, and the previous site stays.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import html
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from distlab.course import notebooks
from distlab.course.site_assets import STATIC, VENDOR, SiteError, copy_static

REPO = notebooks.REPO
SITE = REPO / "build" / "site"
VERSIONS = ("solutions", "student")
CELL_TIMEOUT = 600  # a lab takes about a minute; this only stops a cell that hangs outside distlab.run


# ----------------------------------------------------------------------------- the labs


@dataclasses.dataclass
class Page:
    """One lab's page: ``title`` and ``summary`` for the index, ``seconds`` it took to run
    (None when not executed)."""
    lab: str
    title: str
    summary: str
    seconds: float | None = None

    @property
    def number(self) -> int:
        return int(self.lab.split("_", 1)[0])

    @property
    def file(self) -> str:
        return f"{self.lab}.html"


def lab_notebook(lab: str, version: str) -> nbformat.NotebookNode:
    if version == "solutions":
        return notebooks.reader_notebook(lab)
    return nbformat.read(notebooks.NOTEBOOKS / lab / f"{lab}.ipynb", as_version=4)


def title_of(nb: nbformat.NotebookNode, lab: str) -> str:
    """The first markdown heading: every lab opens with ``# Lab N — Name``."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("#"):
                    return line.lstrip("#").strip()
    return lab


def _cell_label(cell) -> str:
    gid = cell.metadata.get("nbgrader", {}).get("grade_id")
    first = next((line for line in cell.source.splitlines() if line.strip()), "").strip()
    return (f"grade_id {gid}: " if gid else "") + repr(first[:80])


def _strip_ansi(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text)


def execute(nb: nbformat.NotebookNode, lab: str, cwd: Path) -> float:
    """Run ``nb`` top to bottom in a fresh kernel in ``cwd``, keeping the widgets' state for the
    page; the seconds it took. A failing cell raises ``SiteError`` naming the lab and the cell."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    current = {"index": 0}

    def started(cell, cell_index, **_):
        current["index"] = cell_index

    client = NotebookClient(nb, timeout=CELL_TIMEOUT, startup_timeout=120, kernel_name="python3",
                            store_widget_state=True, on_cell_start=started,
                            resources={"metadata": {"path": str(cwd)}})
    start = time.perf_counter()
    try:
        client.execute()
    except Exception as e:  # noqa: BLE001 (an error, a timeout, a dead kernel: all fail the build)
        i = current["index"]
        what = (f"{e.ename}: {e.evalue}" if isinstance(e, CellExecutionError)
                else f"{type(e).__name__}: {e}".splitlines()[0])
        lines = [line for line in _strip_ansi(str(e)).splitlines()
                 if line.strip() and set(line.strip()) != {"-"}]  # no rules or blank lines
        tail = "\n    ".join(lines[-10:])
        raise SiteError(
            f"Lab {lab} failed to execute at cell {i + 1} of {len(nb.cells)} "
            f"({_cell_label(nb.cells[i])}): {what}\n    {tail}\n"
            f"No site was written (a previous one is left as it was). Run the lab in JupyterLab "
            f"(`make lab`) to see the whole traceback, fix it, then try just this lab with "
            f"`distlab site {lab}`.") from None
    return time.perf_counter() - start


# ----------------------------------------------------------------------------- rendering

LAB_MENTION = re.compile(r"(?<![\[\w])Lab (\d+)\b(?!\])")


def link_lab_mentions(markdown: str, pages: list[Page], current: str) -> str:
    """Each "Lab N" of ``markdown`` as a link to that lab's page, when it is on the site and is
    not the page itself."""
    by_number = {p.number: p for p in pages}

    def link(m):
        page = by_number.get(int(m.group(1)))
        return m.group(0) if page is None or page.lab == current else f"[{m.group(0)}]({page.file})"

    return LAB_MENTION.sub(link, markdown)


def nav_html(pages: list[Page], i: int) -> str:
    """Previous lab, index, next lab."""
    def link(page, text):
        return f'<a href="{page.file}">{html.escape(text)}</a>'
    prev = link(pages[i - 1], f"← {pages[i - 1].title}") if i > 0 else "<span></span>"
    nxt = link(pages[i + 1], f"{pages[i + 1].title} →") if i + 1 < len(pages) else "<span></span>"
    return f'<nav class="distlab-nav">{prev}<a href="index.html">All labs</a>{nxt}</nav>'


# No favicon request (a 404 in every page's log).
NO_FAVICON = '<link rel="icon" href="data:,">'

# nbconvert's lab page with MathJax 3 from _static (nbconvert's MathJax 2 block loads it from a
# CDN) and the navigation above and below the lab. The widget manager typesets labels with
# MathJax 2's `MathJax.Hub.Queue`; `Hub` forwards that to MathJax 3, before and after it loads.
PAGE_TEMPLATE = """{%- extends 'lab/index.html.j2' -%}
{%- block html_head_js_mathjax -%}
<script>
(function () {
  var hub = {Queue: function (job) {
    if (window.MathJax.typesetPromise) { window.MathJax.typesetPromise(job[2] ? [job[2]] : undefined); }
  }};
  window.MathJax = {
    tex: {inlineMath: [['$', '$'], ['\\\\(', '\\\\)']], processEscapes: true},
    startup: {ready: function () { window.MathJax.startup.defaultReady(); window.MathJax.Hub = hub; }},
    Hub: hub
  };
}());
</script>
<script src="_static/mathjax/es5/tex-svg.js" async></script>
{%- endblock html_head_js_mathjax -%}
{%- block extra_css -%}
""" + NO_FAVICON + """
<style>
nav.distlab-nav { display: flex; justify-content: space-between; gap: 1em; margin: 1em auto;
  padding: 0.5em 1em; max-width: 1100px; font-family: var(--jp-ui-font-family); font-size: 14px;
  border-bottom: 1px solid #ddd; }
nav.distlab-nav a { color: #1d5f8a; text-decoration: none; }
.widget-label, .widget-readout, .widget-dropdown select { font-family: var(--jp-ui-font-family); }
</style>
{%- endblock extra_css -%}
{%- block body_header -%}{{ super() }}{{ resources.distlab_nav }}{%- endblock body_header -%}
{%- block body_footer -%}{{ resources.distlab_nav }}{{ super() }}{%- endblock body_footer -%}
"""


def exporter():
    """nbconvert's HTML exporter for lab pages: scripts from _static, images inline."""
    import jinja2
    from nbconvert import HTMLExporter

    return HTMLExporter(
        extra_loaders=[jinja2.DictLoader({"distlab_page.html.j2": PAGE_TEMPLATE})],
        template_file="distlab_page.html.j2", embed_images=True, theme="light",
        require_js_url=f"{STATIC}/requirejs/require.js",
        widget_renderer_url=f"{STATIC}/html-manager/dist/embed-amd.js")


def render(nb: nbformat.NotebookNode, pages: list[Page], i: int, html_exporter) -> str:
    page = pages[i]
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = link_lab_mentions(cell.source, pages, page.lab)
    body, _ = html_exporter.from_notebook_node(
        nb, resources={"metadata": {"name": page.title}, "distlab_nav": nav_html(pages, i)})
    return body


INDEX_TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1.0">
<title>distlab: distributed training, lab by lab</title>
""" + NO_FAVICON + """
<style>
body { font-family: system-ui, sans-serif; max-width: 900px; margin: 2em auto; padding: 0 1em;
  color: #222; line-height: 1.45; }
table { border-collapse: collapse; width: 100%; }
td, th { text-align: left; padding: 0.5em; border-bottom: 1px solid #ddd; vertical-align: top; }
th, td.time { white-space: nowrap; }
a { color: #1d5f8a; }
</style>
</head>
<body>
<h1>distlab: how large models are trained across many devices</h1>
<p>Labs that run real <code>torch.distributed</code> code on several processes of one machine,
and unchanged on GPUs. {{ version_note }}</p>
<table>
<tr><th>lab</th><th>what you build</th><th>ran in</th></tr>
{%- for page in pages %}
<tr><td><a href="{{ page.file }}">{{ page.title }}</a></td><td>{{ page.summary }}</td>
<td class="time">{{ "%.0f s" % page.seconds if page.seconds is not none else "not run" }}</td></tr>
{%- endfor %}
</table>
<p>Built {{ built }} in {{ "%.0f" % total }} s{{ machine }}. To run the labs yourself: clone the
repository and <code>make lab</code>.</p>
</body>
</html>
"""

VERSION_NOTES = {
    "solutions": ("Each page is a lab with its solutions, run top to bottom on a CPU with gloo: "
                  "the outputs and figures are what it printed and drew."),
    "student": ("Each page is a lab as handed out to students, not run: the exercises are stubs "
                "for you to fill in."),
}


def index_html(pages: list[Page], version: str, total: float) -> str:
    import jinja2

    cores = os.cpu_count()
    return jinja2.Template(INDEX_TEMPLATE, autoescape=True).render(
        pages=pages, version_note=VERSION_NOTES[version], total=total,
        built=time.strftime("%Y-%m-%d %H:%M"),
        machine=f" on {cores} CPU cores" if version == "solutions" and cores else "")


# ----------------------------------------------------------------------------- the build


@contextlib.contextmanager
def swapped_in(out: Path):
    """A scratch folder beside ``out`` that replaces it only if the block succeeds, so that
    ``out`` is never a partial site."""
    scratch = out.with_name(out.name + ".partial")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    try:
        yield scratch
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    shutil.rmtree(out, ignore_errors=True)
    scratch.rename(out)


def run_lab(lab: str, nb: nbformat.NotebookNode, log) -> float:
    """Execute ``lab`` in a copy of its folder (what it writes stays out of the repository)."""
    log(f"{lab}: running")
    with tempfile.TemporaryDirectory(prefix=f"distlab-site-{lab}-") as tmp:
        seconds = execute(nb, lab, notebooks.write_source(lab, Path(tmp)).parent)
    log(f"{lab}: ran in {seconds:.1f} s")
    return seconds


def build_site(labs: list[str] | None = None, version: str = "solutions", out: Path = SITE,
          vendor: Path = VENDOR, log=print) -> list[Page]:
    """Execute (solutions) and render ``labs`` (default: all) into ``out``; the pages built."""
    labs = sorted(labs or notebooks.labs())  # in course order, whatever order they were named
    start = time.perf_counter()
    nbs = {lab: lab_notebook(lab, version) for lab in labs}
    pages = [Page(lab, title_of(nbs[lab], lab), notebooks.lab_summary(lab)) for lab in labs]
    with swapped_in(out) as scratch:
        copy_static(scratch, vendor)
        html_exporter = exporter()
        for i, page in enumerate(pages):
            if version == "solutions":
                page.seconds = run_lab(page.lab, nbs[page.lab], log)
            (scratch / page.file).write_text(render(nbs[page.lab], pages, i, html_exporter))
        (scratch / "index.html").write_text(index_html(pages, version, time.perf_counter() - start))
    return pages


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="distlab site",
        description="Run every lab in a fresh kernel and render them into a static HTML site.")
    parser.add_argument("labs", nargs="*", metavar="LAB", help="labs to put on the site (default: all)")
    parser.add_argument("--version", choices=VERSIONS, default="solutions",
                        help="solutions (run, hidden tests left out; default) or the student labs "
                             "as handed out (not run)")
    parser.add_argument("--out", type=Path, default=SITE, help=f"where to write it (default: {SITE})")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.labs) - set(notebooks.labs()))
    if unknown:
        print(f"no such lab: {', '.join(unknown)} (labs: {', '.join(notebooks.labs())})",
              file=sys.stderr)
        return 2
    start = time.perf_counter()
    try:
        pages = build_site(args.labs, args.version, args.out.resolve())
    except SiteError as e:
        print(f"distlab site: {e}", file=sys.stderr)
        return 1
    print(f"site: {len(pages)} labs in {time.perf_counter() - start:.0f} s; open "
          f"{args.out.resolve() / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
