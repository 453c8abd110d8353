# Two commands for a fresh machine: `make demo` (embedded defaults: SQLite,
# embedded Redis broker, local runner) and `make test` (PostgreSQL and
# Redis on localhost, as on the CI machines). `make bench` runs every
# benchmark with its documented defaults (benchmarks/README.md) and writes
# their JSON lines to $(BENCH_OUT). `make install` makes $(VENV) with the
# development lock (requirements/dev.txt) and the project itself, editable,
# so $(VENV)/bin/cpctl runs the CLI; `make lock` regenerates the locks from
# requirements/*.in, keeping every pin that still satisfies them.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
export PIP_DISABLE_PIP_VERSION_CHECK := 1

TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/controlplane
TEST_BROKER_URL ?= redis://127.0.0.1:6379/15
PYTEST_ARGS ?=
BENCH_OUT ?= var/bench/results.jsonl
BENCH_ARGS ?=
LOCK_ARGS ?=
# Where pip finds PyTorch's CPU build, which the lock pins (+cpu): PyPI's Linux wheel of torch is the CUDA
# build (gigabytes of nvidia-* wheels). Empty: pip's own configuration (a wheelhouse in its find-links, as on
# the project's machines and CI); elsewhere pass TORCH_WHEELS=https://download.pytorch.org/whl/cpu/torch/.
TORCH_WHEELS ?=
FIND_TORCH := $(if $(TORCH_WHEELS),--find-links $(TORCH_WHEELS),)

.PHONY: install lock demo test bench clean

# torch first, alone (--no-deps, at the lock's pin): pip reads TORCH_WHEELS, when given, for that one package
# only; the lock's own install finds it already there.
$(VENV)/.installed: requirements/runtime.txt requirements/dev.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-deps $(FIND_TORCH) -c requirements/dev.txt torch
	$(PY) -m pip install -q -r requirements/dev.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $@

install: $(VENV)/.installed

# The one command that regenerates the locks: requirements/runtime.txt (what the image installs) and
# requirements/dev.txt (runtime's pins, plus the demo's, the tests' and the tools'). Existing pins stay
# unless an .in file no longer allows them; upgrade one with LOCK_ARGS="--upgrade-package NAME".
lock: install
	CUSTOM_COMPILE_COMMAND="make lock" $(VENV)/bin/pip-compile -q --strip-extras --no-emit-index-url \
		--no-emit-find-links $(LOCK_ARGS) -o requirements/runtime.txt requirements/runtime.in
	CUSTOM_COMPILE_COMMAND="make lock" $(VENV)/bin/pip-compile -q --strip-extras --no-emit-index-url \
		--no-emit-find-links $(FIND_TORCH) $(LOCK_ARGS) -o requirements/dev.txt requirements/dev.in

demo: install
	$(PY) manage.py demo $(if $(ONCE),--once,) $(if $(PORT),--port $(PORT),) $(ARGS)

test: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports --no-cache
	DATABASE_URL=$(TEST_DATABASE_URL) CELERY_BROKER_URL=$(TEST_BROKER_URL) \
		$(PY) -m pytest $(PYTEST_ARGS)

bench: install
	$(PY) benchmarks/all.py --out $(BENCH_OUT) $(BENCH_ARGS)

clean:
	rm -rf var
