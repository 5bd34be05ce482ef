"""Identity through examples/envoy.yaml's auth: API keys minted by ``cognitora keys`` (signed JWTs), verified by
Envoy's ``jwt_authn``, reach the service as the key's team, key id and priority; whatever a client claims in the
identity headers itself, with or without a key, never does. A forged or foreign key is a JSON 401 that reaches no
engine and no placement. The real Envoy, the real service, a recording core (tests/envoy/test_envoy_protocol.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cognitora import api_keys
from tests.envoy.test_envoy_protocol import Stack, chat_body, post, recording_stack

JWKS = api_keys.new_jwks()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with recording_stack(tmp_path_factory.mktemp("envoy"), ("a",), jwks=JWKS) as s:
        yield s


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def test_identity_comes_from_the_key_never_from_client_headers(stack: Stack) -> None:
    stack.core.reset(stack.engines["a"])
    spoof = {"x-cognitora-team": "someone-else", "x-cognitora-priority": "critical", "x-cognitora-key-id": "k0"}
    key = api_keys.mint(JWKS, team="search", key_id="key-17", priority="batch", user="ada", expires_in_s=600)
    assert post(stack, chat_body(), headers={**spoof, **bearer(key)}).status_code == 200
    plain = api_keys.mint(JWKS, team="search", key_id="key-18")
    assert post(stack, chat_body(), headers={**spoof, **bearer(plain)}).status_code == 200
    first, second = stack.core.placed
    assert (first.team, first.api_key_id, first.priority, first.user) == ("search", "key-17", "batch", "ada")
    assert (second.team, second.api_key_id, second.priority) == ("search", "key-18", "default")


@pytest.mark.parametrize(
    "headers",
    [
        {},  # no key
        {"x-cognitora-team": "search"},  # no key, an identity claimed
        bearer("sk-not-a-jwt"),
        bearer(api_keys.mint(api_keys.new_jwks(), team="search", key_id="k")),  # signed with another key
        bearer(api_keys.mint(JWKS, team="search", key_id="k", expires_in_s=-60)),  # expired
    ],
    ids=["missing", "claimed-in-a-header", "not-a-jwt", "foreign-signature", "expired"],
)
def test_a_request_without_a_valid_key_is_a_json_401_and_never_placed(stack: Stack, headers: dict[str, str]) -> None:
    stack.core.reset(stack.engines["a"])
    r = post(stack, chat_body(), headers=headers)
    assert r.status_code == 401, r.text
    error = r.json()["error"]
    assert error["code"] == "invalid_api_key" and "cognitora keys mint" in error["message"]
    assert stack.core.placed == []


def test_minted_key_claims_are_checked() -> None:
    with pytest.raises(api_keys.ApiKeyError, match="header value"):
        api_keys.mint(JWKS, team="a team\r\nx-evil: 1", key_id="k")
    with pytest.raises(api_keys.ApiKeyError, match="not a JWKS"):
        api_keys.mint("{}", team="t", key_id="k")


def test_mint_without_the_signing_key_says_how_to_make_one(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(api_keys.JWKS_ENV, raising=False)
    assert api_keys.main(["mint", "--team", "t", "--key-id", "k"]) == 2
    assert 'export COGNITORA_JWKS="$(cognitora keys jwks)"' in capsys.readouterr().err
