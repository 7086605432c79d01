"""The site's pages as Sphinx sources: each executed lab notebook with a "run it yourself" box,
its solutions folded, its live widgets replaced by their JavaScript twins (or marked as
snapshots), and ``index.md`` listing the labs. Sphinx with myst-nb (``site_sphinx``) renders them.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import nbformat

from distlab.course import notebooks

REPO = notebooks.REPO
STUDENT_DIR = "_student"   # the student notebooks, offered for download (not pages themselves)
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"

# The widgets whose arithmetic has a JavaScript twin in site_static/twins.js: the call a cell makes
# -> the twin drawn in its place. Any other widget is shown as saved, with a notice.
# (A cell may pass the reader's own functions, e.g. planner(choose_degrees, memory_per_gpu).)
TWINS = {"schedule_explorer(": "schedule", "planner(": "planner"}
SNAPSHOT_NOTICE = ('<p class="distlab-snapshot">snapshot: run the lab to interact (this widget '
                   'shows what it drew when the lab ran; its sliders redraw only in a kernel)</p>')


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


def title_of(nb: nbformat.NotebookNode, lab: str) -> str:
    """The first markdown heading: every lab opens with ``# Lab N — Name``."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("#"):
                    return line.lstrip("#").strip()
    return lab


LAB_MENTION = re.compile(r"(?<![\[\w])Lab (\d+)\b(?!\])")


def link_lab_mentions(markdown: str, pages: list[Page], current: str) -> str:
    """Each "Lab N" of ``markdown`` as a link to that lab's page, when it is on the site and is
    not the page itself (a link to the notebook, which MyST resolves to its page)."""
    by_number = {p.number: p for p in pages}

    def link(m):
        page = by_number.get(int(m.group(1)))
        return (m.group(0) if page is None or page.lab == current
                else f"[{m.group(0)}]({page.lab}.ipynb)")

    return LAB_MENTION.sub(link, markdown)


def setup_commands(readme: Path = REPO / "README.md") -> list[str]:
    """The commands of the README's "Two commands" block, so the pages stay in step with it."""
    text = readme.read_text() if readme.is_file() else ""
    block = re.search(r"## Two commands.*?```bash\n(.*?)```", text, re.S)
    lines = block.group(1).splitlines() if block else ["make lab", "make test"]
    return [line.split("#")[0].strip() for line in lines if line.strip()]


LAUNCHES_RANKS = re.compile(r"\b(run|run_mesh|demo|run_schedules?)\(|world_size")


def starts_processes(nb: nbformat.NotebookNode) -> bool:
    """Whether the lab's code starts ranks (distlab.run and the helpers built on it): Colab gives
    one small VM without the distlab package, so such a lab is not offered there."""
    return any(c.cell_type == "code" and LAUNCHES_RANKS.search(c.source) for c in nb.cells)


def where_to_run(repository: str | None) -> str:
    """Where the set-up commands run: a clone of the course's repository, named by its URL; with
    no URL set (grader/course.cfg), the sentence names none rather than a placeholder."""
    if repository:
        return f"clone the course's repository, [{repository}]({repository}), then, in its folder"
    return "in your copy of the course's folder, run"


def _capitalized(sentence: str) -> str:
    return sentence[:1].upper() + sentence[1:]


def run_box(lab: str, nb: nbformat.NotebookNode, repository: str | None,
            executed: bool = True) -> str:
    """The "run it yourself" box under the title: downloads, repository, set-up, Colab."""
    commands = "\n".join(setup_commands())
    if starts_processes(nb):
        colab = ("Not on Colab: this lab starts several processes (one per rank) and needs the "
                 "`distlab` package, so run it on your machine.")
    elif repository and "github.com/" in repository:
        slug = repository.split("github.com/", 1)[1].removesuffix(".git").strip("/")
        colab = (f"[Open in Colab](https://colab.research.google.com/github/{slug}/blob/main/"
                 f"notebooks/{lab}/{lab}.ipynb)")
    else:
        colab = "Colab needs the repository on GitHub; run it on your machine."
    return (f":::{{admonition}} Run it yourself\n:class: distlab-run tip\n"
            f"Download the {{download}}`{'executed' if executed else 'page'} notebook <{lab}.ipynb>` "
            f"(what this page shows) "
            f"or the {{download}}`student notebook <{STUDENT_DIR}/{lab}.ipynb>` (exercises as "
            f"stubs, to do yourself). {_capitalized(where_to_run(repository))}:\n\n"
            f"```bash\n{commands}\n```\n\n{colab}\n:::\n")


def fold_solutions(nb: nbformat.NotebookNode, lab: str) -> None:
    """Each nbgrader solution cell folded under "Show solution", after a link to the student
    notebook, so that a reader can try the exercise first."""
    cells = []
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("solution"):
            cells.append(nbformat.v4.new_markdown_cell(
                f"```{{container}} distlab-try\nTry it first: the exercise is a stub in the "
                f"{{download}}`student notebook <{STUDENT_DIR}/{lab}.ipynb>`.\n```"))
            if cell.cell_type == "code":
                cell.metadata.setdefault("tags", []).append("hide-input")
                cell.metadata["mystnb"] = {"code_prompt_show": "Show solution",
                                           "code_prompt_hide": "Hide solution"}
            else:
                cell.source = (f":::{{admonition}} Show solution\n:class: dropdown\n"
                               f"{cell.source}\n:::")
        cells.append(cell)
    nb.cells = cells


def shows_widget(cell) -> bool:
    return cell.cell_type == "code" and any(WIDGET_VIEW in o.get("data", {})
                                            for o in cell.get("outputs", []))


def twin_or_notice(nb: nbformat.NotebookNode) -> None:
    """A widget with a JavaScript twin is drawn by the twin (its saved snapshot removed); any
    other widget keeps its saved state under a visible snapshot notice."""
    cells, snapshots = [], 0
    for cell in nb.cells:
        cells.append(cell)
        if not shows_widget(cell):
            continue
        twin = next((t for call, t in TWINS.items() if call in cell.source), None)
        snapshots += not twin
        if twin:
            cell.metadata.setdefault("tags", []).append("remove-output")
            html = (f'<div class="distlab-twin" data-twin="{twin}">live: this copy of the '
                    f'widget runs in your browser</div>')
        else:
            html = SNAPSHOT_NOTICE
        cells.append(nbformat.v4.new_markdown_cell(f"```{{raw}} html\n{html}\n```"))
    nb.cells = cells
    if not snapshots:  # no saved widget left to draw: the page loads no widget manager
        nb.metadata.pop("widgets", None)


def lab_page(nb: nbformat.NotebookNode, pages: list[Page], i: int, repository: str | None,
             solutions: bool = True) -> nbformat.NotebookNode:
    """``nb`` as the source of its page (``solutions``: the executed reader's version, whose
    solutions are folded; otherwise the student's, whose exercises are stubs)."""
    page = pages[i]
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = link_lab_mentions(cell.source, pages, page.lab)
    if solutions:
        fold_solutions(nb, page.lab)
    twin_or_notice(nb)
    box = nbformat.v4.new_markdown_cell(run_box(page.lab, nb, repository, executed=solutions))
    first = next(j for j, c in enumerate(nb.cells) if c.cell_type == "markdown")
    title, _, rest = nb.cells[first].source.partition("\n")   # the box right under the title
    nb.cells[first].source = title
    nb.cells[first + 1:first + 1] = [box] + ([nbformat.v4.new_markdown_cell(rest)] if rest.strip() else [])
    return nb


VERSION_NOTES = {
    "solutions": ("Each page is a lab with its solutions (folded: try first), run top to bottom "
                  "on a CPU with gloo: the outputs and figures are what it printed and drew."),
    "student": ("Each page is a lab as handed out to students, not run: the exercises are stubs "
                "for you to fill in."),
}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def index_md(pages: list[Page], version: str, built: str, machine: str,
             repository: str | None = None) -> str:
    """The home page: what the course is, the labs (also the sidebar's table of contents)."""
    rows = "\n".join(
        f"| [{_cell(p.title)}]({p.lab}.ipynb) | {_cell(p.summary)} | "
        f"{f'{p.seconds:.0f} s' if p.seconds is not None else 'not run'} |" for p in pages)
    toc = "\n".join(p.lab for p in pages)
    commands = "\n".join(setup_commands())
    return (f"# distlab: how large models are trained across many devices\n\n"
            f"Labs that run real `torch.distributed` code on several processes of one machine, "
            f"and unchanged on GPUs. {VERSION_NOTES[version]}\n\n"
            f"| lab | what you build | ran in |\n| --- | --- | --- |\n{rows}\n\n"
            f"Built {built}{machine}. To run the labs yourself, {where_to_run(repository)}:"
            f"\n\n```bash\n{commands}\n```\n\n"
            f"```{{toctree}}\n:hidden:\n:caption: Labs\n\n{toc}\n```\n")
