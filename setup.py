"""The one build step pyproject.toml cannot state: a wheel (``pip install .``) carries the course
beside the package, as ``distlab/course_files/{solutions,notebooks,data,grader}``, so an installed
distlab can build, release and grade without a checkout (``distlab/paths.py`` finds it there).

An editable install (``pip install -e .``, ``make setup``) copies nothing: the package finds the
checkout itself. A student handout (``distlab release``) has only ``notebooks`` and ``data``, and
ships those.
"""
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

COURSE_FOLDERS = ("solutions", "notebooks", "data", "grader")
HERE = Path(__file__).resolve().parent


class BuildWithCourse(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        dest = Path(self.build_lib) / "distlab" / "course_files"
        shutil.rmtree(dest, ignore_errors=True)
        for name in COURSE_FOLDERS:
            if (HERE / name).is_dir():
                shutil.copytree(HERE / name, dest / name, ignore=shutil.ignore_patterns(
                    "__pycache__", "*.pyc", ".ipynb_checkpoints"))


setup(cmdclass={"build_py": BuildWithCourse})
