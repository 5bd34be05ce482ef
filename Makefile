# Two commands work on a fresh machine with Python >= 3.11: `make test` and `make demo`. Each bootstraps what it
# needs itself (the virtual environments; for `make test`, Redis and Chromium: .ci/system-deps).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
comma := ,
# LiteLLM fetches a model cost map from the internet at import unless told not to; nothing here needs it.
export LITELLM_LOCAL_MODEL_COST_MAP := True

# The LiteLLM range the plugin supports is the `litellm` extra's (pyproject.toml, `>=OLDEST,<=NEWEST`). Both ends are
# tested: .venv holds the newest (every test), $(OLDEST_VENV) the oldest (the LiteLLM tests, $(LITELLM_TESTS)).
litellm_bound = $(shell $(PYTHON) -c 'import re, tomllib; \
  spec = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["litellm"][0]; \
  print(re.search(r"$(1)\s*([0-9][0-9.]*)", spec)[1])')
LITELLM_NEWEST = $(call litellm_bound,<=)
LITELLM_OLDEST = $(call litellm_bound,>=)
OLDEST_VENV := .venv-litellm-oldest
OLDEST_STAMP := $(OLDEST_VENV)/.installed
LITELLM_TESTS := $(sort $(wildcard tests/test_*litellm*.py))

.PHONY: test lint typecheck pytest pytest-litellm-oldest system-deps python-version demo bench clean

python-version:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else \
	  "$(PYTHON) is Python " + sys.version.split()[0] + ": Cognitora needs >= 3.11 (make PYTHON=python3.11 ...)")'

# A venv with the project (editable) and LiteLLM $(2), in $(1). Until it was renamed, the distribution was called
# "cognitora", a name another project owns on PyPI: whichever of the two a venv holds, it goes first.
define make_venv
	test -x $(1)/bin/python || $(PYTHON) -m venv $(1)
	$(1)/bin/python -m pip install -q --upgrade pip
	$(1)/bin/python -m pip uninstall -q -y cognitora 2>/dev/null || true
	$(1)/bin/python -m pip install -q -e '.[$(3)]' 'litellm[proxy]==$(2)'
	touch $(1)/.installed
endef

$(STAMP): pyproject.toml | python-version
	$(call make_venv,$(VENV),$(LITELLM_NEWEST),litellm$(comma)envoy$(comma)intent$(comma)test$(comma)bench)

$(OLDEST_STAMP): pyproject.toml | python-version
	$(call make_venv,$(OLDEST_VENV),$(LITELLM_OLDEST),litellm$(comma)envoy$(comma)intent$(comma)test)

# Redis and Chromium: found, installed (root with apt), or one command printed to run.
system-deps:
	@.ci/system-deps

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# Tests find or start Redis themselves (tests/redis_server.py): REDIS_URL, 127.0.0.1:6379, or a private server.
pytest: system-deps $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)

pytest-litellm-oldest: system-deps $(OLDEST_STAMP)
	@echo "LiteLLM tests against the oldest supported LiteLLM, $(LITELLM_OLDEST):"
	$(OLDEST_VENV)/bin/python -m pytest -q $(LITELLM_TESTS)

test: system-deps lint typecheck pytest pytest-litellm-oldest

demo: $(STAMP)
	$(PY) -m bench.demo

bench: $(STAMP)
	$(PY) -m bench.run_all

clean:
	rm -rf $(VENV) $(OLDEST_VENV) .pytest_cache .mypy_cache .ruff_cache
