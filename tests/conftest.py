"""Fixtures several test files share."""
from __future__ import annotations

import os
import time

import pytest

# The site the tests check: Lab 1 (rank output, figures, links), Lab 2 (formulas) and Lab 5 (the
# schedule widget) cover every kind of content a page has; `make site` builds all seven, and the
# grading tests run every lab's solution top to bottom.
SITE_LABS = ("01_collectives", "02_data_parallel", "05_pipeline_parallel", "07_3d_parallelism")


@pytest.fixture(scope="session")
def course_site(tmp_path_factory):
    """One site build shared by tests/test_site.py and tests/test_browser.py: (folder, pages,
    seconds it took)."""
    from distlab.course import site, site_assets

    if not site_assets.can_vendor():
        message = ("the site fetches its scripts (require.js, the widget manager, MathJax) once with "
                   "npm, which is not installed: install Node.js with npm (Debian/Ubuntu: "
                   "`sudo apt-get install npm`) to run the site tests")
        if os.environ.get("DISTLAB_REQUIRE_BROWSER") == "1":   # CI: mandatory
            pytest.fail(message)
        pytest.skip(f"site tests skipped: {message}")
    out = tmp_path_factory.mktemp("site") / "site"
    start = time.perf_counter()
    pages = site.build_site(list(SITE_LABS), out=out, log=lambda line: None)
    return out, pages, time.perf_counter() - start
