"""The grader's pieces that nbgrader runs, named in grader/nbgrader_config.py and set up by the
worker (``distlab.grading.worker``): the notebook's time budget and two preprocessors."""
from __future__ import annotations

import time

from nbconvert.preprocessors import Preprocessor
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


def load_config():
    """The course's nbgrader config (grader/nbgrader_config.py) as a traitlets Config."""
    from traitlets.config.loader import PyFileConfigLoader
    config = paths.grader() / "nbgrader_config.py"
    return PyFileConfigLoader(config.name, path=str(config.parent)).load_config()
