"""Page weight of a built course site: the site's size on disk, and per page the bytes a browser
loads for it (the HTML plus the local scripts, stylesheets and images it names; what those load
later, e.g. MathJax's fonts and components, is not counted). Prints a table, heaviest first.

    .venv/bin/python bench/site_weight.py [build/site]
"""
from __future__ import annotations

import re
import sys
from pathlib import Path
from urllib.parse import unquote, urljoin

LOADS = re.compile(r'<(?:script|img|link)\b[^>]*?(?:src|href)="([^"#?]+)[^"]*"[^>]*>')


def page_weight(site: Path, page: Path) -> tuple[int, int]:
    """(HTML bytes, HTML + every local file the page loads)."""
    html = page.read_text(errors="replace")
    base = page.relative_to(site).as_posix()
    files = set()
    for tag in LOADS.finditer(html):
        if "<link" in tag.group(0) and "stylesheet" not in tag.group(0) \
                and "preload" not in tag.group(0):
            continue  # a link to follow, not something loaded
        url = tag.group(1)
        if url.startswith(("http:", "https:", "data:", "//")):
            continue
        path = site / unquote(urljoin(base, url))
        if path.is_file():
            files.add(path)
    size = page.stat().st_size
    return size, size + sum(f.stat().st_size for f in files)


def main(site: Path) -> None:
    total = sum(f.stat().st_size for f in site.rglob("*") if f.is_file())
    rows = sorted(((*page_weight(site, p), p.relative_to(site).as_posix())
                   for p in site.rglob("*.html") if "_static" not in p.parts), reverse=True,
                  key=lambda r: r[1])
    print(f"site {site}: {total / 2**20:.1f} MiB in {sum(1 for _ in site.rglob('*'))} files")
    print(f"{'page':<40}{'html KiB':>10}{'loaded KiB':>12}")
    for html, loaded, name in rows:
        print(f"{name:<40}{html / 1024:>10.0f}{loaded / 1024:>12.0f}")
    if rows:
        print(f"largest page: {rows[0][2]}, {rows[0][1] / 2**20:.2f} MiB loaded")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "build/site"))
