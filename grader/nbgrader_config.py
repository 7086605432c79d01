"""The course's nbgrader configuration: the repository mapped onto nbgrader's course layout.

    nbgrader source   build/source/<lab>/<lab>.ipynb   generated from solutions/<lab>/<lab>.py
                                                        (the single source) by `distlab build`
    nbgrader release  notebooks/<lab>/<lab>.ipynb      the student labs, committed
    submitted, autograded, feedback, gradebook.db      grading/ (outside git)

`distlab grade` loads this file and grades each student in a course folder of its own (so students
can be graded in parallel); the same file serves an instructor who prefers nbgrader's own commands
or its formgrader: run them from this folder (`cd grader && nbgrader autograde 01_collectives`;
`make formgrader` opens the formgrader in JupyterLab).
"""
from pathlib import Path

from nbconvert.preprocessors import ClearMetadataPreprocessor, CSSHTMLHeaderPreprocessor
from nbgrader.preprocessors import (AssignLatePenalties, CheckCellMetadata, GetGrades,
                                    IgnorePattern, LimitOutput, SaveAutoGrades)

from distlab.grading.execution import GradedExecute
from distlab.grading.nbgrader_plugins import (FeedbackWithoutHiddenTests, StderrAsStdout,
                                              TeachingOutputsFromSubmission)

REPO = Path(__file__).resolve().parents[1]
c = get_config()  # noqa: F821 (defined by traitlets when it loads this file)

c.CourseDirectory.course_id = "distlab"
c.CourseDirectory.root = str(REPO)
c.CourseDirectory.source_directory = "build/source"
c.CourseDirectory.release_directory = "notebooks"
c.CourseDirectory.submitted_directory = "grading/submitted"
c.CourseDirectory.autograded_directory = "grading/autograded"
c.CourseDirectory.feedback_directory = "grading/feedback"
c.CourseDirectory.db_url = f"sqlite:///{REPO / 'grading' / 'gradebook.db'}"
# Release and collect from the formgrader go through an exchange beside the gradebook (nbgrader's
# default, /usr/local/share/nbgrader/exchange, needs root to create).
c.Exchange.root = str(REPO / "grading" / "exchange")

# Execution: distlab.run bounds each hang by its own timeout (DISTLAB_RANK_TIMEOUT, the launcher's
# diagnosis becomes the test's message); these limits catch what is not inside a distlab.run.
c.Execute.timeout = 300
c.Execute.interrupt_on_timeout = True
c.Execute.allow_errors = True
c.LimitOutput.max_lines = 1000
c.LimitOutput.max_traceback = 100

# Rank output and warnings reach stderr; nbgrader would score such a test cell zero.
# GradedExecute is nbgrader's Execute plus the grader's guards: output caps, a dead kernel that
# does not end the notebook's grading, and the judge told which test cell runs (distlab.grading.execution).
c.Autograde.autograde_preprocessors = [
    GradedExecute, StderrAsStdout, IgnorePattern, ClearMetadataPreprocessor, LimitOutput,
    SaveAutoGrades, AssignLatePenalties, CheckCellMetadata,
]
# Feedback shows every test's result and message, never a hidden test's code; the teaching cells
# the grader skips show the outputs of the student's own submitted notebook, marked as such.
c.GenerateFeedback.preprocessors = [GetGrades, FeedbackWithoutHiddenTests,
                                    TeachingOutputsFromSubmission, CSSHTMLHeaderPreprocessor]
