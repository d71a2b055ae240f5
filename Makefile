# The two Quickstart commands, and the pieces they are made of.
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test bootstrap lint typecheck pytest lock

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

pytest:
	$(BIN)/pytest

# Regenerate the hash-pinned lock after changing dependencies in pyproject.toml.
lock:
	$(BIN)/uv pip compile pyproject.toml --extra test --generate-hashes --python-version 3.11 \
	  --python-platform x86_64-unknown-linux-gnu -o requirements.lock
