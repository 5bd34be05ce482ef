"""Small translations at the Envoy boundary: fallback order, endpoint addresses, command-line settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from cognitora.decision import Decision
from envoy_extproc.processor import AddressBook, fallback_order
from envoy_extproc.server import address_book
from envoy_extproc.settings import parse_settings


def test_fallbacks_are_the_cores_in_its_order() -> None:
    d = Decision(
        "r", "m", endpoint="10.0.0.1:8000", url=None, prompt_tokens=10, fallbacks=("10.0.0.4:8000", "10.0.0.2:8000")
    )
    assert fallback_order(d, 2) == ["10.0.0.1:8000", "10.0.0.4:8000", "10.0.0.2:8000"]
    assert fallback_order(d, 1) == ["10.0.0.1:8000", "10.0.0.4:8000"]
    assert fallback_order(d, 0) == ["10.0.0.1:8000"]


def test_addresses_are_literal_ip_port_both_ways() -> None:
    book = address_book({"gpu-a": "http://localhost:8001", "127.0.0.1:8002": "http://127.0.0.1:8002"})
    assert book.address("gpu-a") == "127.0.0.1:8001"
    assert book.endpoint("127.0.0.1:8001") == "gpu-a"
    assert book.address("unknown:1") == "unknown:1"
    assert address_book({"v6": "http://[::1]:9000"}).address("v6") == "[::1]:9000"
    assert AddressBook({}).endpoint("10.1.1.1:80") == "10.1.1.1:80"


def test_settings_defaults_and_turning_an_identity_header_off() -> None:
    s = parse_settings(["--config", "c.yaml"])
    assert s.config_path == Path("c.yaml") and s.listen == "127.0.0.1:9002" and s.usage == "all"
    assert s.trusted.names == {"x-cognitora-team", "x-cognitora-key-id", "x-cognitora-priority", "x-cognitora-user"}
    s = parse_settings(["--config", "c.yaml", "--trusted-priority-header", "", "--trusted-team-header", "X-Org"])
    assert s.trusted.names == {"x-org", "x-cognitora-key-id", "x-cognitora-user"}


def test_bad_flags_exit_with_a_message() -> None:
    with pytest.raises(SystemExit):
        parse_settings(["--config", "c.yaml", "--usage", "some"])
    with pytest.raises(SystemExit):
        parse_settings(["--config", "c.yaml", "--fallbacks", "-1"])
