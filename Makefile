# The two Quickstart commands, and the pieces they are made of.
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test bootstrap lint typecheck pytest pytest-main pytest-faults lock

demo: bootstrap
	$(BIN)/memoryd demo

test: bootstrap lint typecheck pytest

bootstrap:
	@infra/bootstrap.sh

lint:
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck:
	$(BIN)/mypy

# Two stages, both always run: everything but the fault-injection tests, then those (they
# stop and kill services and processes, and take minutes). Each says how long it took.
# The first runs in TEST_WORKERS processes (pytest-xdist), a test module's tests in one, each
# process with its own broker, database and Chroma: most integration tests wait on services,
# so two processes on two cores take about 60 % of the time of one. Services given through
# MEMORYD_TEST_* are shared by every process, and some tests count or end the server's
# sessions as a whole: one process then. The fault tests run in one process: they time outages.
SHARED_SERVICES := $(MEMORYD_TEST_KAFKA_BOOTSTRAP)$(MEMORYD_TEST_POSTGRES_DSN)$(MEMORYD_TEST_CHROMA_URL)
TEST_WORKERS ?= $(if $(SHARED_SERVICES),1,2)
pytest:
	@rc=0; $(MAKE) --no-print-directory pytest-main || rc=1; \
	  $(MAKE) --no-print-directory pytest-faults || rc=1; exit $$rc

pytest-main:
	@start=$$(date +%s); $(BIN)/pytest -m "not faults" -n $(TEST_WORKERS) --dist loadfile --durations=15; rc=$$?; \
	  echo "stage pytest-main took $$(( $$(date +%s) - start )) s"; exit $$rc

pytest-faults:
	@start=$$(date +%s); $(BIN)/pytest -m faults --durations=10; rc=$$?; \
	  echo "stage pytest-faults took $$(( $$(date +%s) - start )) s"; exit $$rc

# Regenerate the hash-pinned lock after changing dependencies in pyproject.toml.
lock:
	$(BIN)/uv pip compile pyproject.toml --extra test --generate-hashes --python-version 3.11 \
	  --python-platform x86_64-unknown-linux-gnu -o requirements.lock
