# The two commands: `make run` (a demo that works with nothing configured) and `make test`. Both bootstrap .venv on
# first use: `run` with the runtime dependencies only, `test` with the development ones too.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
RUNTIME_STAMP := $(VENV)/.runtime-installed
STAMP := $(VENV)/.installed
TESTING_STAMP := $(VENV)/.testing-installed
CONFIG ?= config/connector.toml

.PHONY: run test ts-client lint typecheck check migrate clean bench reference testing-kit duplicates

# A venv without a pip of its own when the interpreter's pip can install into it (`pip --python`, pip >= 22.3):
# seconds instead of the half minute ensurepip takes.
$(BIN)/python:
	@if $(PYTHON) -m pip --help 2>/dev/null | grep -q -- '--python <python>'; then \
		$(PYTHON) -m venv --without-pip $(VENV); else $(PYTHON) -m venv $(VENV); fi
# pip does not byte-compile (--no-compile: it would compile every file of every package, one at a time); what was
# installed is compiled afterwards on all cores. Python would compile what it imports and cache it, but where
# PYTHONDONTWRITEBYTECODE is set (many containers and CI images) nothing is cached and every process compiles all it
# imports again: seconds of CPU for each CLI command. The project's own code is compiled before each run too (only
# what changed since: a fraction of a second); Python reads bytecode whatever that variable says.
PIP_ARGS := --quiet --disable-pip-version-check --no-compile
pip_install = if [ -x $(BIN)/pip ]; then $(BIN)/python -m pip install $(PIP_ARGS) $(1); \
	else $(PYTHON) -m pip --python $(BIN)/python install $(PIP_ARGS) $(1); fi; $(compile_installed)
compile_installed = $(BIN)/python -m compileall -q -j0 "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null || true
compile_project = $(BIN)/python -m compileall -q -j0 service migrations >/dev/null

$(RUNTIME_STAMP): pyproject.toml | $(BIN)/python
	@$(call pip_install,-e .)
	@touch $(RUNTIME_STAMP)

$(STAMP): pyproject.toml | $(BIN)/python
	@$(call pip_install,-e '.[dev]')
	@touch $(STAMP) $(RUNTIME_STAMP) $(TESTING_STAMP)

# `npm ci` in the directory $(1), stamped node_modules/.installed; without npm, a note saying what $(2) then.
npm_ci = if command -v npm >/dev/null 2>&1; then cd $(1) && npm ci --no-audit --no-fund && touch node_modules/.installed; \
	else echo "npm not found: $(2)"; fi

# The independent OpenID Provider the tests run (tests/oidc_op, npm). Reinstalled when the lock file is newer than
# the stamp (the same stamp tests/oidc_op_support.py checks). Without npm its tests skip and say why.
OIDC_OP := tests/oidc_op
OIDC_OP_STAMP := $(OIDC_OP)/node_modules/.installed

$(OIDC_OP_STAMP): $(OIDC_OP)/package-lock.json
	@$(call npm_ci,$(OIDC_OP),the tests against the oidc-provider OP ($(OIDC_OP)) will be skipped)

# The TypeScript package (clients/typescript): `make test` installs it (when its lock file is newer than the stamp,
# which tests/ts_support.py checks too), then lints, type-checks and tests it with npm before the Python suite
# (which also runs it against a real sidecar).
TS_CLIENT := clients/typescript
TS_CLIENT_STAMP := $(TS_CLIENT)/node_modules/.installed

$(TS_CLIENT_STAMP): $(TS_CLIENT)/package-lock.json
	@$(call npm_ci,$(TS_CLIENT),the TypeScript package ($(TS_CLIENT)) is not tested)

ts-client: $(TS_CLIENT_STAMP)
	@if command -v npm >/dev/null 2>&1; then cd $(TS_CLIENT) && npm run --silent lint && npm test --silent; fi

# The JavaScript receivers the tests run (tests/js_receivers: eventsource, standardwebhooks), the same way.
JS_RECEIVERS_STAMP := tests/js_receivers/node_modules/.installed

$(JS_RECEIVERS_STAMP): tests/js_receivers/package-lock.json
	@if command -v npm >/dev/null 2>&1; then \
		cd tests/js_receivers && npm ci --no-audit --no-fund && touch node_modules/.installed; \
	else \
		echo "npm not found: the tests with JavaScript receivers (tests/js_receivers) will be skipped"; \
	fi

# axe-core for the operator console's accessibility scan (tests/axe, npm), the same way.
AXE_STAMP := tests/axe/node_modules/.installed

$(AXE_STAMP): tests/axe/package-lock.json
	@$(call npm_ci,tests/axe,the console's accessibility scan (tests/test_admin_browser.py) will be skipped)

# Migrate the SQLite default and serve the demo: without provider credentials a mock provider runs on loopback and
# http://127.0.0.1:8700/ has a link that walks through a whole authorization.
run: $(RUNTIME_STAMP)
	@$(compile_project)
	$(BIN)/acp-connector --config $(CONFIG) migrate
	exec $(BIN)/acp-connector --config $(CONFIG) serve --demo

# The testing kit's example (examples/testing/README.md): the `testing` extra (pytest and the plugin) into .venv,
# then the example's tests, which drive examples/github_agent through the plugin's fixtures.
$(TESTING_STAMP): pyproject.toml | $(BIN)/python
	@$(call pip_install,-e '.[testing]')
	@touch $(TESTING_STAMP) $(RUNTIME_STAMP)

testing-kit: $(TESTING_STAMP)
	$(BIN)/python -m pytest -p no:cacheprovider examples/testing

# One worker per core (pytest-xdist); an idle worker takes queued tests from a busy one (worksteal), since a few
# tests (fresh clones, pip installs, two-process runs) take far longer than the rest.
PYTEST_WORKERS ?= auto
test: $(STAMP) $(OIDC_OP_STAMP) $(JS_RECEIVERS_STAMP) $(AXE_STAMP) ts-client
	@$(compile_project)
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

# The benchmarks (bench/): each side by side with its baseline on loopback; the tables go into bench/RESULTS.md.
# BENCH_POSTGRES_URL=postgresql+asyncpg://... adds the PostgreSQL concurrency sweep. BENCH_ARGS=--quick for a smoke run.
bench: $(STAMP)
	@$(compile_project)
	$(BIN)/python -m bench $(BENCH_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check service tests migrations examples bench
	$(BIN)/ruff format --check service tests migrations examples bench
	@graded="$$($(BIN)/radon cc --show-complexity --min D service)"; if [ -n "$$graded" ]; then echo "$$graded"; \
		echo "radon: the functions above are graded D or worse (cyclomatic complexity over 20): split them"; exit 1; fi

typecheck: $(STAMP)
	$(BIN)/mypy

# Runs of six or more alike lines inside service/ (imports, signatures and docstrings aside). What it lists is
# looked at in docs/architecture.md, "Known likenesses": a rule written twice is never left there.
duplicates: $(STAMP)
	$(BIN)/pylint --disable=all --enable=duplicate-code --min-similarity-lines=6 --ignore-imports=yes \
		--ignore-signatures=yes --ignore-docstrings=yes --ignore-comments=yes --score=no service

check: lint typecheck test

# docs/reference.md from the code (settings, environment variables, error codes, audit events, commands), and the
# layer rules of docs/architecture.md from tests/test_layers.py's tables.
reference: $(STAMP)
	$(BIN)/python -m service.reference > docs/reference.md
	$(BIN)/python -m service.providers.docs > docs/providers.md
	$(BIN)/python -m tests.test_layers

clean:
	rm -rf $(VENV) var/*.db var/*.db-* .pytest_cache .mypy_cache .ruff_cache
