# compactd — run `make help` for the targets.
.DEFAULT_GOAL := help
SHELL := /bin/bash

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Two stamps: `make run` needs the service's runtime dependencies only; `make install`
# and `make test` add the dev tools and the Python client (clients/python), and so
# cover the runtime too.
STAMP := $(VENV)/.installed
RUN_STAMP := $(VENV)/.installed-runtime

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(RUN_STAMP): pyproject.toml | $(BIN)/python
	@echo "Installing compactd and its runtime dependencies into $(VENV)..."
	$(BIN)/pip install --quiet -e .
	touch $(RUN_STAMP)

$(STAMP): pyproject.toml clients/python/pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[dev]' -e clients/python
	touch $(STAMP) $(RUN_STAMP)

.PHONY: help
help: ## Show the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

.PHONY: install
install: $(STAMP) ## Create .venv and install the project with its dev tools and the Python client

.PHONY: run
run: $(RUN_STAMP) ## Serve on 127.0.0.1:8080, or PORT= (embedded PostgreSQL in var/ unless DATABASE_URL is set)
	$(BIN)/compactd serve $(if $(PORT),--port $(PORT))

# The tests run on pytest-xdist workers, one more than there are CPUs, that share one
# Postgres; a module at a time goes to the first free worker, the slow tests first and
# each on its own (tests/parallel.py). A worker that dies ends the run, failed: xdist
# 3.8 would replace it and then, with --dist loadfile, wait for ever (pytest-xdist#1363).
# Bytecode is cached here even where the environment says not to
# (PYTHONDONTWRITEBYTECODE): each worker, and each `compactd` process a test starts,
# would compile the app again, some 3 s of CPU apiece.
PYTEST := env -u PYTHONDONTWRITEBYTECODE $(BIN)/pytest -n auto --dist loadfile \
	--no-loadscope-reorder --max-worker-restart=0

.PHONY: test
test: $(STAMP) ## Run the whole test suite against a real PostgreSQL, in parallel
	$(PYTEST) --durations=20

.PHONY: test-fast
test-fast: $(STAMP) ## The suite without the slow tiers (trace replays, fuzzing, kills and outages), with durations
	$(PYTEST) -m "not slow" --durations=15

# The agent tier (tests/agents) runs real agent CLIs installed from npm at pinned
# versions into $COMPACTD_AGENTS_DIR (default ~/.cache/compactd/agents); installed once.
.PHONY: agents
agents: ## Install the pinned agent CLIs the agent tier runs (Claude Code, Codex, OpenCode; needs npm)
	$(PYTHON) -m tests.agents.install

.PHONY: lint
lint: $(STAMP) ## ruff lint and format check, and the import layers (lint-imports)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

.PHONY: fmt
fmt: $(STAMP) ## Format and autofix with ruff
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

.PHONY: typecheck
typecheck: $(STAMP) ## mypy --strict
	$(BIN)/mypy

.PHONY: migrate
migrate: $(STAMP) ## Apply the database migrations (alembic upgrade head)
	$(BIN)/compactd migrate

.PHONY: revision
revision: $(STAMP) ## New migration: make revision m="what changes"
	$(BIN)/alembic revision --autogenerate -m "$(m)"

.PHONY: openapi
openapi: $(STAMP) ## Regenerate openapi/openapi.json from the app
	$(BIN)/compactd openapi -o openapi/openapi.json

.PHONY: bench
bench: $(STAMP) ## Benchmarks on embedded PostgreSQL; prints figures, never fails on time
	$(BIN)/python -m bench

.PHONY: continuity
continuity: $(STAMP) ## What compactions keep of the task, modified files and last error, on the traces (engine only, no database)
	$(BIN)/python -m bench continuity

# The scorecard (docs/eval.md): the traces through the real service (in this process, on
# embedded PostgreSQL unless DATABASE_URL is set), per strategy and beside a naive
# baseline. EVAL_ARGS passes options: make eval EVAL_ARGS="--limit 3 --json eval.json".
EVAL_ARGS ?=

.PHONY: eval
eval: $(STAMP) ## Scorecard: continuity and recall after compaction, per strategy, vs a naive baseline (EVAL_ARGS=)
	$(BIN)/python -m bench eval $(EVAL_ARGS)

.PHONY: up
up: ## docker compose up (Postgres, migrate, API)
	docker compose up --build -d

.PHONY: down
down: ## docker compose down
	docker compose down
