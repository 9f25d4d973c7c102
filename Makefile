# Set-up is part of every target: a fresh clone needs only `make demo` or `make test`.
SHELL := /bin/bash
.DEFAULT_GOAL := help

# Interpreters to test on: every one of 3.11, 3.12, 3.13 found on PATH or through pyenv (their
# real paths: pyenv's shims cost a second a call on a loaded machine). Override with e.g.
# `make test PYTHONS="python3.11 /opt/py313/bin/python3.13"`. The first is PRIMARY, which is all
# `make demo` needs: it stops looking there, and the others are looked for only when used.
find_pythons = for v in 3.11 3.12 3.13; do \
	  if command -v python$$v >/dev/null 2>&1 && p=$$(python$$v -c 'import sys; print(sys.executable)' 2>/dev/null); then echo "$$p"; \
	  elif command -v pyenv >/dev/null 2>&1 && p=$$(pyenv prefix $$v 2>/dev/null) && [ -x "$$p/bin/python$$v" ]; then echo "$$p/bin/python$$v"; \
	  else continue; fi; $(1) done
ifdef PYTHONS
PRIMARY := $(firstword $(PYTHONS))
else
PRIMARY := $(shell $(call find_pythons,break;))
PYTHONS = $(eval PYTHONS := $(shell $(call find_pythons,)))$(PYTHONS)
endif
VENV := .venv
PYTEST_ARGS ?=

# Installs go through uv (seconds, where pip takes a minute). uv from PATH, else the copy this
# Makefile bootstrapped once with pip into $(UV_HOME) (shared by every checkout).
UV_HOME ?= $(HOME)/.local/share/crashoverride-uv
UV = $(or $(shell command -v uv 2>/dev/null),$(UV_HOME)/bin/uv)
# uv reads no pip configuration: hand it this machine's (indexes, find-links, constraints).
UV_INDEX_ARGS = $(shell $(PRIMARY) tools/pip_index_args.py)

.PHONY: help demo demo-redelivery test test-fast lint docs docs-build browser wrk bench clean uv

help:
	@echo "make demo       - create .venv, install what the demo needs, run the offline demo (scripted model)"
	@echo "make demo-redelivery - the demo's Celery scene: real workers, the Redis at REDIS_URL"
	@echo "make test       - lint, type-check and run the suite on: $(PYTHONS)"
	@echo "make test-fast  - lint, type-check and the tests not marked slow, on $(PRIMARY) (< 2 min)"
	@echo "make bench      - run the benchmarks, write benchmarks/RESULTS.md and scaling.svg"
	@echo "make docs       - serve the documentation site on http://127.0.0.1:8000 (mkdocs serve)"

uv:
	@command -v uv >/dev/null 2>&1 || [ -x "$(UV_HOME)/bin/uv" ] || { \
	  echo "== bootstrapping uv (pip install --target $(UV_HOME) uv)"; \
	  $(PRIMARY) -m pip install -q --target "$(UV_HOME)" uv; }

# Test dependencies whose own pins conflict with the rest of `.[all,dev]`, installed without
# their dependencies (see the `arq` extra in pyproject.toml): arq pins redis<6, kombu needs 6.4+.
NO_DEPS_DEV = 'arq>=0.28'

# One venv per interpreter: .venv for the first, .venv-3.x for the others. `make test` installs
# everything (.[all,dev], editable, bytecode compiled) and stamps it .installed.
define ensure_venv
	@if [ ! -x "$(2)/bin/python" ]; then echo "== creating $(2) with $(1)"; "$(UV)" venv -q -p "$(1)" "$(2)"; fi
	@if [ ! -f "$(2)/.installed" ] || [ pyproject.toml -nt "$(2)/.installed" ]; then \
	  echo "== installing .[all,dev] into $(2)"; \
	  "$(UV)" pip install -q -p "$(2)/bin/python" --compile-bytecode $(UV_INDEX_ARGS) -e '.[all,dev]' \
	  && "$(UV)" pip install -q -p "$(2)/bin/python" --compile-bytecode $(UV_INDEX_ARGS) --no-deps $(NO_DEPS_DEV) \
	  && touch "$(2)/.installed"; fi
endef

$(VENV)/.installed: pyproject.toml | uv
	$(call ensure_venv,$(PRIMARY),$(VENV))

# The demo installs only what it needs: the base dependencies and the `demo` extra (the
# `celery` extra too for the redelivery scene), and runs this checkout's code (a .pth file puts
# src/ on the venv's path, which is what an editable install does, without building anything).
define demo_venv
	@if [ -f "$(VENV)/.installed" ] && [ ! pyproject.toml -nt "$(VENV)/.installed" ]; then exit 0; fi; \
	if [ ! -f "$(VENV)/.installed-$(1)" ] || [ pyproject.toml -nt "$(VENV)/.installed-$(1)" ]; then \
	  if [ ! -x "$(VENV)/bin/python" ]; then echo "== creating $(VENV) with $(PRIMARY)"; "$(UV)" venv -q -p "$(PRIMARY)" "$(VENV)"; fi; \
	  echo "== installing what the demo needs into $(VENV)"; \
	  "$(UV)" pip install -q -p "$(VENV)/bin/python" $(UV_INDEX_ARGS) -r pyproject.toml $(2) && \
	  echo "$(CURDIR)/src" > "$$("$(VENV)/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/crashoverride-checkout.pth" && \
	  touch "$(VENV)/.installed-$(1)"; fi
endef

demo: | uv
	$(call demo_venv,demo,--extra demo)
	$(VENV)/bin/python -m crashoverride demo

demo-redelivery: | uv
	$(call demo_venv,redelivery,--extra demo --extra celery)
	$(VENV)/bin/python -m crashoverride demo --scene redelivery

lint: $(VENV)/.installed docs-build
	$(VENV)/bin/ruff check src tests benchmarks examples docs/_hooks tools
	$(VENV)/bin/ruff format --check src tests benchmarks examples docs/_hooks tools
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

test: lint browser | uv
	@test -n "$(PYTHONS)" || { echo "no Python 3.11+ found"; exit 1; }
	@set -e; for py in $(PYTHONS); do \
	  v=$$($$py -c 'import sys; print("%d.%d" % sys.version_info[:2])'); \
	  if [ "$$py" = "$(PRIMARY)" ]; then env=$(VENV); else env=$(VENV)-$$v; fi; \
	  if [ ! -x "$$env/bin/python" ]; then echo "== creating $$env with $$py"; "$(UV)" venv -q -p "$$py" "$$env"; fi; \
	  if [ ! -f "$$env/.installed" ] || [ pyproject.toml -nt "$$env/.installed" ]; then \
	    echo "== installing .[all,dev] into $$env"; \
	    "$(UV)" pip install -q -p "$$env/bin/python" --compile-bytecode $(UV_INDEX_ARGS) -e '.[all,dev]'; \
	    "$(UV)" pip install -q -p "$$env/bin/python" --compile-bytecode $(UV_INDEX_ARGS) --no-deps $(NO_DEPS_DEV); \
	    touch "$$env/.installed"; fi; \
	  echo "== pytest on Python $$v ($$py)"; \
	  "$$env/bin/python" -m pytest $(PYTEST_ARGS); \
	done

# The working loop: no test that starts a process, server or worker (marker `slow`, see
# tests/conftest.py), one interpreter. `make test` still runs everything everywhere.
test-fast: lint
	$(VENV)/bin/python -m pytest -m "not slow" $(PYTEST_ARGS)

# benchmarks/bench_asgi.py loads its servers with wrk (a Python client saturates first): from the
# distribution's packages, installed here when it is missing and we may (root, apt-get), as
# `browser` does. Without it the ASGI rows fall back to a Python client and say so.
wrk:
	@command -v wrk >/dev/null 2>&1 || \
	{ if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "== installing wrk (apt-get)"; \
	    apt-get install -y -q wrk >/dev/null 2>&1 || \
	    { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q wrk >/dev/null 2>&1; } || \
	    echo "!! wrk could not be installed: the ASGI rows will use a Python load generator"; \
	  else echo "!! no wrk (apt-get install wrk): the ASGI rows will use a Python load generator"; fi; }

bench: $(VENV)/.installed wrk
	@$(VENV)/bin/python -c 'import matplotlib, tenacity, stamina' 2>/dev/null || $(VENV)/bin/python -m pip install -q -e '.[bench]'
	$(VENV)/bin/python -m benchmarks

clean:
	rm -rf $(VENV) $(VENV)-3.* build dist site *.egg-info .pytest_cache .mypy_cache .ruff_cache
