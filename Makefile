# Two commands: `make run` (server + local runner, embedded defaults) and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.requirements-installed
PG_TEST_URL ?= postgres://postgres@127.0.0.1:5432/test
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: run test test-postgres demo bench lint bootstrap

bootstrap: $(STAMP)

$(STAMP): requirements.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.txt
	touch $(STAMP)

run: bootstrap
	$(BIN)/python manage.py migrate --noinput -v0
	$(BIN)/python manage.py runlocal --host $(HOST) --port $(PORT) --workspace ./workspace

test: bootstrap
	$(BIN)/python -m pytest
ifeq ($(CI),true)
	$(MAKE) test-postgres
endif

# The API suite once more on PostgreSQL (CI does this after the main run).
test-postgres: bootstrap
	DATABASE_URL=$(PG_TEST_URL) $(BIN)/python -m pytest tests/api -p no:cacheprovider

demo: bootstrap
	$(BIN)/python -m scripts.demo

bench: bootstrap
	$(BIN)/python bench/relay.py
	$(BIN)/python bench/turn.py
	$(BIN)/python bench/turn.py --scale-out --turns 20
	$(BIN)/python bench/stream.py
	$(BIN)/python bench/channel_layers.py

lint: bootstrap
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy omnigent_site omnigent_runner sessions runners workspaces scripts testing
	$(BIN)/lint-imports
