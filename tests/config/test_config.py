"""cognitora.yaml: the example loads, defaults apply, and every kind of mistake gets one clear sentence."""

from __future__ import annotations

import ast
import inspect
import itertools
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from cognitora.config import (
    CognitoraConfig,
    ConfigError,
    EngineKind,
    ModelConfig,
    Role,
    config_from_dict,
    load_config,
    reference_markdown,
)
from cognitora.config.reference import REFERENCE_SECTIONS

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "cognitora.yaml"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cognitora.yaml"
    path.write_text(text)
    return path


def error_of(tmp_path: Path, text: str) -> str:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert message.startswith(f"{path}: "), message
    assert "pydantic" not in message and "Traceback" not in message and "errors.pydantic.dev" not in message
    return message


def test_example_loads(smollm2_dir: Path) -> None:
    config = load_config(EXAMPLE)
    model = config.model("smollm2")
    assert model is not None
    assert model.tokenizer == (smollm2_dir / "tokenizer.json").resolve()
    # The README's fleet: four vLLM engines, the tokenizer named by the id of the model that ships with Cognitora.
    assert [e.id for e in model.endpoints] == [f"127.0.0.1:{p}" for p in (8001, 8002, 8003, 8004)]
    assert {e.engine for e in model.endpoints} == {EngineKind.VLLM}
    assert config.placement.priorities["batch"].sheddable
    assert config.redis_url == "redis://127.0.0.1:6379/0"


def test_minimal_config_gets_documented_defaults(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "models:\n  - name: m\n    endpoints:\n      - url: http://10.0.0.5:8000/\n"))
    endpoint = config.models[0].endpoints[0]
    assert endpoint.url == "http://10.0.0.5:8000" and endpoint.id == "10.0.0.5:8000"
    assert endpoint.engine is EngineKind.VLLM and endpoint.role is Role.BOTH
    assert config.redis_url is None and config.key_prefix == "cog"
    assert config.models[0].block_size == 16
    assert config.placement.kv_usage_limit == 0.97
    assert set(config.placement.priorities) == {"default", "batch"}


def test_default_port_of_url_without_one() -> None:
    config = config_from_dict({"models": [{"name": "m", "endpoints": [{"url": "https://engine.local"}]}]})
    assert config.models[0].endpoints[0].id == "engine.local:443"


BAD = [
    (
        "unknown key with a suggestion",
        "models:\n  - name: m\n    blocksize: 16\n    endpoints: [{url: 'http://h:1'}]\n",
        "models[0]: unknown key 'blocksize'; did you mean 'block_size'?",
    ),
    (
        "unknown nested key",
        "models:\n  - name: m\n    endpoints: [{url: 'http://h:1', kv_event: 'tcp://h:2'}]\n",
        "models[0].endpoints[0]: unknown key 'kv_event'; did you mean 'kv_events'?",
    ),
    (
        "unknown key with no close match lists the keys",
        "models: [{name: m, endpoints: [{url: 'http://h:1'}]}]\nscrape: {colour: red}\n",
        "scrape: unknown key 'colour'; expected one of: interval_s, timeout_s",
    ),
    (
        "wrong type",
        "models: [{name: m, block_size: sixteen, endpoints: [{url: 'http://h:1'}]}]\n",
        "models[0].block_size: expected an integer, got 'sixteen'",
    ),
    (
        "missing url",
        "models:\n  - name: m\n    endpoints:\n      - url: http://h:1\n      - engine: sglang\n",
        "models[0].endpoints[1].url: missing required key",
    ),
    (
        "bad url",
        "models: [{name: m, endpoints: [{url: '127.0.0.1:8000'}]}]\n",
        "models[0].endpoints[0].url: expected an http(s) URL like http://127.0.0.1:8000, got '127.0.0.1:8000'",
    ),
    (
        "bad enum",
        "models: [{name: m, endpoints: [{url: 'http://h:1', engine: vllm2}]}]\n",
        "models[0].endpoints[0].engine: expected one of 'vllm', 'sglang', 'llamacpp', 'mlx', 'trtllm' or 'openai', "
        "got 'vllm2'",
    ),
    (
        "out of range",
        "models: [{name: m, endpoints: [{url: 'http://h:1'}]}]\nplacement: {kv_usage_limit: 1.5}\n",
        "placement.kv_usage_limit: input should be less than or equal to 1 (got 1.5)",
    ),
    (
        "priority class typo",
        "models: [{name: m, endpoints: [{url: 'http://h:1'}]}]\n"
        "placement: {priorities: {default: {ttft_slo_s: 1}, batch: {ttft_slo: 3}}}\n",
        "placement.priorities.batch: unknown key 'ttft_slo'; did you mean 'ttft_slo_s'?",
    ),
    (
        "no default priority",
        "models: [{name: m, endpoints: [{url: 'http://h:1'}]}]\nplacement: {priorities: {batch: {ttft_slo_s: 3}}}\n",
        "placement: priorities must define 'default' (used when a request names no class)",
    ),
    ("no models", "redis_url: redis://127.0.0.1:6379/0\n", "models: missing required key"),
    (
        "not a redis url",
        "redis_url: http://127.0.0.1:6379\nmodels: [{name: m, endpoints: [{url: 'http://h:1'}]}]\n",
        "redis_url: expected a Redis URL like redis://127.0.0.1:6379/0, got 'http://127.0.0.1:6379'",
    ),
    (
        "duplicate model",
        "models: [{name: m, endpoints: [{url: 'http://h:1'}]}, {name: m, endpoints: [{url: 'http://h:2'}]}]\n",
        "models[1].name: duplicate model name 'm' (also models[0])",
    ),
    (
        "one id, two urls",
        "models: [{name: m, endpoints: [{url: 'http://h:1', id: e1}, {url: 'http://h:2', id: e1}]}]\n",
        "models[0].endpoints[1].id: endpoint 'e1' listed twice for model 'm'",
    ),
    (
        "missing tokenizer file",
        "models: [{name: m, tokenizer: nope/tokenizer.json, endpoints: [{url: 'http://h:1'}]}]\n",
        "models[0].tokenizer: file not found: ",
    ),
    ("duplicate YAML key", "key_prefix: a\nkey_prefix: b\n", "line 2: duplicate key 'key_prefix'"),
    ("not YAML", "models: [unclosed\n", "not valid YAML at line 2"),
    ("top level not a mapping", "- a\n- b\n", "the top level must be a mapping of keys, got list"),
]


@pytest.mark.parametrize(("text", "expected"), [(t, e) for _, t, e in BAD], ids=[n for n, _, _ in BAD])
def test_bad_config_gets_a_clear_message(tmp_path: Path, text: str, expected: str) -> None:
    assert expected in error_of(tmp_path, text)


def test_several_problems_are_all_listed(tmp_path: Path) -> None:
    text = "models: [{name: m, blocksize: 1, endpoints: [{engine: x}]}]\nscrape: {interval_s: 0}\n"
    message = error_of(tmp_path, text)
    assert "4 problems" in message
    for part in ("models[0]: unknown key 'blocksize'", "models[0].endpoints[0].url: missing", "engine", "interval_s"):
        assert part in message


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"missing\.yaml: cannot read the config file"):
        load_config(tmp_path / "missing.yaml")


def test_programmatic_config_reports_its_source() -> None:
    data: dict[str, Any] = {"models": [{"name": "m", "endpoints": [{"url": "nope"}]}]}
    with pytest.raises(ConfigError, match=r"^litellm model_list: models\[0\]\.endpoints\[0\]\.url: expected"):
        config_from_dict(data, source="litellm model_list")
    assert data == {"models": [{"name": "m", "endpoints": [{"url": "nope"}]}]}  # the caller's data is untouched


def test_programmatic_models_build_directly() -> None:
    config = CognitoraConfig(models=[ModelConfig.model_validate({"name": "m", "endpoints": [{"url": "http://h:9"}]})])
    assert config.endpoint("h:9") is not None and config.model_names() == ["m"]


def test_config_is_immutable(tmp_path: Path) -> None:
    config = config_from_dict({"models": [{"name": "m", "endpoints": [{"url": "http://h:1"}]}]})
    with pytest.raises(ValueError, match="frozen"):
        config.key_prefix = "other"


def test_docs_reference_matches_the_models() -> None:
    """docs/config.md carries the generated reference; regenerate it with `python -m cognitora.config`."""
    doc = (ROOT / "docs" / "config.md").read_text()
    match = re.search(r"<!-- reference:start -->\n(.*)<!-- reference:end -->", doc, re.S)
    assert match, "docs/config.md lost its reference markers"
    assert match.group(1).strip() == reference_markdown().strip(), (
        "docs/config.md is out of date: run `.venv/bin/python -m cognitora.config > /tmp/ref.md` and paste it"
    )


def test_python_m_cognitora_config_prints_the_reference() -> None:
    """The command docs/config.md names regenerates its reference section."""
    run = subprocess.run([sys.executable, "-m", "cognitora.config"], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == reference_markdown().strip()


def test_every_field_of_the_reference_has_a_meaning() -> None:
    """A field without a docstring leaves its row of docs/config.md blank (``scrape`` did, its docstring having slid
    under ``engine_pulls``); every row's last cell must say what the key does."""
    rows = [line for line in reference_markdown().splitlines() if line.startswith("| `")]
    assert len(rows) > 100
    blank = [row.split(" | ")[0] for row in rows if not row.removesuffix("|").rsplit(" | ", 1)[1].strip()]
    assert not blank, f"fields without a docstring (blank in docs/config.md): {blank}"
    assert sum(len(model.model_fields) for _, model in REFERENCE_SECTIONS) == len(rows)


def test_no_field_docstring_is_orphaned() -> None:
    """Two string statements in a row in a config model: the second documents nothing (pydantic keeps the first as
    the field's description), so the field it was written for shows another's text or none."""
    orphans: list[str] = []
    for module in {sys.modules[model.__module__] for _, model in REFERENCE_SECTIONS}:
        tree = ast.parse(inspect.getsource(module))
        for cls in (node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)):
            for before, after in itertools.pairwise(cls.body):
                if all(isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant) for s in (before, after)):
                    orphans.append(f"{module.__name__}.{cls.name}, line {after.lineno}")
    assert not orphans, f"docstrings that document no field: {orphans}"


_SECTIONS = {
    name: model
    for name, field in CognitoraConfig.model_fields.items()
    if isinstance(model := field.annotation, type) and issubclass(model, BaseModel)
}
_MENTION = re.compile(rf"``({'|'.join(_SECTIONS)})\.(\w+)``")
_DEFAULT_CLAIM = re.compile(r"\b(\d+(?:\.\d+)?) (?:\(\w+\) )?by default")


def test_docstrings_that_state_a_config_default_state_the_configured_one() -> None:
    """A docstring under cognitora/ that names ``section.key`` and then says "N by default" must give that key's
    default (decision.py said ``placement.recompute_weight`` was 0 by default while the config set 1)."""
    wrong: list[str] = []
    for path in sorted((ROOT / "cognitora").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            text = " ".join(node.value.split())
            for claim in _DEFAULT_CLAIM.finditer(text):
                mentions = list(_MENTION.finditer(text, 0, claim.start()))
                if not mentions:
                    continue
                section, key = mentions[-1].groups()
                field = _SECTIONS[section].model_fields.get(key)
                if field is None:
                    wrong.append(f"{path.relative_to(ROOT)}: names {section}.{key}, which the config has not")
                    continue
                default = field.get_default(call_default_factory=True)
                if float(claim.group(1)) != default:
                    wrong.append(f"{path.relative_to(ROOT)}: {section}.{key} is {default}, says {claim.group(0)!r}")
    assert not wrong, wrong


# -- secrets from the environment, paths from the file's folder ------------------------------------------------

ONE_MODEL = "models: [{name: m, endpoints: [{url: 'http://h:1'}]}]\n"


def test_secrets_come_from_the_environment_as_litellm_users_write_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COG_TEST_REDIS_URL", "redis://:s3cret@10.0.0.9:6380/2")
    monkeypatch.setenv("COG_TEST_ENGINE_URL", "http://10.0.0.7:8000")
    config = load_config(
        write(
            tmp_path,
            "redis_url: os.environ/COG_TEST_REDIS_URL\n"
            "models: [{name: m, endpoints: [{url: os.environ/COG_TEST_ENGINE_URL}]}]\n",
        )
    )
    assert config.redis_url == "redis://:s3cret@10.0.0.9:6380/2"
    assert config.models[0].endpoints[0].id == "10.0.0.7:8000"


def test_an_unset_variable_is_an_error_naming_the_key_and_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("COG_TEST_UNSET", raising=False)
    monkeypatch.delenv("COG_TEST_UNSET_2", raising=False)
    message = error_of(
        tmp_path,
        "redis_url: os.environ/COG_TEST_UNSET\n"
        "models: [{name: m, endpoints: [{url: 'http://h:1', kv_events: os.environ/COG_TEST_UNSET_2}]}]\n",
    )
    assert "2 problems" in message
    assert (
        "redis_url: os.environ/COG_TEST_UNSET names the environment variable COG_TEST_UNSET, which is not set; "
        "set COG_TEST_UNSET" in message
    )
    assert "models[0].endpoints[0].kv_events: os.environ/COG_TEST_UNSET_2 names the environment variable" in message


def test_a_bad_secret_is_reported_without_echoing_its_password(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COG_TEST_REDIS_URL", "http://:hunter2@10.0.0.9:6379")
    message = error_of(tmp_path, "redis_url: os.environ/COG_TEST_REDIS_URL\n" + ONE_MODEL)
    assert "redis_url: expected a Redis URL" in message and "http://:****@10.0.0.9:6379" in message
    assert "hunter2" not in message


def test_a_secret_read_from_the_environment_is_masked_wherever_it_is_printed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cognitora.redaction import redact

    monkeypatch.setenv("COG_TEST_KEY_PREFIX", "tenant-7f3a9c")
    config = load_config(write(tmp_path, "key_prefix: os.environ/COG_TEST_KEY_PREFIX\n" + ONE_MODEL))
    assert config.key_prefix == "tenant-7f3a9c"
    assert redact("traceback: prefix tenant-7f3a9c rejected") == "traceback: prefix **** rejected"


def test_relative_paths_are_relative_to_the_file_not_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "conf" / "tok").mkdir(parents=True)
    (tmp_path / "conf" / "tok" / "tokenizer.json").write_text("{}")
    (tmp_path / "conf" / "tok" / "template.jinja").write_text("{{ messages }}")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    path = tmp_path / "conf" / "cognitora.yaml"
    path.write_text(
        "models: [{name: m, tokenizer: tok/tokenizer.json, chat_template: ./tok/template.jinja,"
        " endpoints: [{url: 'http://h:1'}]}]\n"
    )
    model = load_config(path).models[0]
    assert model.tokenizer == (tmp_path / "conf" / "tok" / "tokenizer.json").resolve()
    assert model.chat_template == (tmp_path / "conf" / "tok" / "template.jinja").resolve()


def test_a_path_may_start_at_the_home_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "tokenizer.json").write_text("{}")
    config = config_from_dict(
        {"models": [{"name": "m", "tokenizer": "~/tokenizer.json", "endpoints": [{"url": "http://h:1"}]}]},
        base_dir=tmp_path / "not-here",
    )
    assert config.models[0].tokenizer == tmp_path / "tokenizer.json"


def test_a_value_under_a_password_or_key_name_is_masked_even_written_in_clear() -> None:
    from cognitora.config import resolve_env
    from cognitora.redaction import redact

    data = {"store": {"password": "pw-in-clear-1", "api_key": "sk-in-clear-2"}, "tokenizer": "tok/tokenizer.json"}
    assert resolve_env(data, "test") == data
    assert redact("pw-in-clear-1 sk-in-clear-2 tok/tokenizer.json") == "**** **** tok/tokenizer.json"
