# Two commands for a fresh machine: `make demo` (embedded defaults: SQLite,
# embedded Redis broker, local runner) and `make test` (PostgreSQL and
# Redis on localhost, as on the CI machines). `make bench` runs every
# benchmark with its documented defaults (benchmarks/README.md) and writes
# their JSON lines to $(BENCH_OUT).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
export PIP_DISABLE_PIP_VERSION_CHECK := 1

TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/controlplane
TEST_BROKER_URL ?= redis://127.0.0.1:6379/15
PYTEST_ARGS ?=
BENCH_OUT ?= var/bench/results.jsonl
BENCH_ARGS ?=

.PHONY: install demo test bench clean

$(VENV)/.installed: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	touch $@

install: $(VENV)/.installed

demo: install
	$(PY) manage.py demo $(if $(ONCE),--once,) $(if $(PORT),--port $(PORT),) $(ARGS)

test: install
	$(VENV)/bin/lint-imports --no-cache
	DATABASE_URL=$(TEST_DATABASE_URL) CELERY_BROKER_URL=$(TEST_BROKER_URL) \
		$(PY) -m pytest $(PYTEST_ARGS)

bench: install
	$(PY) benchmarks/all.py --out $(BENCH_OUT) $(BENCH_ARGS)

clean:
	rm -rf var
