# torchlens developer / CI entry points.
#
#   make venv       create .venv and install torchlens (editable) with test+zoo extras
#   make test       full test suite, slow model-zoo tests included (what CI runs)
#   make test-fast  test suite without the slow model-zoo tests
#   make demo       run the demo module (python -m torchlens.examples.demo)
#   make images     draw the README's example graphs and explorer screenshots into images/
#   make bench      overhead benchmark (benchmarks/overhead.py; BENCH_ARGS=--quick)
#   make clean      remove build/test/demo artefacts (keeps .venv)
#   make distclean  clean + remove .venv
#
# Works from a fresh clone: the venv stamp is rebuilt whenever pyproject.toml,
# setup.py or constraints.txt change. torch/torchvision are pinned through
# constraints.txt (the same pins CI uses).

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := test

PYTHON ?= python3
VENV ?= .venv
VENV_PY := $(VENV)/bin/python
STAMP := $(VENV)/.stamp
EXTRAS ?= test,zoo
PYTEST_ARGS ?=
BENCH_ARGS ?=

# Quieter pip output on CI (CI=true): no progress bars, never prompt.
PIP_FLAGS ?= --no-input $(if $(filter true 1 yes,$(CI)),--progress-bar off,)

.PHONY: venv test test-fast demo bench images clean distclean graphviz chromium

venv: $(STAMP)

$(STAMP): pyproject.toml setup.py constraints.txt
	@if ! [ -x "$(VENV_PY)" ] || ! "$(VENV_PY)" -c 'import sys' >/dev/null 2>&1; then \
		echo ">> creating $(VENV) with $(PYTHON)"; \
		rm -rf "$(VENV)"; \
		$(PYTHON) -m venv "$(VENV)"; \
	fi
	@$(MAKE) --no-print-directory graphviz
	@$(MAKE) --no-print-directory chromium
	"$(VENV_PY)" -m pip install $(PIP_FLAGS) -c constraints.txt -e '.[$(EXTRAS)]'
	@touch "$@"

# Install Graphviz's `dot` from Debian's packages when it is missing.
# Not fatal where that is impossible (no apt-get, not root and no sudo):
# only the rendering parts of torchlens need it.
graphviz:
	@if command -v dot >/dev/null 2>&1; then \
		exit 0; \
	fi; \
	if ! command -v apt-get >/dev/null 2>&1; then \
		echo "WARNING: graphviz 'dot' not found and apt-get unavailable; install Graphviz by hand." >&2; \
		exit 0; \
	fi; \
	if [ "$$(id -u)" -eq 0 ]; then SUDO=""; \
	elif command -v sudo >/dev/null 2>&1; then SUDO="sudo"; \
	else \
		echo "WARNING: graphviz 'dot' not found; not root and no sudo, skipping its install." >&2; \
		exit 0; \
	fi; \
	echo ">> installing graphviz (dot) with apt-get"; \
	$$SUDO apt-get update -q && \
	$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q graphviz \
		|| echo "WARNING: apt-get install graphviz failed; rendering tests may fail." >&2

# Install Debian's Chromium when missing: the explorer page's browser tests drive it with
# Playwright (which cannot download its own browser here). Not fatal, like graphviz: those
# tests skip without it.
chromium:
	@if command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ]; then \
		exit 0; \
	fi; \
	if ! command -v apt-get >/dev/null 2>&1; then \
		echo "WARNING: chromium not found and apt-get unavailable; browser tests will be skipped." >&2; \
		exit 0; \
	fi; \
	if [ "$$(id -u)" -eq 0 ]; then SUDO=""; \
	elif command -v sudo >/dev/null 2>&1; then SUDO="sudo"; \
	else \
		echo "WARNING: chromium not found; not root and no sudo, skipping its install." >&2; \
		exit 0; \
	fi; \
	echo ">> installing chromium with apt-get"; \
	$$SUDO apt-get update -q && \
	$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium \
		|| echo "WARNING: apt-get install chromium failed; browser tests will be skipped." >&2

test: venv
	"$(VENV_PY)" -m pytest -q $(PYTEST_ARGS)

test-fast: venv
	"$(VENV_PY)" -m pytest -q -m "not slow" $(PYTEST_ARGS)

demo: venv
	"$(VENV_PY)" -m torchlens.examples.demo

images: venv
	"$(VENV_PY)" -m torchlens.examples.make_images images
	"$(VENV_PY)" -m torchlens.examples.explorer_images images

bench: venv
	"$(VENV_PY)" benchmarks/overhead.py $(BENCH_ARGS)

clean:
	rm -rf build dist .eggs .pytest_cache demo_out benchmarks/results
	find . -path ./$(VENV) -prune -o -name '*.egg-info' -prune -exec rm -rf {} + 
	find . -path ./$(VENV) -prune -o -name '__pycache__' -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf "$(VENV)"
