"""What a process checks at start (``cognitora.preflight``), as a user meets it: a bad tokenizer or chat template
file, an engine host that does not resolve, one engine listed twice, a Redis that refuses the password. Each is one
message naming the key, at start: from the core, from ``cognitora extproc`` and ``cognitora collector`` (their exit
status and stderr, no traceback), and from ``litellm.Router`` when it installs the strategy."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm
import pytest

import litellm_plugin
from cognitora.config import CognitoraConfig, ConfigError, config_from_dict
from cognitora.core.router import Router
from cognitora.preflight import check_store, resolve_engines, unresolved_problems
from cognitora_sim.harness.envoy_launch import wait_listening
from cognitora_sim.harness.process import ManagedProcess, free_port, wait_until
from kvstate.memory_store import MemoryStore
from kvstate.redis_store import RedisStore
from tests.conftest import REDIS_PASSWORD, ROOT

litellm_plugin.install()  # what the proxy's callback line does; an SDK script calls it too

BROKEN_TEMPLATE = "{% for message in messages %}{{ message.content }"  # an unclosed tag


def config(models: list[dict[str, Any]] | None = None, **top: Any) -> CognitoraConfig:
    return config_from_dict({"models": models or [{"name": "m", "endpoints": [{"url": "http://127.0.0.1:9"}]}], **top})


def model(**keys: Any) -> list[dict[str, Any]]:
    return [{"name": "chat", "endpoints": [{"url": "http://127.0.0.1:9"}], **keys}]


def copy_tokenizer(smollm2_dir: Path, into: Path, *, template: str | None = None) -> Path:
    """SmolLM2's tokenizer.json alone in a folder (with ``template`` as its chat_template.jinja)."""
    into.mkdir()
    shutil.copy(smollm2_dir / "tokenizer.json", into / "tokenizer.json")
    if template is not None:
        (into / "chat_template.jinja").write_text(template)
    return into / "tokenizer.json"


# -- a bad tokenizer or chat template: a ConfigError naming the key, when the Router is built --------------------


def test_a_file_that_is_not_a_tokenizer_names_the_key_and_the_file(tmp_path: Path) -> None:
    not_json = tmp_path / "tokenizer.json"
    not_json.write_text("this is not JSON\n")
    with pytest.raises(ConfigError) as err:
        Router(config(model(tokenizer=str(not_json))), MemoryStore())
    assert str(err.value).startswith(f"models[0].tokenizer (model 'chat'): {not_json} is not a tokenizer.json")

    other_json = tmp_path / "config.json"
    other_json.write_text('{"architectures": ["LlamaForCausalLM"]}')
    with pytest.raises(ConfigError, match=r"models\[0\]\.tokenizer \(model 'chat'\): .*config\.json is not a tok"):
        Router(config(model(tokenizer=str(other_json))), MemoryStore())


def test_a_chat_template_that_does_not_compile_or_read_names_its_key(tmp_path: Path, smollm2_dir: Path) -> None:
    template = tmp_path / "broken.jinja"
    template.write_text(BROKEN_TEMPLATE)
    tokenizer = str(smollm2_dir / "tokenizer.json")
    with pytest.raises(ConfigError) as err:
        Router(config(model(tokenizer=tokenizer, chat_template=str(template))), MemoryStore())
    assert str(err.value).startswith(f"models[0].chat_template (model 'chat'): {template}: the chat template does")
    assert "does not compile" in str(err.value)

    binary = tmp_path / "binary.jinja"
    binary.write_bytes(b"\xff\xfe\x00 not text")
    with pytest.raises(ConfigError, match=r"models\[0\]\.chat_template \(model 'chat'\): cannot read .*binary\.jinja"):
        Router(config(model(tokenizer=tokenizer, chat_template=str(binary))), MemoryStore())


def test_a_broken_template_beside_the_tokenizer_names_the_tokenizer_key(tmp_path: Path, smollm2_dir: Path) -> None:
    tokenizer = copy_tokenizer(smollm2_dir, tmp_path / "model", template=BROKEN_TEMPLATE)
    with pytest.raises(ConfigError) as err:
        Router(config(model(tokenizer=str(tokenizer))), MemoryStore())
    assert str(err.value).startswith(f"models[0].tokenizer (model 'chat'): the chat template found beside {tokenizer}")
    assert "set models[0].chat_template to one that does" in str(err.value)

    (tmp_path / "model" / "chat_template.jinja").unlink()
    (tmp_path / "model" / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(
        ConfigError, match=r"models\[0\]\.tokenizer \(model 'chat'\): .*tokenizer_config\.json: not val"
    ):
        Router(config(model(tokenizer=str(tokenizer))), MemoryStore())


def test_good_files_build_a_router_whose_keys_are_token_exact(smollm2_dir: Path) -> None:
    router = Router(config(model(tokenizer=str(smollm2_dir / "tokenizer.json"))), MemoryStore())
    assert router._keyers["chat"].tokenizer is not None


# -- engine addresses -----------------------------------------------------------------------------------------------


def test_one_engine_listed_twice_under_two_spellings_is_refused_naming_both() -> None:
    port = free_port()
    twice = config(
        [
            {"name": "a", "endpoints": [{"url": f"http://localhost:{port}"}]},
            {"name": "b", "endpoints": [{"url": "http://127.0.0.1:9"}, {"url": f"http://127.0.0.1:{port}/"}]},
        ]
    )
    with pytest.raises(ConfigError) as err:
        resolve_engines(twice)
    assert str(err.value).startswith(
        f"models[0].endpoints[0].url (http://localhost:{port}) and models[1].endpoints[1].url "
        f"(http://127.0.0.1:{port}) are one engine (127.0.0.1:{port}), listed twice as endpoints "
        f"localhost:{port} and 127.0.0.1:{port}"
    )
    # one engine under one id in two models is one engine, listed once; another port is another engine
    shared = [{"url": f"http://127.0.0.1:{port}"}]
    ok = config(
        [{"name": "a", "endpoints": shared}, {"name": "b", "endpoints": [*shared, {"url": "http://127.0.0.1:9"}]}]
    )
    assert set(resolve_engines(ok)) == {f"127.0.0.1:{port}", "127.0.0.1:9"}


def test_an_unresolvable_host_is_reported_naming_the_endpoint_and_the_host() -> None:
    engines = resolve_engines(config([{"name": "m", "endpoints": [{"url": "http://gpu-7.invalid:8000", "id": "g7"}]}]))
    assert engines["g7"].addresses == () and engines["g7"].socket_address is None
    (problem,) = unresolved_problems(engines)
    assert problem.startswith("models[0].endpoints[0].url (http://gpu-7.invalid:8000): the host 'gpu-7.invalid' of ")
    assert "endpoint g7 does not resolve" in problem


# -- Redis at start -------------------------------------------------------------------------------------------------


def test_a_redis_that_refuses_the_password_is_a_config_error_that_never_prints_it(redis_with_password_url: str) -> None:
    wrong = redis_with_password_url.replace(REDIS_PASSWORD, "wrong-pw-1234")
    with pytest.raises(ConfigError) as err:
        check_store(config(redis_url=wrong))
    message = str(err.value)
    assert message.startswith("redis_url (redis://:****@127.0.0.1:") and "refused the user or password" in message
    assert "wrong-pw-1234" not in message
    missing = redis_with_password_url.replace(f":{REDIS_PASSWORD}@", "")
    with pytest.raises(ConfigError, match=r"Redis asks for a password and the URL has none"):
        check_store(config(redis_url=missing))
    assert check_store(config(redis_url=redis_with_password_url)) is None


def test_a_redis_that_does_not_answer_at_start_is_a_warning_naming_redis_url() -> None:
    warning = check_store(config(redis_url=f"redis://:hidden-pw-99@127.0.0.1:{free_port()}/0"))
    assert warning is not None and warning.startswith("redis_url (redis://:****@127.0.0.1:")
    assert "did not answer" in warning and "Starting anyway" in warning and "hidden-pw-99" not in warning


# -- the processes: cognitora extproc and cognitora collector ----------------------------------------------------


def run_command(name: str, config_text: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "cognitora.yaml"
    path.write_text(config_text)
    argv = [sys.executable, "-m", "cognitora.cli", name, "--config", str(path)]
    if name == "extproc":
        argv += ["--listen", f"127.0.0.1:{free_port()}", "--without-collector"]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)


def refused(done: subprocess.CompletedProcess[str]) -> str:
    """The one message a command refused to start with (stderr; the collector's is a JSON log line)."""
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    return str(json.loads(last)["msg"]) if last.startswith("{") else done.stderr


@pytest.mark.parametrize("command", ["extproc", "collector"])
def test_the_commands_refuse_one_engine_listed_twice(command: str, tmp_path: Path, redis_server_url: str) -> None:
    port = free_port()
    text = (
        f"redis_url: {redis_server_url}\nkey_prefix: preflight-test\n"
        f"models:\n- name: m\n  endpoints: [{{url: 'http://localhost:{port}'}}, {{url: 'http://127.0.0.1:{port}'}}]\n"
    )
    message = refused(run_command(command, text, tmp_path))
    assert f"models[0].endpoints[0].url (http://localhost:{port}) and models[0].endpoints[1].url" in message
    assert f"are one engine (127.0.0.1:{port})" in message


@pytest.mark.parametrize("command", ["extproc", "collector"])
def test_the_commands_refuse_a_wrong_redis_password_at_start(
    command: str, tmp_path: Path, redis_with_password_url: str
) -> None:
    wrong = redis_with_password_url.replace(REDIS_PASSWORD, "wrong-pw-5678")
    text = f"redis_url: '{wrong}'\nmodels:\n- name: m\n  endpoints: [{{url: 'http://127.0.0.1:9'}}]\n"
    done = run_command(command, text, tmp_path)
    message = refused(done)
    assert "redis_url (redis://:****@127.0.0.1:" in message and "refused the user or password" in message
    assert "wrong-pw-5678" not in done.stderr + done.stdout


def test_extproc_refuses_an_unresolvable_engine_host_naming_it(tmp_path: Path) -> None:
    text = "models:\n- name: m\n  endpoints: [{url: 'http://gpu-7.invalid:8000'}]\n"
    message = refused(run_command("extproc", text, tmp_path))
    assert "models[0].endpoints[0].url (http://gpu-7.invalid:8000): the host 'gpu-7.invalid' of endpoint" in message
    assert "write the engine's IP address in the url" in message


def test_extproc_refuses_a_bad_tokenizer_naming_the_key(tmp_path: Path) -> None:
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{}")
    text = f"models:\n- name: m\n  tokenizer: {bad}\n  endpoints: [{{url: 'http://127.0.0.1:9'}}]\n"
    message = refused(run_command("extproc", text, tmp_path))
    assert f"models[0].tokenizer (model 'm'): {bad} is not a tokenizer.json" in message


def test_what_may_heal_only_warns_and_the_commands_start(
    tmp_path: Path, redis_server_url: str, key_prefix: str
) -> None:
    """A Redis that does not answer yet (extproc) and an engine name that does not resolve yet (collector): each
    command says so, naming redis_url (password masked) or the endpoint and host, and runs."""
    dead = f"redis://:hidden-pw-4321@127.0.0.1:{free_port()}/0"
    config = tmp_path / "extproc.yaml"
    config.write_text(f"redis_url: '{dead}'\nmodels:\n- name: m\n  endpoints: [{{url: 'http://127.0.0.1:9'}}]\n")
    port = free_port()
    cli = [sys.executable, "-m", "cognitora.cli"]
    argv = [*cli, "extproc", "--config", str(config), "--listen", f"127.0.0.1:{port}"]
    with ManagedProcess(argv, tmp_path / "extproc.log", cwd=ROOT) as service:
        wait_listening(port, service)
        log = service.log_tail(100)
    assert "redis_url (redis://:****@127.0.0.1:" in log and "did not answer" in log and "Starting anyway" in log
    assert "hidden-pw-4321" not in log

    config = tmp_path / "collector.yaml"
    config.write_text(
        f"redis_url: {redis_server_url}\nkey_prefix: {key_prefix}\n"
        "models:\n- name: m\n  endpoints: [{url: 'http://gpu-7.invalid:8000'}]\n"
    )
    argv = [*cli, "collector", "--config", str(config)]
    try:
        with ManagedProcess(argv, tmp_path / "collector.log", cwd=ROOT) as collector:
            wait_until(lambda: "collector started" in collector.log_tail(100), 30, "the collector to start")
            log = collector.log_tail(100)
            assert collector.alive()
    finally:
        asyncio.run(delete_everything(redis_server_url, key_prefix))
    assert "the host 'gpu-7.invalid' of endpoint gpu-7.invalid:8000 does not resolve" in log
    assert "scraping it anyway" in log


async def delete_everything(url: str, key_prefix: str) -> None:
    store = RedisStore.from_url(url, key_prefix=key_prefix)
    try:
        await store.delete_everything()
    finally:
        await store.close()


# -- the LiteLLM strategy: litellm.Router refuses to start -----------------------------------------------------------


def deployment(api_base: str, name: str = "chat") -> dict[str, Any]:
    return {"model_name": name, "litellm_params": {"model": f"hosted_vllm/{name}", "api_base": api_base}}


def litellm_router(model_list: list[dict[str, Any]], **args: Any) -> Any:
    return litellm.Router(model_list=model_list, routing_strategy="cognitora", routing_strategy_args=args)


def test_litellm_refuses_one_engine_listed_twice_naming_both_deployments() -> None:
    port = free_port()
    with pytest.raises(ConfigError) as err:
        litellm_router([deployment(f"http://localhost:{port}/v1"), deployment(f"http://127.0.0.1:{port}/v1")])
    assert str(err.value).startswith(
        f"model_list[0].litellm_params.api_base (http://localhost:{port}) and model_list[1].litellm_params.api_base "
        f"(http://127.0.0.1:{port}) are one engine (127.0.0.1:{port})"
    )


def test_litellm_refuses_a_bad_chat_template_and_a_wrong_redis_password(
    tmp_path: Path, smollm2_dir: Path, redis_with_password_url: str
) -> None:
    template = tmp_path / "broken.jinja"
    template.write_text(BROKEN_TEMPLATE)
    models = [{"name": "chat", "tokenizer": str(smollm2_dir / "tokenizer.json"), "chat_template": str(template)}]
    with pytest.raises(ConfigError, match=r"^models\[0\]\.chat_template \(model 'chat'\): .*does not compile"):
        litellm_router([deployment("http://127.0.0.1:9/v1")], models=models)

    wrong = redis_with_password_url.replace(REDIS_PASSWORD, "wrong-pw-9012")
    with pytest.raises(ConfigError) as err:
        litellm_router([deployment("http://127.0.0.1:9/v1")], redis_url=wrong)
    assert str(err.value).startswith("redis_url (redis://:****@127.0.0.1:") and "wrong-pw-9012" not in str(err.value)


def test_litellm_warns_of_an_unresolvable_engine_host_and_starts(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="cognitora.litellm"):
        router = litellm_router([deployment("http://gpu-7.invalid:8000/v1")])
    try:
        warnings = [r.getMessage() for r in caplog.records if "does not resolve" in r.getMessage()]
        assert len(warnings) == 1
        assert warnings[0].startswith("model_list[0].litellm_params.api_base (http://gpu-7.invalid:8000): the host")
    finally:
        litellm_plugin.strategy_for(router).close()
