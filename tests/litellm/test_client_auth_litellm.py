"""``litellm_plugin.auth``: the key list of Cognitora's LiteLLM ``custom_auth`` hook, checked with a clear error, and
keys matched to their team. The hook in the real proxy, with the OpenAI SDK: tests/examples/test_examples_start.py and
tests/examples/test_examples_burst.py."""

from __future__ import annotations

from typing import Any

import pytest

from cognitora.config import ConfigError
from litellm_plugin.auth import identify, key_hash, parse_keys

KEY = "sk-research-0123456789abcdef"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("sk-x", "must be a list"),
        ([{"key": None, "team": "t", "key_alias": "a"}], r"\[0\]\.key is null.*export the variable"),
        ([{"key": "short", "team": "t", "key_alias": "a"}], r"\[0\]\.key: .*at least 16 characters \(an API key: sk-"),
        ([{"key": KEY, "team": "t"}], r"\[0\]\.key_alias"),
        ([{"key": KEY, "team": "t", "key_alias": "a", "teams": "x"}], r"\[0\]\.teams"),
        ([{"key": KEY, "team": "a", "key_alias": "a"}, {"key": KEY, "team": "b", "key_alias": "b"}], "listed twice"),
    ],
)
def test_a_bad_key_list_says_what_is_wrong(raw: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_keys(raw)


def test_a_key_maps_to_its_team_and_nothing_else_does() -> None:
    raw = [
        {"key": KEY, "team": "research", "key_alias": "alice", "priority": "batch"},
        {"key": "sk-ops-0123456789abcdef0", "team": "ops", "key_alias": "ops"},
    ]
    entry = identify(KEY, raw)
    assert entry is not None and (entry.team, entry.key_alias, entry.priority) == ("research", "alice", "batch")
    assert identify(KEY + "x", raw) is None and identify("", raw) is None
    assert key_hash(KEY) != KEY and len(key_hash(KEY)) == 64
