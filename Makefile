# Two commands: `make run` (server + local runner, embedded defaults) and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.requirements-installed
DEV_STAMP := $(VENV)/.requirements-dev-installed
PG_TEST_URL ?= postgres://postgres@127.0.0.1:5432/test
HOST ?= 127.0.0.1
PORT ?= 8000
# `make run WORKSPACE=~/src/project` runs the local runner on another folder;
# `make run LLM=mock` answers with the bundled mock LLM (offline, README walkthrough),
# on port MOCK_PORT (the same at every start; 0: any free port).
WORKSPACE ?= ./workspace
LLM ?= env
MOCK_PORT ?= 8765
# `make test TEST_WORKERS=1` runs the suite in one process (pytest-xdist otherwise).
TEST_WORKERS ?= 2

.PHONY: run test test-postgres demo bench lint bootstrap bootstrap-dev runner-wheel llm-compat

# `make run` installs the runtime set only; tests, linters and benchmarks add the
# development set (requirements-dev.txt includes requirements.txt).
bootstrap: $(STAMP)

bootstrap-dev: $(DEV_STAMP)

$(STAMP): requirements.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.txt
	touch $(STAMP)

$(DEV_STAMP): $(STAMP) requirements-dev.txt
	$(BIN)/python -m pip install --quiet -r requirements-dev.txt
	touch $(DEV_STAMP)

run: bootstrap
	$(BIN)/python manage.py migrate --noinput -v0
	$(BIN)/python manage.py runlocal --host $(HOST) --port $(PORT) --workspace "$(WORKSPACE)" --llm $(LLM) --mock-port $(MOCK_PORT)

test: bootstrap-dev
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile
ifeq ($(CI),true)
	$(MAKE) test-postgres
endif

# The API suite once more on PostgreSQL (CI does this after the main run).
test-postgres: bootstrap-dev
	DATABASE_URL=$(PG_TEST_URL) $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile tests/api -p no:cacheprovider

# `make demo KEEP=1` keeps its temporary folder (workspace, database, logs).
demo: bootstrap
	$(BIN)/python -m scripts.demo $(if $(KEEP),--keep)

bench: bootstrap-dev
	$(BIN)/python -m bench.relay
	$(BIN)/python -m bench.turn
	$(BIN)/python -m bench.turn --scale-out --turns 20
	$(BIN)/python -m bench.throughput --runs 5 --no-tunnel-meter
	$(BIN)/python -m bench.throughput --runs 2
	$(BIN)/python -m bench.throughput --scaling 1,2,3
	$(BIN)/python -m bench.throughput --scaling 1,2,3 --throttles
	$(BIN)/python -m bench.throughput --sessions 200 --rounds-only --modes stream --runs 3
	$(BIN)/python -m bench.throughput --rounds-only --modes poll --runs 3
	$(BIN)/python -m bench.throughput --rounds-only --modes poll --webhooks 5 --runs 3
	$(BIN)/python -m bench.throughput --rounds-only --modes poll --webhooks 5 --webhook-worker --runs 3
	$(BIN)/python -m bench.throttle_check
	$(BIN)/python -m bench.runner_llm
	$(BIN)/python -m bench.stream
	$(BIN)/python -m bench.channel_layers
	$(BIN)/python -m bench.protocol
	$(BIN)/python -m bench.render
	$(BIN)/python -m bench.hostile
	$(BIN)/python -m bench.tunnel_drops --drops 200
	$(BIN)/python -m bench.fuzz --max-examples 150 --max-time 540
	$(BIN)/python -m bench.policies
	$(BIN)/python -m bench.fairness
	$(BIN)/python -m bench.scale
	$(BIN)/python -m bench.mcp
	$(BIN)/python -m bench.webhooks
	$(BIN)/python -m bench.webhooks --quick --worker
	$(BIN)/python -m bench.webhooks --quick --worker --postgres
	$(BIN)/python -m bench.files
	$(BIN)/python -m bench.workspace
	$(BIN)/python -m bench.search
	$(BIN)/python -m bench.retention
	$(BIN)/python -m bench.retention --database postgres
	$(BIN)/python -m bench.schedules
	$(BIN)/python -m bench.usage
	$(BIN)/python -m bench.usage --database postgres

# The runner against llama-cpp-python's real server (outside CI; docs/testing.md). The
# first run compiles llama.cpp into var/llm-compat/venv. ARGS: e.g. --runner-from main.
llm-compat: bootstrap-dev
	$(BIN)/python -m scripts.llm_compat $(ARGS)

lint: bootstrap-dev
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy api omnigent_site omnigent_runner sessions runners workspaces webhooks webhook_outbox audit usage schedules web scripts testing
	$(BIN)/lint-imports

# The runner as a wheel in dist/ (pyproject.toml): `pip install dist/omnigent_runner-*.whl`
# on a machine that has only Python, then `omnigent-runner`.
runner-wheel: bootstrap
	rm -rf dist/omnigent_runner-*.whl build/
	$(BIN)/python -m pip wheel --quiet --no-deps --wheel-dir dist .
	rm -rf build/ omnigent_runner.egg-info/
	@ls dist/omnigent_runner-*.whl
