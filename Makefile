# Two commands work on a fresh machine: `make test` and `make demo`. Each bootstraps .venv itself.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# LiteLLM fetches a model cost map from the internet at import unless told not to; nothing here needs it.
export LITELLM_LOCAL_MODEL_COST_MAP := True

.PHONY: test lint typecheck pytest demo bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[litellm,envoy,intent,test,bench]'
	touch $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# Tests find or start Redis themselves (tests/redis_server.py): REDIS_URL, 127.0.0.1:6379, or a private server.
pytest: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)

test: lint typecheck pytest

demo: $(STAMP)
	$(PY) -m bench.demo

bench: $(STAMP)
	$(PY) -m bench.run_all

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
