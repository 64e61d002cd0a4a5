# torchlens developer / CI entry points.
#
#   make venv       create .venv and install torchlens (editable) with test+zoo extras
#   make test       full test suite, slow model-zoo tests included (what CI runs)
#   make test-fast  test suite without the slow model-zoo tests
#   make lint       ruff (lint and format check) and mypy over the package (CI runs it before the tests)
#   make demo       run the demo module (python -m examples.demo)
#   make docs       build the documentation site into site/ (mkdocs --strict: warnings and broken links fail)
#   make docs-serve preview the documentation at http://127.0.0.1:8000
#   make images     draw the README's example graphs and explorer screenshots into images/
#   make bench      overhead benchmark (benchmarks/overhead.py; BENCH_ARGS=--quick)
#   make clean      remove build/test/demo artefacts (keeps .venv)
#   make distclean  clean + remove .venv
#
# Works from a fresh clone: the venv stamp is rebuilt whenever pyproject.toml or
# constraints.txt change. torch/torchvision are pinned through constraints.txt (the same pins CI
# uses).

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

.PHONY: venv test test-fast lint format demo bench images docs docs-serve clean distclean graphviz chromium

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@if ! [ -x "$(VENV_PY)" ] || ! "$(VENV_PY)" -c 'import sys' >/dev/null 2>&1; then \
		echo ">> creating $(VENV) with $(PYTHON)"; \
		rm -rf "$(VENV)"; \
		$(PYTHON) -m venv "$(VENV)"; \
	fi
	@$(MAKE) --no-print-directory graphviz
	@$(MAKE) --no-print-directory chromium
	"$(VENV_PY)" -m pip install $(PIP_FLAGS) -c constraints.txt -e '.[$(EXTRAS)]'
	@touch "$@"

# Install a Debian package when its program is missing (graphviz for `dot`; chromium for the
# explorer page's browser tests, which Playwright drives since it cannot download its own
# browser here). Not fatal where that is impossible (no apt-get, not root and no sudo): the
# drawing and browser tests skip without them.
define apt_install
	@if command -v $(1) >/dev/null 2>&1; then \
		exit 0; \
	fi; \
	if ! command -v apt-get >/dev/null 2>&1; then \
		echo "WARNING: $(1) not found and apt-get unavailable; install $(2) by hand." >&2; \
		exit 0; \
	fi; \
	if [ "$$(id -u)" -eq 0 ]; then SUDO=""; \
	elif command -v sudo >/dev/null 2>&1; then SUDO="sudo"; \
	else \
		echo "WARNING: $(1) not found; not root and no sudo, skipping the install of $(2)." >&2; \
		exit 0; \
	fi; \
	echo ">> installing $(2) with apt-get"; \
	$$SUDO apt-get update -q && \
	$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(2) \
		|| echo "WARNING: apt-get install $(2) failed; the tests that need it will fail or skip." >&2
endef

graphviz:
	$(call apt_install,dot,graphviz)

chromium:
	$(call apt_install,chromium,chromium)

test: venv
	"$(VENV_PY)" -m pytest -q $(PYTEST_ARGS)

test-fast: venv
	"$(VENV_PY)" -m pytest -q -m "not slow" $(PYTEST_ARGS)

lint: venv
	"$(VENV_PY)" -m ruff check .
	"$(VENV_PY)" -m ruff format --check .
	"$(VENV_PY)" -m mypy

format: venv
	"$(VENV_PY)" -m ruff check --fix .
	"$(VENV_PY)" -m ruff format .

demo: venv
	"$(VENV_PY)" -m examples.demo

images: venv
	"$(VENV_PY)" -m examples.make_images images
	"$(VENV_PY)" -m examples.explorer_images images
	"$(VENV_PY)" -m examples.graph_page_images images
	"$(VENV_PY)" -m examples.notebook_images images
	"$(VENV_PY)" -m examples.health_images images
	"$(VENV_PY)" -m examples.tworuns_images images

docs: venv
	NO_MKDOCS_2_WARNING=1 "$(VENV_PY)" -m mkdocs build --strict

docs-serve: venv
	NO_MKDOCS_2_WARNING=1 "$(VENV_PY)" -m mkdocs serve

bench: venv
	"$(VENV_PY)" benchmarks/overhead.py $(BENCH_ARGS)

clean:
	rm -rf build dist .eggs .pytest_cache demo_out benchmarks/results site
	find . -path ./$(VENV) -prune -o -name '*.egg-info' -prune -exec rm -rf {} + 
	find . -path ./$(VENV) -prune -o -name '__pycache__' -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf "$(VENV)"
