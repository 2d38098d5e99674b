# The two commands: `make run` and `make test`. Both bootstrap .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CONFIG ?= config/connector.toml

.PHONY: run test lint typecheck check migrate clean bench

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

# The independent OpenID Provider the tests run (tests/oidc_op, npm). Reinstalled when the lock file is newer than
# the stamp (the same stamp tests/oidc_op_support.py checks). Without npm its tests skip and say why.
OIDC_OP := tests/oidc_op
OIDC_OP_STAMP := $(OIDC_OP)/node_modules/.installed

$(OIDC_OP_STAMP): $(OIDC_OP)/package-lock.json
	@if command -v npm >/dev/null 2>&1; then \
		cd $(OIDC_OP) && npm ci --no-audit --no-fund && touch node_modules/.installed; \
	else \
		echo "npm not found: the tests against the oidc-provider OP ($(OIDC_OP)) will be skipped"; \
	fi

run: $(STAMP)
	$(BIN)/acp-connector --config $(CONFIG) migrate
	$(BIN)/acp-connector --config $(CONFIG) serve

test: $(STAMP) $(OIDC_OP_STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The benchmarks (bench/): each side by side with its baseline on loopback; the tables go into bench/RESULTS.md.
# BENCH_POSTGRES_URL=postgresql+asyncpg://... adds the PostgreSQL concurrency sweep. BENCH_ARGS=--quick for a smoke run.
bench: $(STAMP)
	$(BIN)/python -m bench $(BENCH_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check service tests migrations examples bench
	$(BIN)/ruff format --check service tests migrations examples bench

typecheck: $(STAMP)
	$(BIN)/mypy

check: lint typecheck test

clean:
	rm -rf $(VENV) var/*.db var/*.db-* .pytest_cache .mypy_cache .ruff_cache
