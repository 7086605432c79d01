"""Imports that grading processes skip, and what they imported kept out of the collector's way.

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


def freeze_imported(collect_after: bool = True) -> None:
    """Move every object this process holds now (its modules: torch's alone are some 150,000) out
    of the garbage collector's reach: a full collection scanned them all again, here and in every
    process forked from here (a kernel, a zygote and its ranks), 0.1-0.2 CPU-s each time; and its
    writes to their headers copied the pages a fork shares. They live as long as the process
    either way; what is made after the call is collected as before (``collect_after``: the
    collector runs again, if a start that only imports had turned it off: imports make next to
    no garbage, and the collections during a worker's imports cost 0.4 CPU-s)."""
    import gc
    gc.freeze()
    if collect_after:
        gc.enable()
