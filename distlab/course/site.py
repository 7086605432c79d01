"""The rendered course for self-learners: ``distlab site [LAB...] [--version solutions|student]``.

Every lab runs top to bottom in a fresh kernel (nbclient, widget state kept); Sphinx with myst-nb
and sphinx-book-theme renders the executed notebooks into ``build/site/`` (``site_sphinx``):
``index.html`` lists the labs with their one-line summary (the ``distlab: summary:`` header of the
lab's source) and the time each took to run; each lab page has its text, code, output, figures and
widgets, solutions folded under "Show solution", a sidebar of labs, in-page contents,
previous/next links, offline search, and links to run it yourself (``site_pages``).

Pages work offline and from ``file://``: the theme's files are local, and the scripts a notebook
site would fetch from CDNs (require.js, the Jupyter widget manager, MathJax) are copied into
``_static/`` from npm packages, fetched once with ``npm pack`` into ``build/vendor/`` and checked
against the sha512 pinned in ``distlab.course.site_assets.ASSETS``. Lab 5's schedule explorer and
Lab 7's planner have JavaScript twins (``site_static/twins.js``) that redraw without a kernel.

``--version solutions`` (the default, for self-learners) renders the solutions without the hidden
tests; ``--version student`` renders ``notebooks/`` as handed out, not executed (their exercises
are stubs, so a run would stop at the first one).

The site is built in a scratch folder and moved into place only when every lab ran: a lab that
fails stops the build naming the lab, the cell and the error, and the previous site stays.
The output folder is replaced only when it is absent, empty or a previous site (its
``.distlab-site`` marker, ``distlab.grading.folders``), or with ``--force``.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from distlab.course import notebooks, site_pages, site_sphinx
from distlab.course.site_assets import VENDOR, SiteError, copy_static
from distlab.course.site_pages import Page, link_lab_mentions, title_of  # noqa: F401 (the API)
from distlab.course.site_settings import SiteSettings, site_settings
from distlab.grading.folders import FolderInUse, claim, mark

REPO = notebooks.REPO
SITE = REPO / "build" / "site"
VERSIONS = ("solutions", "student")
CELL_TIMEOUT = 600  # a lab takes about a minute; this only stops a cell that hangs outside distlab.run


# ----------------------------------------------------------------------------- the labs


def lab_notebook(lab: str, version: str) -> nbformat.NotebookNode:
    if version == "solutions":
        return notebooks.reader_notebook(lab)
    return nbformat.read(notebooks.NOTEBOOKS / lab / f"{lab}.ipynb", as_version=4)


def _cell_label(cell) -> str:
    gid = cell.metadata.get("nbgrader", {}).get("grade_id")
    first = next((line for line in cell.source.splitlines() if line.strip()), "").strip()
    return (f"grade_id {gid}: " if gid else "") + repr(first[:80])


def _strip_ansi(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text)


def kernel_config():
    """The kernel manager's settings for a lab's run: its messages encrypted (CurveZMQ) where
    pyzmq and the kernel support it. Over plain TCP every kernel prints "Kernel is running over
    TCP without encryption", once per lab, a warning the reader of `make site` cannot act on."""
    import zmq
    from traitlets.config import Config

    return Config({"KernelManager": {"transport_encryption": "auto" if zmq.has("curve")
                                     else "disabled"}})


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
                            resources={"metadata": {"path": str(cwd)}}, config=kernel_config())
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


# ----------------------------------------------------------------------------- the build


def _old_site(folder: Path) -> bool:
    """A site built before sites carried their marker: its index beside the course's own script."""
    return (folder / "index.html").is_file() and (folder / "_static" / "twins.js").is_file()


def _claim(out: Path, force: bool) -> None:
    claim(out, "site", force, legacy=_old_site,
          remedy="pass --force to replace it and everything in it with the site")


@contextlib.contextmanager
def swapped_in(out: Path, force: bool = False):
    """A scratch folder beside ``out`` that replaces it only if the block succeeds, so that
    ``out`` is never a partial site; ``out`` must be a previous site (or ``force``)."""
    _claim(out, force)
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    scratch.chmod(0o755)   # mkdtemp's 0700 would keep a web server from reading the site
    try:
        yield scratch
        mark(scratch, "site")
        _claim(out, force)   # a folder made there while the labs ran is not replaced either
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
    log(f"{lab}: ran in {seconds:.0f} s")   # as the index shows it
    return seconds


def build_site(labs: list[str] | None = None, version: str = "solutions", out: Path = SITE,
               vendor: Path = VENDOR, log=print,
               settings: SiteSettings = SiteSettings(), force: bool = False) -> list[Page]:
    """Execute (solutions) ``labs`` (default: all) and render them with Sphinx into ``out``,
    with the course's ``settings`` (author, repository; ``site_settings``); the pages built.
    ``out`` is replaced only when it is a previous site, or with ``force``."""
    labs = sorted(labs or notebooks.labs())  # in course order, whatever order they were named
    start = time.perf_counter()
    nbs = {lab: lab_notebook(lab, version) for lab in labs}
    pages = [Page(lab, title_of(nbs[lab], lab), notebooks.lab_summary(lab)) for lab in labs]
    with swapped_in(out, force) as scratch, tempfile.TemporaryDirectory(prefix="distlab-site-src-") as tmp:
        src = Path(tmp)
        copy_static(src, vendor)
        (src / site_pages.STUDENT_DIR).mkdir()
        for i, page in enumerate(pages):
            if version == "solutions":
                page.seconds = run_lab(page.lab, nbs[page.lab], log)
            nbformat.write(site_pages.lab_page(nbs[page.lab], pages, i, settings.repository,
                                                solutions=version == "solutions"),
                           src / f"{page.lab}.ipynb")
            shutil.copy2(notebooks.NOTEBOOKS / page.lab / f"{page.lab}.ipynb",
                         src / site_pages.STUDENT_DIR / f"{page.lab}.ipynb")
        cores = os.cpu_count()
        machine = f" on {cores} CPU cores" if version == "solutions" and cores else ""
        built = f"{time.strftime('%Y-%m-%d %H:%M')} in {time.perf_counter() - start:.0f} s"
        (src / "index.md").write_text(site_pages.index_md(pages, version, built, machine,
                                                              settings.repository))
        log("rendering with Sphinx")
        site_sphinx.render(src, scratch, "distlab", settings, log)
    return pages


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="distlab site",
        description="Run every lab in a fresh kernel and render them into a static HTML site.")
    parser.add_argument("labs", nargs="*", metavar="LAB", help="labs to put on the site (default: all)")
    parser.add_argument("--version", choices=VERSIONS, default="solutions",
                        help="solutions (run, hidden tests left out; default) or the student labs "
                             "as handed out (not run)")
    parser.add_argument("--out", type=Path, default=SITE,
                        help=f"where to write it (default: {SITE}); replaced whole only when it is "
                             f"a previous site (it holds .distlab-site) or with --force")
    parser.add_argument("--force", action="store_true",
                        help="replace --out even if it is not a previous site (everything in it "
                             "is deleted)")
    parser.add_argument("--repository", default=None,
                        help="the course's repository URL for the pages' links (default: "
                             "`repository` in grader/course.cfg, else the checkout's git origin "
                             "if it is a web URL, else none)")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.labs) - set(notebooks.labs()))
    if unknown:
        print(f"no such lab: {', '.join(unknown)} (labs: {', '.join(notebooks.labs())})",
              file=sys.stderr)
        return 2
    start = time.perf_counter()
    try:
        pages = build_site(args.labs, args.version, args.out.resolve(),
                           settings=site_settings(args.repository), force=args.force)
    except (SiteError, FolderInUse) as e:
        print(f"distlab site: {e}", file=sys.stderr)
        return 1
    print(f"site: {len(pages)} labs in {time.perf_counter() - start:.0f} s; open "
          f"{args.out.resolve() / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
