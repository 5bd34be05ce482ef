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
# Against the oldest LiteLLM: where the plugin meets LiteLLM (its seam, install, the proxy's hooks and pages, one proxy
# end to end); the features driven through the proxy (budgets, burst, cloud, intent, ops) run against the newest.
LITELLM_TESTS := $(sort $(wildcard tests/litellm/test_*litellm*.py tests/budgets/test_*litellm*.py \
  tests/bench/test_*litellm*.py) tests/e2e/test_litellm_e2e.py)

.PHONY: test test-cluster-failover lint typecheck pytest pytest-litellm-oldest system-deps python-version demo bench clean

python-version:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else \
	  "$(PYTHON) is Python " + sys.version.split()[0] + ": Cognitora needs >= 3.11 (make PYTHON=python3.11 ...)")'

# A venv with the project and the simulator (both editable; the `sim` extra names cognitora-sim, which pip takes from
# ./sim given beside it) and LiteLLM $(2), in $(1). Until it was renamed, the distribution was called "cognitora", a
# name another project owns on PyPI: whichever of the two a venv holds, it goes first.
define make_venv
	test -x $(1)/bin/python || $(PYTHON) -m venv $(1)
	$(1)/bin/python -m pip install -q --upgrade pip
	$(1)/bin/python -m pip uninstall -q -y cognitora 2>/dev/null || true
	$(1)/bin/python -m pip install -q -e '.[$(3)]' -e ./sim 'litellm[proxy]==$(2)'
	# xds-protos (the envoy extra) ships its own, older copy of opentelemetry-proto's modules into the same folder:
	# whichever installs last wins, and the OTLP exporter cannot import the old one. opentelemetry-proto goes last.
	$(1)/bin/python -m pip install -q --force-reinstall --no-deps \
	  "opentelemetry-proto==$$($(1)/bin/python -c 'import importlib.metadata as m; print(m.version("opentelemetry-proto"))')"
	touch $(1)/.installed
endef

$(STAMP): pyproject.toml sim/pyproject.toml | python-version
	$(call make_venv,$(VENV),$(LITELLM_NEWEST),litellm$(comma)envoy$(comma)intent$(comma)test$(comma)bench$(comma)sim)

$(OLDEST_STAMP): pyproject.toml sim/pyproject.toml | python-version
	$(call make_venv,$(OLDEST_VENV),$(LITELLM_OLDEST),litellm$(comma)envoy$(comma)intent$(comma)test$(comma)sim)

# Redis and Chromium: found, installed (root with apt), or one command printed to run.
system-deps:
	@.ci/system-deps

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# Tests find or start Redis themselves (bench/harness/redis_server.py): REDIS_URL, 127.0.0.1:6379, or a private server.
# The Redis Cluster failover tests (tests/e2e/test_cluster_failover*_e2e.py) run in `make test` again: their flake
# (no promotion within 200 s) was Redis' replica validity factor making a replica refuse to take over once a slow
# election passed 30 s; the harness sets it to 0 (docs/store.md, "Redis Cluster and failover").
# `make test-cluster-failover` runs them alone.
# --durations: CI must stay under 40 minutes; the slowest tests are printed so that a rise is seen where it happens.
# Two workers (pytest-xdist): most end-to-end tests wait on simulated engines rather than compute, so two at once
# take about the time of one. The tests that must not overlap share one worker (tests/conftest.py, SERIAL_FOLDERS);
# those marked `alone` (the real engines, which take both cores, and tests another worker's load has failed) run
# after the rest, with nothing beside them.
# Meanwhile the real engines are provisioned (vLLM's venv, llama.cpp's build: minutes of pip and compiler) at the
# lowest CPU priority, so they take only what the waiting tests leave idle; a real-engine test that finds a build
# under way waits for it (the provisioners' lock), one that finds it failed says why.
REAL_ENGINES_BUILD_LOG := $(VENV)/real-engines-build.log
pytest: system-deps $(STAMP)
	{ nice -n 19 $(PY) -m cognitora_sim.harness.real_engines.provision \
	  && nice -n 19 $(PY) -m cognitora_sim.harness.real_engines.llamacpp; } > $(REAL_ENGINES_BUILD_LOG) 2>&1 & \
	$(PY) -m pytest -q -n 2 --durations=30 -m "not alone" $(PYTEST_ARGS); \
	status=$$?; wait; exit $$status
	$(PY) -m pytest -q --durations=10 -m alone $(PYTEST_ARGS)

test-cluster-failover: system-deps $(STAMP)
	$(PY) -m pytest -q -m cluster_failover tests/e2e/

pytest-litellm-oldest: system-deps $(OLDEST_STAMP)
	@echo "LiteLLM tests against the oldest supported LiteLLM, $(LITELLM_OLDEST):"
	$(OLDEST_VENV)/bin/python -m pytest -q -n 2 $(LITELLM_TESTS)

test: system-deps lint typecheck pytest pytest-litellm-oldest

demo: $(STAMP)
	$(PY) -m bench.demo

bench: $(STAMP)
	$(PY) -m bench.run_all

clean:
	rm -rf $(VENV) $(OLDEST_VENV) .pytest_cache .mypy_cache .ruff_cache
