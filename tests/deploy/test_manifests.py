"""`stoke k8s render`: every manifest validates against the pinned Kubernetes 1.30 schemas (strict).

kubernetes-validate carries the OpenAPI schemas of each Kubernetes release; its strict variant refuses
unknown fields, so a misspelt key fails as it would on `kubectl apply --validate=strict`. The kinds
that are not Kubernetes' own (StokeWorkload, ServiceMonitor, PrometheusRule) are checked against the
CRD this project generates, and structurally.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from deploy import crd
from deploy.manifests import render
from deploy.options import RenderOptions
from foundation import validate as check
from foundation.names import shown
from planner.workload_file import WorkloadEntry, example_workloads_path, read_workloads
from stoke.cli import main

K8S_VERSION = "1.30.0"
NOT_KUBERNETES = {"StokeWorkload", "ServiceMonitor", "PrometheusRule", "Kustomization"}


def example_workloads():
    workloads = read_workloads(example_workloads_path())
    return tuple(w for w in workloads if crd._DNS_LABEL.match(w.name))


def k8s_validate(manifest: dict) -> None:
    kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)


def all_manifests(files):
    return [(name, m) for name, ms in files.items() for m in ms]


def crd_validator():
    schema = crd.crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return jsonschema.Draft4Validator(schema)  # OpenAPI 3.0's schema object is JSON Schema draft 4's dialect


def test_every_rendered_manifest_validates_against_kubernetes_1_30(tmp_path):
    workloads = example_workloads()
    assert workloads, "the bundled example has workloads with Kubernetes names"
    files = render(workloads, RenderOptions(gpu_type="V100"))
    kinds = set()
    for name, manifest in all_manifests(files):
        kinds.add(manifest["kind"])
        if manifest["kind"] in NOT_KUBERNETES:
            continue
        assert kubernetes_validate.validate(manifest, K8S_VERSION, strict=True) == "1.30", name
    assert {
        "CustomResourceDefinition",
        "StatefulSet",
        "Deployment",
        "DaemonSet",
        "Service",
        "Role",
        "ClusterRole",
        "ServiceAccount",
        "ConfigMap",
        "Namespace",
    } <= kinds
    validator = crd_validator()
    for manifest in files["workloads.yaml"]:
        validator.validate(manifest)
        assert crd.workload_from_resource(manifest["metadata"]["name"], manifest["spec"], "test") in workloads


@pytest.mark.parametrize(
    "breakage",
    [
        ("agent.yaml", 0, ["spec", "template", "spec", "hostIPCC"], True),  # a misspelt field
        ("controller.yaml", 1, ["spec", "replicas"], "one"),  # a wrong type
        ("operator.yaml", 0, ["spec", "template", "spec", "containers", 0, "imagePullPolicy"], 3),
        ("crd.yaml", 0, ["spec", "scope"], None),  # null where a string is required
    ],
)
def test_an_invalid_field_fails_validation(breakage):
    files = render(example_workloads())
    name, index, path, value = breakage
    manifest = copy.deepcopy(files[name][index])
    k8s_validate(manifest)  # fine as rendered
    node = manifest
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(kubernetes_validate.ValidationError):
        k8s_validate(manifest)


def _walk(schema, where="openAPIV3Schema"):
    yield where, schema
    for name, sub in schema.get("properties", {}).items():
        yield from _walk(sub, f"{where}.{name}")
    if "items" in schema:
        yield from _walk(schema["items"], f"{where}[]")


def test_the_committed_crd_is_current():
    assert crd.CRD_FILE.read_text() == crd.crd_text(), "stale CRD: run `make schema`"


def test_the_crd_schema_is_structural_and_comes_from_the_workload_file_declarations():
    manifest = crd.crd_manifest()
    version = manifest["spec"]["versions"][0]
    for where, node in _walk(version["schema"]["openAPIV3Schema"]):
        assert "type" in node or node.get("x-kubernetes-int-or-string"), where
        assert "additionalProperties" not in node and "const" not in node and "$schema" not in node, where
        for option in node.get("anyOf", []):  # only the int-or-string form may nest types
            assert node.get("x-kubernetes-int-or-string") and set(option) <= {"type", "minimum", "maximum", "pattern"}
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    file_keys = [k for k in check.keys(WorkloadEntry) if k != "name"]
    assert list(spec["properties"]) == file_keys
    assert spec["required"] == ["model", "slo_ms", "rate_rps"]
    docs = {key: doc for key, _, doc in check.key_docs(WorkloadEntry)}
    assert all(spec["properties"][k]["description"] == docs[k] for k in file_keys)
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns[:4] == ["Model", "SLO ms", "Rate", "State"] and "Endpoint" in columns
    assert version["subresources"] == {"status": {}}


@pytest.mark.parametrize(
    "spec, accepted",
    [
        ({"model": "m", "slo_ms": 20, "rate_rps": 100}, True),
        ({"model": "m", "slo_ms": 20, "rate_rps": "auto", "min_rps": 5, "max_rps": 50}, True),
        ({"model": "m", "slo_ms": 20, "rate_rps": "2.5"}, True),
        ({"model": "m", "slo_ms": 20, "rate_rps": "fast"}, False),
        ({"model": "m", "slo_ms": -1, "rate_rps": 100}, False),
        ({"model": "m", "slo_ms": 20, "rate_rps": 0}, False),
        ({"model": "m", "slo_ms": 20, "rate_rps": 100, "arrivals": "bursty"}, False),
        ({"model": "bad/name", "slo_ms": 20, "rate_rps": 100}, False),
        ({"slo_ms": 20, "rate_rps": 100}, False),
    ],
)
def test_the_crd_schema_and_the_file_loader_agree(spec, accepted):
    body = {"apiVersion": crd.API_VERSION, "kind": crd.KIND, "metadata": {"name": "w"}, "spec": spec}
    schema_ok = crd_validator().is_valid(body)
    try:
        crd.workload_from_resource("w", spec, "stoke/w")
        loader_ok = True
    except crd.StokeWorkloadError:
        loader_ok = False
    assert (schema_ok, loader_ok) == (accepted, accepted)


def test_checks_across_fields_are_the_loaders_and_name_the_resource():
    with pytest.raises(crd.StokeWorkloadError, match=r"stoke/w: spec: min_rps \(9\) must not exceed max_rps \(3\)"):
        crd.workload_from_resource(
            "w", {"model": "m", "slo_ms": 5, "rate_rps": "auto", "min_rps": 9, "max_rps": 3}, "stoke/w"
        )
    with pytest.raises(crd.StokeWorkloadError, match="unknown key 'spec.slo'"):
        crd.workload_from_resource("w", {"model": "m", "slo": 5, "rate_rps": 1}, "stoke/w")


def test_render_command_writes_a_kustomize_base_and_rewrites_nothing_unchanged(tmp_path, capsys):
    out = tmp_path / "k8s"
    wl = tmp_path / "wl.yaml"
    wl.write_text("workloads:\n  - {name: web, model: mlp_small, slo_ms: 50, rate_rps: 20}\n")
    assert main(["k8s", "render", "-o", str(out), "--workloads", str(wl), "--image", "reg.example/stoke:1.2"]) == 0
    kustomization = yaml.safe_load((out / "kustomization.yaml").read_text().split("\n", 1)[1])
    assert kustomization["images"] == [{"name": "reg.example/stoke", "newTag": "1.2"}]
    for name in kustomization["resources"]:
        docs = [d for d in yaml.safe_load_all((out / name).read_text()) if d]
        assert docs and all(d["metadata"].get("namespace", "stoke") == "stoke" for d in docs)
    rule = next(yaml.safe_load_all((out / "monitoring" / "monitoring.yaml").read_text()))
    assert rule["kind"] == "ServiceMonitor"
    agent = yaml.safe_load((out / "agent.yaml").read_text().split("\n", 1)[1])
    pod = agent["spec"]["template"]["spec"]
    assert "hostIPC" not in pod and pod["automountServiceAccountToken"] is False
    assert all(c["securityContext"]["runAsNonRoot"] for c in pod["containers"] + pod["initContainers"])
    assert not any("secret" in v for v in pod["volumes"]), "no shared agent secret in the DaemonSet"
    assert not any("hostPath" in v for v in pod["volumes"]) and not pod.get("hostNetwork")
    capsys.readouterr()
    assert main(["k8s", "render", "-o", str(out), "--workloads", str(wl), "--image", "reg.example/stoke:1.2"]) == 0
    assert "written" not in capsys.readouterr().err.replace("unchanged", "")


def test_a_workload_file_s_gpu_types_are_said_not_to_be_carried(tmp_path, capsys):
    """Only the workloads become StokeWorkloads: a file's gpu_types (prices, profiles) were dropped without a word;
    the warning names them and where they go in a cluster. A file without gpu_types says nothing."""
    wl = tmp_path / "wl.yaml"
    body = "workloads:\n  - {name: web, model: mlp_small, slo_ms: 50, rate_rps: 20}\n"
    wl.write_text("gpu_types:\n  - {name: V100, price_per_hour: 3.06}\n  - {name: A100, price_per_hour: 4}\n" + body)
    assert main(["k8s", "render", "-o", str(tmp_path / "out"), "--workloads", str(wl)]) == 0
    err = capsys.readouterr().err
    assert "its gpu_types ('V100', 'A100') are not carried into the manifests" in err
    assert "controller.yaml's gpu_types" in err and "stoke profiles upload" in err
    wl.write_text(body)
    assert main(["k8s", "render", "-o", str(tmp_path / "out"), "--workloads", str(wl)]) == 0
    assert "warning" not in capsys.readouterr().err


def test_a_workload_name_kubernetes_cannot_take_is_refused_with_its_file(tmp_path, capsys):
    wl = tmp_path / "wl.yaml"
    wl.write_text("workloads:\n  - {name: Web_1, model: mlp_small, slo_ms: 50, rate_rps: 20}\n")
    assert main(["k8s", "render", "-o", str(tmp_path / "out"), "--workloads", str(wl)]) == 2
    err = capsys.readouterr().err
    assert str(wl) in err and "'Web_1' is not a Kubernetes name" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("namespace", ["Bad_NS", "-x", "a" * 64, "x\x1b[2J"])
def test_a_namespace_kubernetes_cannot_take_is_refused_naming_the_option(tmp_path, capsys, namespace):
    """The fix names --namespace (it said "rename the workload"), and the name is shown escaped."""
    assert main(["k8s", "render", "-o", str(tmp_path / "out"), f"--namespace={namespace}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"stoke: error: --namespace {shown(namespace)} is not a Kubernetes name")
    assert err.endswith("give --namespace a lower-case name, e.g. --namespace ml-serving")
    assert "workload" not in err and "\x1b" not in err
    assert not (tmp_path / "out").exists()
    assert main(["k8s", "operator", f"--namespace={namespace}", "--token-file", str(tmp_path / "token")]) == 2
    assert "give --namespace a lower-case name" in capsys.readouterr().err


DIGEST = "sha256:" + "0123456789abcdef" * 4


@pytest.mark.parametrize(
    "image, says",
    [
        ("bad image", "holds a space or control character"),  # was written as `image: bad image`, exit 0
        ("stoke\x1b[2J:1", "holds a space or control character"),
        ("", "is empty"),
        ("reg.example/Stoke:1", "has upper-case letters in its repository path"),
        ("stoke:", "is not a container image reference"),
        ("stoke:-1", "is not a container image reference"),
        ("reg.example//stoke", "is not a container image reference"),
        ("stoke@sha256:abc", "is not a container image reference"),
        ("https://reg.example/stoke", "is not a container image reference"),
        ("a" * 256, "has a name (before :TAG) longer than 255 characters"),
    ],
)
def test_an_image_kubernetes_cannot_pull_is_refused(tmp_path, capsys, image, says):
    assert main(["k8s", "render", "-o", str(tmp_path / "out"), f"--image={image}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"stoke: error: --image {shown(image)} {says} ([REGISTRY[:PORT]/]PATH[:TAG][@DIGEST]")
    assert err.endswith("give one such as --image reg.example/stoke:0.1.0") and "\x1b" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "image, entry",
    [
        ("stoke:0.1.0", {"name": "stoke", "newTag": "0.1.0"}),
        ("localhost:5000/team/stoke", {"name": "localhost:5000/team/stoke"}),
        ("[::1]:5000/my_org/stoke-gpu:v1.2.3_RC-1", {"name": "[::1]:5000/my_org/stoke-gpu", "newTag": "v1.2.3_RC-1"}),
        (f"reg.example/stoke@{DIGEST}", {"name": "reg.example/stoke", "digest": DIGEST}),
        (f"Reg.Example:443/stoke:1.2@{DIGEST}", {"name": "Reg.Example:443/stoke", "newTag": "1.2", "digest": DIGEST}),
    ],
)
def test_an_image_reference_is_taken_and_split_for_kustomize(tmp_path, capsys, image, entry):
    """The kustomization's images entry names the repository alone (a digest's ':' is not a tag's)."""
    out = tmp_path / "out"
    assert main(["k8s", "render", "-o", str(out), "--image", image]) == 0
    kustomization = yaml.safe_load((out / "kustomization.yaml").read_text().split("\n", 1)[1])
    assert kustomization["images"] == [entry]
    pod = yaml.safe_load((out / "agent.yaml").read_text().split("\n", 1)[1])["spec"]["template"]["spec"]
    assert {c["image"] for c in pod["containers"] + pod["initContainers"]} == {image}


def test_rendered_prometheus_rule_holds_the_generated_alerts():
    files = render(example_workloads())
    rule = next(m for m in files["monitoring/monitoring.yaml"] if m["kind"] == "PrometheusRule")
    names = {g["name"] for g in rule["spec"]["groups"]}
    assert {f"stoke-slo-alerts-{w.name}" for w in example_workloads()} <= names
    dashboard = files["dashboard.yaml"][0]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1" and "stoke.json" in dashboard["data"]


def test_render_writes_yaml_kubectl_reads(tmp_path):
    from deploy.manifests import write

    written = write(tmp_path, render(()))
    assert all(changed for _, changed in written)
    for path, _ in written:
        for doc in yaml.safe_load_all(Path(path).read_text()):
            assert doc is None or ("apiVersion" in doc and "kind" in doc)


@pytest.mark.slow  # kubectl subprocesses
@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (with its kustomize) not installed")
def test_kustomize_builds_both_bases_and_an_image_override(tmp_path):
    out = tmp_path / "k8s"
    assert main(["k8s", "render", "-o", str(out), "--workloads", str(example_workloads_path())]) == 0
    (tmp_path / "overlay").mkdir()  # an overlay, as a user would keep one beside the rendered base
    (tmp_path / "overlay" / "kustomization.yaml").write_text(
        "resources: [../k8s]\nimages: [{name: stoke, newName: reg.example/stoke, newTag: '2.0'}]\n"
    )
    built = subprocess.run(
        ["kubectl", "kustomize", str(tmp_path / "overlay")], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    docs = [d for d in yaml.safe_load_all(built) if d]
    assert len(docs) == sum(len(ms) for name, ms in render(example_workloads()).items() if "/" not in name) - 1
    images = {
        c["image"]
        for d in docs
        if d["kind"] in ("StatefulSet", "Deployment", "DaemonSet")
        for c in d["spec"]["template"]["spec"]["containers"] + d["spec"]["template"]["spec"].get("initContainers", [])
    }
    assert images == {"reg.example/stoke:2.0"}
    for d in docs:
        if d["kind"] not in NOT_KUBERNETES:
            k8s_validate(d)
    monitoring = subprocess.run(
        ["kubectl", "kustomize", str(out / "monitoring")], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert {d["kind"] for d in yaml.safe_load_all(monitoring) if d} == {"ServiceMonitor", "PrometheusRule"}
