"""Rendering the site's sources with Sphinx, myst-nb and sphinx-book-theme (what Jupyter Book 1 is
built on): the notebooks are rendered as executed by ``distlab.course.site`` (myst-nb executes
nothing), and every script a page loads is a local file: require.js, the widget manager and
MathJax come from the vendored npm packages (``site_assets``), the theme's own from its package.
Sphinx puts MathJax only on pages with math.
"""
from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

from distlab.course.site_assets import ASSETS, SiteError
from distlab.course.site_settings import SiteSettings

OWN_STATIC = Path(__file__).with_name("site_static")   # the shared stylesheet and the JS twins


# The hosts whose repositories the theme's header button can draw (sphinx-book-theme stops the
# build on any other: "Provider not recognized"); elsewhere the pages' own boxes link the URL.
THEME_HOSTS = ("github.com", "gitlab.com", "bitbucket.org")


def header_repository(url: str) -> str:
    """``url`` for the header's repository button, "" (no button) for a host the theme lacks."""
    host = url.split("://", 1)[-1].split("/", 1)[0].lower()
    return url if host in THEME_HOSTS or host.endswith(tuple("." + h for h in THEME_HOSTS)) else ""


def sphinx_config(title: str, settings: SiteSettings) -> dict:
    """Sphinx's settings (written to the scratch ``conf.py`` as JSON). The footer's "By ..." is
    the course's author; Sphinx's default, "Author name not set", would print where none is set,
    so an empty author is passed as "" and the theme leaves the line out."""
    repository = header_repository(settings.repository)
    return {
        "project": "distlab",
        "author": settings.author,
        "html_title": title,
        "extensions": ["myst_nb"],
        "exclude_patterns": ["_build", "_student", "_static", "**.ipynb_checkpoints"],
        "nb_execution_mode": "off",            # executed by distlab.course.site, fresh kernels
        "nb_merge_streams": True,
        "myst_enable_extensions": ["dollarmath", "amsmath", "colon_fence"],
        "myst_heading_anchors": 3,
        # the widget scripts from _static (myst-nb's default loads them from two CDNs); no
        # "data-jupyter-widgets-cdn": the controls are built in and nothing is fetched
        "nb_ipywidgets_js": {"widgets_path.js": {}, "requirejs/require.js": {},
                             "html-manager/dist/embed-amd.js": {}},
        "mathjax_path": "mathjax/es5/tex-svg.js",
        "html_theme": "sphinx_book_theme",
        "html_static_path": ["_static"],
        "html_css_files": ["distlab.css"],
        "html_js_files": ["twins.js"],
        "html_favicon": None,
        "html_show_sourcelink": False,
        "html_copy_source": True,             # the executed notebook, for the download button
        "html_last_updated_fmt": None,
        "html_theme_options": {
            "repository_url": repository or "",
            "use_repository_button": bool(repository),
            "use_download_button": True,
            "show_toc_level": 2,
            "home_page_in_toc": True,
            "navigation_with_keys": False,
            "use_sidenotes": False,
            # no Google Fonts, analytics or version switcher requests
            "icon_links": [],
        },
        "html_sidebars": {"**": ["navbar-logo", "search-button-field", "sbt-sidebar-nav"]},
        "suppress_warnings": ["mystnb.unknown_mime_type", "myst.header", "misc.highlighting_failure"],
    }


def render(src: Path, out: Path, title: str, settings: SiteSettings, log=print) -> None:
    """Render the sources in ``src`` into ``out`` (HTML), with ``src/_static`` (the vendored
    scripts) and the course's stylesheet and twins served from ``_static/``."""
    from sphinx.application import Sphinx

    shutil.copytree(OWN_STATIC, src / "_static", dirs_exist_ok=True)
    config = json.dumps(sphinx_config(title, settings))
    (src / "conf.py").write_text(f"import json\nglobals().update(json.loads({config!r}))\n")
    warnings = io.StringIO()
    try:
        app = Sphinx(str(src), str(src), str(out), str(src / "_build" / "doctrees"), "html",
                     status=None, warning=warnings, freshenv=True, keep_going=True)
        app.build()
    except Exception as e:  # noqa: BLE001 (Sphinx's errors are many kinds; all stop the build)
        raise SiteError(f"Sphinx could not render the site: {type(e).__name__}: {e}\n"
                        f"{warnings.getvalue()[-3000:]}") from None
    if app.statuscode:
        raise SiteError(f"Sphinx reported errors rendering the site:\n{warnings.getvalue()[-3000:]}")
    for line in warnings.getvalue().splitlines():
        log(f"sphinx: {line}")
    shutil.rmtree(out / ".doctrees", ignore_errors=True)
    (out / ".buildinfo").unlink(missing_ok=True)
    for source_map in (out / "_static").rglob("*.map"):   # debugging aids no page loads (2 MB)
        source_map.unlink()
    pages = "".join(page.read_text() for page in out.glob("*.html"))
    for asset in ASSETS:   # a vendored package no page loads (no widget snapshot, no formula)
        if f"_static/{asset.folder}/" not in pages:
            shutil.rmtree(out / "_static" / asset.folder, ignore_errors=True)
