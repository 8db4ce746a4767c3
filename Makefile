# Two commands on a fresh machine: `make up` runs DraftDeck, `make test` passes the tests.
PYTHON ?= python3
HOST ?= 127.0.0.1
PORT ?= 8000
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: up test lint typecheck services install bench clean docs docs-check coverage

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[test,train]"
	touch $(STAMP)

install: $(STAMP)

up: $(STAMP)  ## install and start DraftDeck on embedded defaults (SQLite + file broker); `make up PORT=8001`
	@# the guide (docs/ as a site in site/), which the dashboard serves under /guide
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build -q
	$(BIN)/draftdeck up --host $(HOST) --port $(PORT)

services:  ## start PostgreSQL and Redis if they are down; install chromium if missing
	scripts/services.sh

lint: $(STAMP)
	$(BIN)/ruff check draftdeck app workers tests benchmarks migrations
	$(BIN)/ruff format --check draftdeck app workers tests benchmarks migrations

# One run over everything (one cache, the imports analysed once); pyproject.toml's explicit_package_bases
# makes benchmarks/*.py the modules benchmarks.x that the scripts import.
typecheck: $(STAMP)
	$(BIN)/mypy draftdeck app workers benchmarks tests

# The documentation site (docs/) built strictly: a broken link or anchor, a missing page or issue code
# fails. Not quiet: MkDocs 1.6's -q hides the warnings that --strict counts, and the build passed.
MKDOCS_CONFIG ?= mkdocs.yml
SITE_DIR ?= site
docs-check:
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -f $(MKDOCS_CONFIG) -d $(SITE_DIR)

test: $(STAMP) services lint typecheck docs-check  ## everything CI runs
	@# Two processes: Playwright's sync API keeps an event loop running in the main thread for the
	@# whole session, and code under test that calls asyncio.run (regeneration, SSE) cannot run then.
	@# The first in parallel (a test file per worker: its module fixtures built once), at most 4.
	$(BIN)/pytest -q -p no:cacheprovider -m "not browser" -n auto --maxprocesses 4 --dist loadfile
	$(BIN)/pytest -q -p no:cacheprovider -m browser

coverage: $(STAMP) services  ## the tests under coverage, with its report (apart from `make test`: tracing doubles the time of the Python-heavy tests)
	$(BIN)/pytest -q --cov --cov-report= -p no:cacheprovider -m "not browser"
	$(BIN)/pytest -q --cov --cov-append --cov-report=term:skip-covered -p no:cacheprovider -m browser

docs: $(STAMP)  ## serve the documentation site (docs/, mkdocs.yml) on http://127.0.0.1:8001 while you edit it
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve -a 127.0.0.1:8001

# Every CPU benchmark; benchmarks/train_gpu.py and serve_gpu.py are the checks for a machine with a GPU.
BENCHES := $(filter-out benchmarks/_% benchmarks/train_gpu.py benchmarks/serve_gpu.py,$(wildcard benchmarks/*.py))

# Every one runs even when one fails; the target fails naming those that did (a loop's status is its
# last command's, which hid every failure but the last script's).
bench: $(STAMP)
	@failed=""; for b in $(BENCHES); do echo "== $$b"; $(BIN)/python $$b || failed="$$failed $$b"; done; \
	if [ -n "$$failed" ]; then echo "failed:$$failed" >&2; exit 1; fi

clean:
	rm -rf $(VENV) var site .pytest_cache .mypy_cache .ruff_cache .coverage
