"""Imports that grading processes skip.

``import nbformat`` imports jsonschema, and jsonschema imports ``rfc3987_syntax`` when it is
installed (jupyter-events pulls it in), which compiles some forty parsers at import time: 2.5 s
on an idle core, 7 s on a busy one, in the grading command and again in every worker. It serves
only jsonschema's checks of the "iri" formats, which nbformat, nbconvert and nbgrader never ask
for (they validate notebooks without format checks).
"""
from __future__ import annotations

import sys

SKIPPED = ("rfc3987_syntax",)


def skip_slow_imports() -> None:
    """Make the modules in SKIPPED look absent (``import`` raises ImportError, which jsonschema
    catches and does without them). Call it before anything imports nbformat; a no-op after."""
    if "jsonschema" in sys.modules:
        return
    for name in SKIPPED:
        sys.modules.setdefault(name, None)
