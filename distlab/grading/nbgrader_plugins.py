"""The grader's pieces that nbgrader runs, named in grader/nbgrader_config.py and set up by the
worker (``distlab.grading.worker``): the notebook's time budget, the preprocessors (one for
autograde, two for the feedback) and the feedback's HTML exporter."""
from __future__ import annotations

import re
import time
from pathlib import Path

from jinja2 import BytecodeCache
from nbconvert.exporters import HTMLExporter
from nbconvert.preprocessors import Preprocessor
from nbformat.v4 import new_output
from nbgrader import utils
from traitlets import Bool

from distlab import paths


class NotebookBudget:
    """``Execute.timeout_func``: each cell may take ``per_cell`` seconds, and all cells of a
    notebook together ``per_notebook``; once that is spent every later cell gets 1 second
    (nbclient reads 0 as "no limit"). ``reset()`` starts a new notebook's budget."""

    def __init__(self, per_cell: float, per_notebook: float):
        self.per_cell, self.per_notebook = per_cell, per_notebook
        self.started: float | None = None

    def reset(self) -> None:
        self.started = None

    def __call__(self, cell) -> int:
        now = time.monotonic()
        if self.started is None:
            self.started = now
        left = self.per_notebook - (now - self.started)
        return max(1, int(min(self.per_cell, left)))


class _CompiledTemplates(BytecodeCache):
    """Jinja's compiled templates, kept in memory for the process. Jinja files each under the
    template's name and checks the source's checksum before it reuses one, so a changed
    template is compiled again."""

    def __init__(self):
        self.compiled: dict[str, bytes] = {}

    def load_bytecode(self, bucket) -> None:
        if bucket.key in self.compiled:
            bucket.bytecode_from_string(self.compiled[bucket.key])

    def dump_bytecode(self, bucket) -> None:
        self.compiled[bucket.key] = bucket.bytecode_to_string()


_COMPILED = _CompiledTemplates()


class FeedbackExporter(HTMLExporter):
    """nbgrader's feedback exporter (``GenerateFeedback.exporter_class``, set by the worker),
    with the templates compiled once per worker: nbgrader makes a new exporter for every
    notebook, which compiled its Jinja templates again, a third of each feedback page's CPU
    (0.36 -> 0.23 CPU-s a page). The page is the same, byte for byte (HTMLExporter's config
    applies to it unchanged)."""

    def _create_environment(self):
        environment = super()._create_environment()
        environment.bytecode_cache = _COMPILED
        return environment


class StderrAsStdout(Preprocessor):
    """After execution: stderr streams become stdout, so that warnings and rank output do not
    zero a test (nbgrader scores any test cell that wrote to stderr as failed)."""

    enabled = Bool(True)  # nbconvert preprocessors are off unless enabled

    def preprocess_cell(self, cell, resources, index):
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream" and output.get("name") == "stderr":
                output["name"] = "stdout"
        return cell, resources

class FeedbackWithoutHiddenTests(Preprocessor):
    """For feedback: drop hidden-test code from test cells and cut their errors' tracebacks
    (which quote the failing line) to the exception's name and message."""

    enabled = Bool(True)

    begin, end = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type != "code" or not utils.is_grade(cell):
            return cell, resources
        lines, inside, had_hidden = [], False, False
        for line in cell.source.splitlines():
            if line.strip() == self.begin:
                inside = had_hidden = True
            elif line.strip() == self.end:
                inside = False
            elif not inside:
                lines.append(line)
        if had_hidden:
            lines.append("# (hidden tests ran here; their results are below)")
        cell.source = "\n".join(lines)
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                output["traceback"] = [f"{output.get('ename')}: {output.get('evalue')}"]
        return cell, resources


class TeachingOutputsFromSubmission(Preprocessor):
    """For feedback: a teaching-only cell the grader skipped (``distlab.grading.execution``) shows
    the outputs it had in the student's own submitted notebook, under a line that says so,
    instead of an empty ``In [ ]``. Only text and PNG images are copied: nothing from the student's
    notebook runs in the browser of whoever opens the feedback."""

    enabled = Bool(True)
    MAX_TEXT = 20_000                 # characters of one output's text
    MAX_IMAGE = 2_000_000             # characters of one base64 PNG
    NOTE = ("[The grader does not run this teaching cell. Below: the output it had in your "
            "submitted notebook, as you ran it.]\n")

    def preprocess(self, nb, resources):
        import nbformat
        from distlab.grading.execution import teaching_ids
        info, folder = resources.get("nbgrader", {}), resources.get("metadata", {}).get("path")
        student, lab = info.get("student"), info.get("assignment")
        name = info.get("notebook") or lab
        if not (folder and student and lab):
            return nb, resources
        root = Path(folder).resolve().parents[2]   # <root>/autograded/<student>/<lab>
        try:
            source = nbformat.read(root / "source" / lab / f"{name}.ipynb", as_version=4)
            submitted = nbformat.read(root / "submitted" / student / lab / f"{name}.ipynb",
                                      as_version=4)
        except (OSError, ValueError, AttributeError):
            return nb, resources
        teaching = teaching_ids(source)
        theirs = {_grade_id(c): c for c in submitted.cells if c.get("cell_type") == "code"}
        for cell in nb.cells:
            gid = _grade_id(cell)
            if cell.cell_type != "code" or gid not in teaching or cell.get("outputs"):
                continue
            mine = theirs.get(gid)
            outputs = [o for o in (self._safe(o) for o in (mine or {}).get("outputs", [])) if o]
            note = self.NOTE if outputs else ("[The grader does not run this teaching cell, and "
                                              "it had no output in your submitted notebook.]\n")
            cell.outputs = [new_output("stream", name="stdout", text=note)] + outputs
            count = (mine or {}).get("execution_count")
            cell.execution_count = count if isinstance(count, int) else None
        return nb, resources

    def _safe(self, output):
        """The output's text and PNG image only, size-capped; None if nothing is left."""
        kind = output.get("output_type")
        if kind == "stream":
            return new_output("stream", name="stdout", text=_text(output.get("text"))[:self.MAX_TEXT])
        if kind == "error":
            line = f"{_text(output.get('ename'))}: {_text(output.get('evalue'))}"[:self.MAX_TEXT]
            return new_output("stream", name="stdout", text=line + "\n")
        if kind in ("display_data", "execute_result"):
            data = output.get("data", {})
            kept = {}
            if isinstance(data.get("text/plain"), (str, list)):
                kept["text/plain"] = _text(data["text/plain"])[:self.MAX_TEXT]
            png = data.get("image/png")
            if isinstance(png, str) and len(png) <= self.MAX_IMAGE and _BASE64.fullmatch(png):
                kept["image/png"] = png
            return new_output("display_data", data=kept) if kept else None
        return None


_BASE64 = re.compile(r"[A-Za-z0-9+/=\s]*")


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else str(value or "")


def _grade_id(cell):
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


class _SchemaCheckedOnce:
    """What nbgrader's metadata validator (``nbgrader.nbgraderformat.common``) sees as its
    ``jsonschema`` module: ``validate`` is jsonschema's own (the best-matching error raised, the
    same error a cell's metadata got before), but nbgrader's schema, the same file every time, is
    checked against its metaschema once per process instead of for every cell of every notebook
    it validates (twice an autograde): 0.04 of an untouched notebook's 0.18 CPU-s of nbgrader
    autograde outside its cells."""

    def __init__(self, module):
        self.module, self.validators = module, {}

    def __getattr__(self, name):
        return getattr(self.module, name)

    def validate(self, instance, schema):
        import json
        key = json.dumps(schema, sort_keys=True)   # nbgrader reads its schema afresh each time
        validator = self.validators.get(key)
        if validator is None:
            cls = self.module.validators.validator_for(schema)
            cls.check_schema(schema)
            validator = self.validators[key] = cls(schema)
        error = self.module.exceptions.best_match(validator.iter_errors(instance))
        if error is not None:
            raise error


def _one_engine_per_database(create_engine):
    """nbgrader's ``create_engine`` for its ``Gradebook``: one SQLAlchemy engine per database
    URL for the process. nbgrader opens a new Gradebook, so a new engine, a dozen times per
    notebook graded (each preprocessor, each step of autograde and feedback), and an engine's
    cache of compiled statements went with it: every query was compiled again. (``close`` still
    disposes of the engine's connections; the next Gradebook opens new ones.)"""
    engines = {}

    def create(url, **kwargs):
        key = (str(url), tuple(sorted(kwargs.items())))
        if key not in engines:
            engines[key] = create_engine(url, **kwargs)
        return engines[key]
    create.wrapped = create_engine
    return create


def faster_nbgrader() -> None:
    """In a grading worker, before it grades: nbgrader without its repeated work (the two
    above), the gradebook and every result the same. Idempotent."""
    import jsonschema
    from nbgrader import api
    from nbgrader.nbgraderformat import common
    if not isinstance(common.jsonschema, _SchemaCheckedOnce):
        common.jsonschema = _SchemaCheckedOnce(jsonschema)
    if not hasattr(api.create_engine, "wrapped"):
        api.create_engine = _one_engine_per_database(api.create_engine)


def warm_up_feedback() -> bool:
    """In the run's worker server, before it forks a worker: a feedback page of a notebook of
    two cells, made as a worker makes one (``FeedbackExporter`` as nbgrader's GenerateFeedback
    configures it). What every worker's first page paid for again comes with the fork instead:
    the templates compiled (``_COMPILED``), nbconvert's CSS selectors compiled (soupsieve),
    BeautifulSoup's entity tables, the ipython3 lexer's rules, nbformat's schema compiled for
    validation: a worker's first notebook cost 0.5 CPU-s more in nbgrader than its others.
    Best effort: a warm-up that fails leaves the workers to pay as before (False)."""
    import nbformat
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output
    test = {"grade": True, "grade_id": "test_warm_up", "locked": True, "points": 1,
            "schema_version": 3, "solution": False, "task": False, "score": 1, "comment": None}
    nb = new_notebook(cells=[
        new_markdown_cell("# Warm-up\n\nA *page* with `code`, $x^2$ and a [link](#top)."),
        new_code_cell("print(len([1, 2]))  # a test", metadata={"nbgrader": test},
                      outputs=[new_output("stream", name="stdout", text="2\n"),
                               new_output("error", ename="ValueError", evalue="x",
                                          traceback=["ValueError: x"])])])
    nb.metadata["language_info"] = {"name": "python", "pygments_lexer": "ipython3"}
    try:
        nbformat.validate(nb)
        feedback_page(nb, "warm-up")
    except Exception:   # noqa: BLE001 - only a cost moved, never a result
        return False
    return True


def feedback_page(nb, name: str) -> str:
    """The feedback page of ``nb`` (its cells' scores in their metadata) as a worker's
    ``generate_feedback`` makes it, but for nbgrader's preprocessors (the gradebook's scores)."""
    from nbgrader.converters import GenerateFeedback
    from nbgrader.coursedir import CourseDirectory
    converter = GenerateFeedback(coursedir=CourseDirectory(), config=load_config())
    exporter = FeedbackExporter(parent=converter, config=converter.config)
    return exporter.from_notebook_node(nb, resources={"nbgrader": {
        "notebook": name, "score": 1, "max_score": 1, "late_penalty": 0}})[0]


def load_config():
    """The course's nbgrader config (grader/nbgrader_config.py) as a traitlets Config."""
    from traitlets.config.loader import PyFileConfigLoader
    config = paths.grader() / "nbgrader_config.py"
    return PyFileConfigLoader(config.name, path=str(config.parent)).load_config()
