# Set-up is part of every target: a fresh clone needs only `make demo` or `make test`.
SHELL := /bin/bash
.DEFAULT_GOAL := help

# Interpreters to test on: every one of 3.11, 3.12, 3.13 found on PATH or through pyenv.
# Override with e.g. `make test PYTHONS="python3.11 /opt/py313/bin/python3.13"`.
PYTHONS ?= $(shell for v in 3.11 3.12 3.13; do \
	  if command -v python$$v >/dev/null 2>&1 && python$$v -c pass 2>/dev/null; then command -v python$$v; \
	  elif command -v pyenv >/dev/null 2>&1 && p=$$(pyenv prefix $$v 2>/dev/null) && [ -x "$$p/bin/python$$v" ]; then echo "$$p/bin/python$$v"; \
	  fi; done)
PRIMARY := $(firstword $(PYTHONS))
VENV := .venv
PYTEST_ARGS ?=

.PHONY: help demo test test-fast lint docs docs-build browser bench clean

help:
	@echo "make demo       - create .venv, install, run the offline demo (scripted model)"
	@echo "make test       - lint, type-check and run the suite on: $(PYTHONS)"
	@echo "make test-fast  - lint, type-check and the tests not marked slow, on $(PRIMARY) (< 2 min)"
	@echo "make bench      - run the benchmarks and write benchmarks/RESULTS.md"
	@echo "make docs       - serve the documentation site on http://127.0.0.1:8000 (mkdocs serve)"

# One venv per interpreter: .venv for the first, .venv-3.x for the others.
venv_for = $(if $(filter $(1),$(PRIMARY)),$(VENV),$(VENV)-$(shell $(1) -c 'import sys; print("%d.%d" % sys.version_info[:2])'))

define ensure_venv
	@if [ ! -x "$(2)/bin/python" ]; then echo "== creating $(2) with $(1)"; $(1) -m venv "$(2)"; fi
	@if [ ! -f "$(2)/.installed" ] || [ pyproject.toml -nt "$(2)/.installed" ]; then \
	  echo "== installing into $(2)"; \
	  "$(2)/bin/python" -m pip install -q --upgrade pip && \
	  "$(2)/bin/python" -m pip install -q -e '.[all,dev]' && touch "$(2)/.installed"; fi
endef

$(VENV)/.installed: pyproject.toml
	$(call ensure_venv,$(PRIMARY),$(VENV))

demo: $(VENV)/.installed
	$(VENV)/bin/python -m crashoverride demo

lint: $(VENV)/.installed docs-build
	$(VENV)/bin/ruff check src tests benchmarks examples docs/_hooks
	$(VENV)/bin/ruff format --check src tests benchmarks examples docs/_hooks
	$(VENV)/bin/mypy --strict src/crashoverride

# The site, built as a reader gets it: --strict fails on a broken link or a missing reference
# (mkdocs.yml). tests/e2e/test_docs_site.py builds it too and opens it in Chromium.
docs-build: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/python -m mkdocs build --strict --site-dir site

docs: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/python -m mkdocs serve --dev-addr 127.0.0.1:8000

# tests/cli/test_show.py renders the HTML report in a real headless browser: Chromium from the
# distribution's packages, installed here when it is missing and we may (root, apt-get).
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	{ if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "== installing chromium (apt-get)"; \
	    apt-get install -y -q chromium >/dev/null 2>&1 || \
	    { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1; } || \
	    echo "!! chromium could not be installed: tests/cli/test_show.py will fail"; \
	  else echo "!! no chromium (apt-get install chromium): tests/cli/test_show.py will fail"; fi; }

test: lint browser
	@test -n "$(PYTHONS)" || { echo "no Python 3.11+ found"; exit 1; }
	@set -e; for py in $(PYTHONS); do \
	  v=$$($$py -c 'import sys; print("%d.%d" % sys.version_info[:2])'); \
	  if [ "$$py" = "$(PRIMARY)" ]; then env=$(VENV); else env=$(VENV)-$$v; fi; \
	  if [ ! -x "$$env/bin/python" ]; then echo "== creating $$env with $$py"; $$py -m venv "$$env"; fi; \
	  if [ ! -f "$$env/.installed" ] || [ pyproject.toml -nt "$$env/.installed" ]; then \
	    echo "== installing into $$env"; "$$env/bin/python" -m pip install -q --upgrade pip; \
	    "$$env/bin/python" -m pip install -q -e '.[all,dev]'; touch "$$env/.installed"; fi; \
	  echo "== pytest on Python $$v ($$py)"; \
	  "$$env/bin/python" -m pytest $(PYTEST_ARGS); \
	done

# The working loop: no test that starts a process, server or worker (marker `slow`, see
# tests/conftest.py), one interpreter. `make test` still runs everything everywhere.
test-fast: lint
	$(VENV)/bin/python -m pytest -m "not slow" $(PYTEST_ARGS)

bench: $(VENV)/.installed
	$(VENV)/bin/python -m benchmarks

clean:
	rm -rf $(VENV) $(VENV)-3.* build dist site *.egg-info .pytest_cache .mypy_cache .ruff_cache
