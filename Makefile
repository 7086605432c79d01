# Two commands for a newcomer (README.md): `make lab` opens the labs, `make test` runs every test.
# Both create or reuse the virtual environment .venv inside the repo.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: lab test setup doctor notebooks references bench clean-venv site formgrader release

setup: $(STAMP)

# Reinstall whenever the pins change.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

# Jupyter refuses to run as root (containers often are) unless told it may.
ALLOW_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)

# nbgrader's formgrader is the instructor's (`make formgrader`, started where its config is): left
# out of the labs' JupyterLab, where it finds no config and would only warn about it.
NO_FORMGRADER := --ServerApp.jpserver_extensions nbgrader.server_extensions.formgrader=False

lab: setup
	$(BIN)/jupyter lab notebooks/ $(ALLOW_ROOT) $(NO_FORMGRADER)

# pyproject.toml's addopts spread the tests over two pytest-xdist workers. Not -q: with it,
# pytest-xdist's status lines ("2 workers [N items]") degrade to "bringing up nodes..." twice.
test: setup
	$(BIN)/python -m pytest -rs

doctor: setup
	$(BIN)/distlab doctor

clean-venv:
	rm -rf $(VENV)

# Regenerate the student labs (notebooks/) from solutions/ with nbgrader; `--check` only compares.
# Also fills nbgrader's course folder (build/source/, grading/gradebook.db) for the formgrader.
notebooks: setup
	$(BIN)/python -m distlab.course.notebooks

# nbgrader's formgrader for instructors: JupyterLab started in grader/ (nbgrader reads its config
# from there) with the repository as its root (nbgrader wants the course inside the server's root),
# and the venv's scripts on PATH (the gradebook runs `alembic`).
formgrader: notebooks
	cd grader && PATH="$(abspath $(BIN)):$$PATH" \
		$(abspath $(BIN))/jupyter lab --ServerApp.root_dir=.. $(ALLOW_ROOT)

# The course as a static HTML site for self-learners (build/site/index.html): every lab run in a
# fresh kernel and rendered. `SITE_ARGS=--version student` renders the student labs instead.
site: setup
	$(BIN)/distlab site $(SITE_ARGS)

# Rewrite data/<lab>/ reference outputs (with their manifest) from each lab's make_references().
references: setup
	$(BIN)/python -m distlab.course.references

# The student handout in build/release/: the student labs, their data, the package and the
# environment; no solutions, no hidden tests (distlab/course/release.py says what and why).
release: setup
	$(BIN)/distlab release build/release
