"""The checks both gateways' cloud end-to-end tests make (tests/e2e/test_cloud_envoy_e2e.py,
tests/e2e/test_cloud_litellm_e2e.py), on a stack of bench/cloud_stacks.py: what a user of either gateway must see."""

from __future__ import annotations

import re

from bench.cloud_stacks import (
    INSTANT,
    CloudStack,
    cloud_after,
    mixed_load_step,
    release_bound_s,
    trickle,
    wait_idle,
    wave,
)
from cognitora_sim.harness.process import wait_until


def failing_cloud_costs_nothing_and_is_held_off(stack: CloudStack, fault: str) -> None:
    """The cloud failing so (``cognitora_sim.cloud.Fault``): every client gets the engine's answer; the breaker
    opens at the first failure, no call goes out during the hold-off, ONE request tests the cloud after it (and
    fails again), and every cloud slot is given back."""
    research = stack.auth("research", INSTANT)
    stack.close_breaker()
    opened = stack.counter("cognitora_cloud_breaker_opened_total")
    stack.cloud.fault(fault)
    try:
        first = wave(stack, research, 6, f"{fault}-1")
        assert first.errors == [], first.errors
        assert first.from_cloud(stack.cloud_marks) == 0  # every answer is the engine's
        assert first.cloud_calls >= 1  # it was tried: this test proves something
        assert stack.counter("cognitora_cloud_breaker_opened_total") == opened + 1
        held = wave(stack, research, 6, f"{fault}-2")
        assert held.errors == [] and held.cloud_calls == 0  # the hold-off: no call to the failing cloud
        wait_until(lambda: stack.breaker() == "half_open", 2 * stack.hold_off_s + 5, "the hold-off to end")
        tested = wave(stack, research, 6, f"{fault}-3")
        assert tested.errors == [] and tested.cloud_calls == 1  # one request tests it; it fails again
        assert stack.breaker() == "open"
    finally:
        stack.cloud.fault("none")
    assert stack.counter("cognitora_cloud_inflight") == 0  # every slot given back (a hung cloud kept them)
    failed = r'cognitora_cloud_attempts_total\{result="(failed|rate_limited)",target="sim-cloud"\}'
    assert re.search(failed, stack.metrics())


def slow_cloud_is_still_used(stack: CloudStack) -> None:
    """A cloud answering 1.5 s late is slow, not failing: it keeps answering, nobody sees an error."""
    stack.close_breaker()
    stack.cloud.fault("slow", slow_ms=1500)
    try:
        slow = wave(stack, stack.auth("research", INSTANT), 4, "slow")
    finally:
        stack.cloud.fault("none")
    assert slow.errors == [] and slow.from_cloud(stack.cloud_marks) == 4
    assert all(a.ttft_s is not None and a.ttft_s >= 1.5 for a in slow.answers)
    assert stack.breaker() == "closed"


def burst_lets_go_after_a_load_step(stack: CloudStack) -> None:
    """A load step that bursts; once the engine is idle, every request is local within ``release_bound_s``."""
    stack.close_breaker()
    wait_idle(stack.fleet)
    step = mixed_load_step(stack)
    assert all(a.status == 200 for a in step), [a.error for a in step if a.status != 200]
    assert sum(a.cloud(stack.cloud_marks) for a in step) >= 5, "the load step did not burst: this proves nothing"
    idle_at = wait_idle(stack.fleet)
    bound = release_bound_s(stack.gateway)
    sent = trickle(stack, stack.auth("research"), bound + 4, 3.0)
    assert all(a.status == 200 for _, a in sent), [a.error for _, a in sent if a.status != 200]
    late = cloud_after(sent, idle_at + bound, lambda a: a.cloud(stack.cloud_marks))
    assert late == [], f"still sent to the cloud {bound:.1f} s after the engine went idle: {late}"
    # The class leaves burst through a probe that answered in time or because the idle fleet's own predictions fall
    # under the exit threshold (which comes first depends on timing): what a user sees is the traffic local again
    # (above) and its class out of burst on the metrics page (the `instant` class, whose SLO no engine meets, stays).
    page = stack.metrics()
    active = re.findall(r'^cognitora_burst_active\{[^}]*priority="default"[^}]*\} (\S+)$', page, re.M)
    assert active and all(float(v) == 0 for v in active), f"the default class is still in burst: {active}"
