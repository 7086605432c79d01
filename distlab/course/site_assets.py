"""The scripts the site's pages load (require.js, the Jupyter widget manager, MathJax), taken
from npm packages: fetched once with ``npm pack`` into ``build/vendor/``, checked against the
sha512 pinned in ``ASSETS``, and copied into the site's ``_static/`` so pages work offline."""
from __future__ import annotations

import base64
import dataclasses
import fnmatch
import hashlib
import json
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from distlab.course import notebooks

REPO = notebooks.REPO
VENDOR = REPO / "build" / "vendor"
STATIC = "_static"


class SiteError(RuntimeError):
    """The site cannot be built; the message says why and what to do."""


@dataclasses.dataclass(frozen=True)
class NpmAsset:
    """An npm package whose files ``keep`` (glob patterns inside the package) the pages load
    from ``_static/<folder>/``."""
    package: str
    version: str
    integrity: str  # npm's "sha512-<base64>" of the tarball
    keep: tuple[str, ...]
    folder: str


ASSETS = (
    NpmAsset("requirejs", "2.3.8",
             "sha512-7/cTSLOdYkNBNJcDMWf+luFvMriVm7eYxp4BcFCsAX0wF421Vyce5SXP17c+Jd5otXKGNehIonFlyQXSowL6Mw==",
             ("require.js",), "requirejs"),
    # embed-amd.js renders the widget state nbclient stored; the fonts are its icons
    NpmAsset("@jupyter-widgets/html-manager", "1.0.15",
             "sha512-5thBIV6ymNgmPVOHvzx+gGy8ZSKmSazhtGw4/c4xJDVzRhG9PTeQsRjF3FUTopvFi//SABeNz1yp47bCrJ3CQA==",
             ("dist/embed-amd.js", "dist/*.woff*", "dist/*.ttf", "dist/*.eot", "dist/*.svg"),
             "html-manager"),
    # tex-svg.js draws formulas without font files; the rest is what it loads on demand
    NpmAsset("mathjax", "3.2.2",
             "sha512-Bt+SSVU8eBG27zChVewOicYs7Xsdt40qm4+UpHyX7k0/O9NliPc+x77k1/FEsPsjKPZGJvtRZM1vO+geW0OhGw==",
             ("es5/tex-svg.js", "es5/input/*", "es5/output/*", "es5/ui/*", "es5/a11y/*",
              "es5/adaptors/*"), "mathjax"),
)


def _sha512(path: Path) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(path.read_bytes()).digest()).decode()


def _npm_pack(asset: NpmAsset, dest: Path) -> Path:
    """Fetch ``asset``'s tarball into ``dest`` with npm (the registry's own client, so the
    user's npm settings, proxy and mirror included, apply)."""
    npm = shutil.which("npm")
    if npm is None:
        raise SiteError(
            f"The site needs {asset.package}@{asset.version} from the npm registry (fetched once "
            f"into {VENDOR.relative_to(REPO)}/) and npm is not installed. Install Node.js with npm "
            "(Debian/Ubuntu: `sudo apt-get install npm`; macOS: `brew install node`) and build again.")
    spec = f"{asset.package}@{asset.version}"
    done = subprocess.run([npm, "pack", spec, "--json", "--pack-destination", str(dest)],
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SiteError(f"`npm pack {spec}` failed (is the npm registry reachable?):\n"
                        f"{done.stderr.strip()[-2000:]}")
    return dest / json.loads(done.stdout)[0]["filename"]


def _unpack(tarball: Path, keep: tuple[str, ...], dest: Path) -> None:
    """Extract the files of ``tarball`` (npm puts them under ``package/``) matching ``keep``."""
    with tarfile.open(tarball) as tar:
        members = [m for m in tar.getmembers() if m.isfile()]
        for m in members:
            m.name = m.name.split("/", 1)[1]
        chosen = [m for m in members if any(fnmatch.fnmatch(m.name, p) for p in keep)]
        tar.extractall(dest, members=chosen, filter="data")


def _vendor_folder(asset: NpmAsset, vendor: Path) -> Path:
    return vendor / f"{asset.package.replace('/', '+')}-{asset.version}"


def can_vendor(vendor: Path = VENDOR) -> bool:
    """Whether the site's scripts are at hand: fetched already, or npm is there to fetch them."""
    return shutil.which("npm") is not None or all(
        (_vendor_folder(a, vendor) / ".complete").exists() for a in ASSETS)


def vendored(asset: NpmAsset, vendor: Path = VENDOR) -> Path:
    """The folder of ``asset``'s kept files, fetched and verified on first use."""
    folder = _vendor_folder(asset, vendor)
    if (folder / ".complete").exists():
        return folder
    with tempfile.TemporaryDirectory(prefix="distlab-npm-") as tmp:
        tarball = _npm_pack(asset, Path(tmp))
        got = _sha512(tarball)
        if got != asset.integrity:
            raise SiteError(f"{tarball.name} from the npm registry has {got}, not the pinned "
                            f"{asset.integrity}: the download is corrupt or the registry changed "
                            "the package. Nothing was kept; try again, and report it if it persists.")
        shutil.rmtree(folder, ignore_errors=True)
        _unpack(tarball, asset.keep, folder)
    (folder / ".complete").touch()  # written last: an interrupted fetch is redone
    return folder


def copy_static(site: Path, vendor: Path = VENDOR) -> None:
    for asset in ASSETS:
        shutil.copytree(vendored(asset, vendor), site / STATIC / asset.folder,
                        ignore=shutil.ignore_patterns(".complete"))

