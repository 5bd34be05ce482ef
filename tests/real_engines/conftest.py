"""Fixtures of the real-engine tests: the provisioned install and ONE pair of real vLLM engines for the session.

Starting a real engine costs ~1 minute of the 2 shared cores, so every real-engine test module shares the pair; a
test that kills or resets an engine leaves it running again. Tests keep out of each other's way with prompts of
their own (a salt per test), never by restarting engines.

The pair exports its request spans (vLLM's ``llm_request``) over OTLP/HTTP to one receiver for the session
(``otlp_receiver``): an engine's command line is fixed at its start, and a second pair only to trace would cost a
minute of start-up. A request without a ``traceparent`` gets a span of a trace of its own; the tracing test looks for
its own trace id only.

If the machine cannot provision the engines, every test here FAILS with the provisioner's reason: CI provisions
first (``python -m cognitora_sim.harness.real_engines.provision``), so a failure here is a real problem, never a skip.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cognitora_sim.harness.real_engines.launch import MODEL, RealEngineFleet, otlp_tracing, start_engines
from cognitora_sim.harness.real_engines.provision import ProvisionError, RealEngineInstall, provision
from tests.real_engines.stack import ALIASES
from tests.support.otlp_receiver import OtlpReceiver

REAL_ENGINES = 2


@pytest.fixture(scope="session")
def real_install() -> RealEngineInstall:
    try:
        return provision(say=print)
    except ProvisionError as exc:
        pytest.fail(f"real vLLM engines could not be provisioned on this machine: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def otlp_receiver() -> Iterator[OtlpReceiver]:
    """Where the session's engines, and a gateway that is asked to, export their spans."""
    with OtlpReceiver() as receiver:
        yield receiver


@pytest.fixture(scope="session")
def real_fleet(
    real_install: RealEngineInstall, otlp_receiver: OtlpReceiver, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RealEngineFleet]:
    work = tmp_path_factory.mktemp("real-vllm")
    args, env = otlp_tracing(otlp_receiver.traces_url)
    names = (MODEL, *ALIASES)
    with start_engines(REAL_ENGINES, work, install=real_install, served_names=names, extra_args=args, env=env) as fleet:
        print("real vLLM engines ready in", [e.started_s for e in fleet.engines], "s")
        yield fleet
