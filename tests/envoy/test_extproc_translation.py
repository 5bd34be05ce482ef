"""Small translations at the Envoy boundary: fallback order, endpoint addresses, command-line settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from cognitora.config import ConfigError, config_from_dict
from cognitora.decision import Decision
from cognitora.preflight import EngineAddress, resolve_engines
from envoy_extproc.addresses import AddressBook, address_book, fallback_order
from envoy_extproc.settings import parse_settings


def test_fallbacks_are_the_cores_in_its_order() -> None:
    d = Decision(
        "r", "m", endpoint="10.0.0.1:8000", url=None, prompt_tokens=10, fallbacks=("10.0.0.4:8000", "10.0.0.2:8000")
    )
    assert fallback_order(d, 2) == ["10.0.0.1:8000", "10.0.0.4:8000", "10.0.0.2:8000"]
    assert fallback_order(d, 1) == ["10.0.0.1:8000", "10.0.0.4:8000"]
    assert fallback_order(d, 0) == ["10.0.0.1:8000"]


def engines(*endpoints: dict[str, str]) -> dict[str, EngineAddress]:
    return resolve_engines(config_from_dict({"models": [{"name": "m", "endpoints": list(endpoints)}]}))


def test_addresses_are_literal_ip_port_both_ways() -> None:
    book = address_book(engines({"id": "gpu-a", "url": "http://localhost:8001"}, {"url": "http://127.0.0.1:8002"}))
    assert book.address("gpu-a") == "127.0.0.1:8001"
    assert book.endpoint("127.0.0.1:8001") == "gpu-a"
    assert book.address("unknown:1") == "unknown:1"
    assert address_book(engines({"id": "v6", "url": "http://[::1]:9000"})).address("v6") == "[::1]:9000"
    assert AddressBook({}).endpoint("10.1.1.1:80") == "10.1.1.1:80"


def test_an_unresolvable_engine_host_is_an_error_naming_the_endpoint_and_the_host() -> None:
    with pytest.raises(ConfigError) as err:
        address_book(engines({"url": "http://127.0.0.1:8001"}, {"url": "http://engine-b.invalid:8002"}))
    message = str(err.value)
    assert message.startswith("models[0].endpoints[1].url (http://engine-b.invalid:8002): the host 'engine-b.invalid' ")
    assert "of endpoint engine-b.invalid:8002 does not resolve" in message
    assert "write the engine's IP address in the url" in message


def test_settings_defaults_and_turning_an_identity_header_off() -> None:
    s = parse_settings(["--config", "c.yaml"])
    assert s.config_path == Path("c.yaml") and s.listen == "127.0.0.1:9002" and s.usage == "all"
    ids = {"x-cognitora-team", "x-cognitora-key-id", "x-cognitora-priority", "x-cognitora-user"}
    assert s.trusted.names == {*ids, "x-cognitora-intent"}
    s = parse_settings(["--config", "c.yaml", "--trusted-priority-header", "", "--trusted-team-header", "X-Org"])
    assert s.trusted.names == {"x-org", "x-cognitora-key-id", "x-cognitora-user", "x-cognitora-intent"}


def test_bad_flags_exit_with_a_message() -> None:
    with pytest.raises(SystemExit):
        parse_settings(["--config", "c.yaml", "--usage", "some"])
    with pytest.raises(SystemExit):
        parse_settings(["--config", "c.yaml", "--fallbacks", "-1"])


def test_placed_paths_default_to_every_surface_and_hold_under_a_route_prefix() -> None:
    s = parse_settings(["--config", "c.yaml"])
    for path in (
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/messages",
        "/v1/responses",
        "/v1/embeddings",
        "/api/v1/chat/completions",
        "/llm/team-a/v1/completions",
        "/api/v1/messages",
    ):
        assert s.placed(path), path
    for path in (
        "/v1/models",
        "/v1/messages/count_tokens",  # nothing generated: an engine answers it unplaced
        "/v1/responses/resp_1",
        "/xv1/chat/completions",
        "/v1/chat/completions/x",
        "/",
    ):
        assert not s.placed(path), path


def test_placed_paths_can_be_listed_and_bad_ones_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    s = parse_settings(["--config", "c.yaml", "--placed-path", "/openai/deployments/gpt/chat/completions"])
    assert s.placed("/openai/deployments/gpt/chat/completions") and s.placed(
        "/x/openai/deployments/gpt/chat/completions"
    )
    assert not s.placed("/v1/chat/completions")  # the list replaces the defaults
    with pytest.raises(SystemExit) as bad:
        parse_settings(["--config", "c.yaml", "--placed-path", "/v1/models"])
    assert "--placed-path '/v1/models' must end with one of /chat/completions" in str(bad.value)
    assert parse_settings(["--config", "c.yaml", "--placed-path", "/llm/messages"]).placed("/llm/messages")
    with pytest.raises(SystemExit) as relative:
        parse_settings(["--config", "c.yaml", "--placed-path", "v1/completions"])
    assert "must be a URL path starting with '/'" in str(relative.value)


def test_collector_and_without_collector_contradict() -> None:
    with pytest.raises(SystemExit) as both:
        parse_settings(["--config", "c.yaml", "--collector", "--without-collector"])
    assert "contradict" in str(both.value)
