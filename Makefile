# Two commands for a newcomer (README.md): `make lab` opens the labs, `make test` runs every test.
# Both create or reuse the virtual environment .venv inside the repo.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: lab test setup doctor notebooks references bench clean-venv

setup: $(STAMP)

# Reinstall whenever the pins change.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

# Jupyter refuses to run as root (containers often are) unless told it may.
lab: setup
	$(BIN)/jupyter lab notebooks/ $(if $(filter 0,$(shell id -u)),--allow-root)

test: setup
	$(BIN)/python -m pytest -q -rs

doctor: setup
	$(BIN)/distlab doctor

clean-venv:
	rm -rf $(VENV)

# Regenerate the student labs (notebooks/) from solutions/ with nbgrader; `--check` only compares.
notebooks: setup
	$(BIN)/python -m distlab.notebooks

# Rewrite data/<lab>/ reference outputs (with their manifest) from each lab's make_references().
references: setup
	$(BIN)/python -m distlab.references
