"""The StokeWorkload custom resource (stoke.dev/v1alpha1): its CRD and how a resource becomes a `Workload`.

    apiVersion: stoke.dev/v1alpha1
    kind: StokeWorkload
    metadata: {name: web-alexnet, namespace: stoke}
    spec:                      # a workload file's entry, without `name` (metadata.name is the name)
      model: alexnet
      slo_ms: 15
      rate_rps: 500            # or "auto" (with min_rps / max_rps), or a decimal as a string: "2.5"
      gpu_type: V100
      arrivals: poisson

The spec's keys are the workload file's (`planner.workload_file.WorkloadEntry`), so a file's entry
pastes into a spec unchanged, and its OpenAPI schema is generated from the same declarations as the
file's JSON Schema (`structural_schema` converts that JSON Schema into Kubernetes' structural subset).
The one place Kubernetes cannot say what the file says: a value that is a number *or* the string
"auto". A structural schema has no number-or-string type, only int-or-string, so `rate_rps` is an
integer, or a string holding "auto" or a decimal ("2.5"); `workload_from_resource` reads both.

Checks across fields (min_rps <= max_rps, bounds only with auto) are not expressible there: the
operator runs the file's loader on every spec and writes what it refuses into the status
(condition Accepted=False, with the loader's message).
"""

from __future__ import annotations

import copy
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from foundation import validate as check
from foundation.names import shown
from planner.solver import Workload
from planner.workload_file import WorkloadEntry, WorkloadFileError, entry_workload

#: The CRD as committed (`make schema` rewrites it; a test fails when it is stale), so its changes show in review.
CRD_FILE = Path(__file__).resolve().parent / "data" / "stokeworkloads.crd.yaml"
GROUP = "stoke.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "StokeWorkload"
PLURAL = "stokeworkloads"
SINGULAR = "stokeworkload"
SHORT_NAMES = ("swl",)
#: JSON Schema keys with no meaning in Kubernetes' OpenAPI v3 subset.
_DROPPED = ("$schema", "title", "additionalProperties")
_DECIMAL = r"^(auto|[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?)$"


class StokeWorkloadError(WorkloadFileError):
    """A StokeWorkload's spec is refused; the message names the resource, the field and the fix."""


def structural_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """Kubernetes' structural OpenAPI v3 schema for a JSON Schema (draft 2020-12) of `foundation.validate`.

    Every node gets a `type` (an enum's is its values' type), `const` becomes a one-value `enum`, a
    numeric `exclusiveMinimum` becomes OpenAPI 3.0's boolean form, and number-or-"auto" becomes
    int-or-string (see the module docstring). Unknown keys are pruned by the API server rather than
    refused by `additionalProperties: false`, which structural schemas do not allow.
    """
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _DROPPED:
            continue
        if key == "properties":
            out[key] = {name: structural_schema(sub) for name, sub in value.items()}
        elif key == "items":
            out[key] = structural_schema(value)
        elif key == "const":
            out["enum"] = [value]
        elif key == "exclusiveMinimum":
            out["minimum"], out["exclusiveMinimum"] = value, True
        elif key == "anyOf":
            out.update(_number_or_word(value))
        else:
            out[key] = copy.deepcopy(value)
    if "type" not in out and "enum" in out:
        kinds = {type(v) for v in out["enum"]}
        if kinds != {str}:
            raise ValueError(f"enum of mixed or non-string values has no structural type: {out['enum']}")
        out["type"] = "string"
    if "type" not in out and not out.get("x-kubernetes-int-or-string"):
        raise ValueError(f"schema node without a type has no structural form: {schema}")
    return out


def _number_or_word(options: list[Mapping[str, Any]]) -> dict[str, Any]:
    numbers = [o for o in options if o.get("type") == "number"]
    words = [o for o in options if "const" in o]
    if len(numbers) != 1 or len(words) != 1 or len(options) != 2 or words[0]["const"] != "auto":
        raise ValueError(f"anyOf without a structural form: {options}")
    integer: dict[str, Any] = {"type": "integer", "minimum": 1}
    if "maximum" in numbers[0]:
        integer["maximum"] = int(numbers[0]["maximum"])
    return {
        "x-kubernetes-int-or-string": True,
        "anyOf": [integer, {"type": "string", "pattern": _DECIMAL}],
    }


def spec_schema() -> dict[str, Any]:
    """The StokeWorkload spec: a workload file entry's schema without `name`."""
    entry = structural_schema(check.json_schema(WorkloadEntry))
    entry["properties"].pop("name")
    entry["required"] = [r for r in entry["required"] if r != "name"]
    entry["description"] = "A workload of a stoke workload file (its keys and checks), named by metadata.name."
    return entry


_CONDITION = {
    "type": "object",
    "required": ["type", "status"],
    "properties": {
        "type": {"type": "string", "description": "Accepted (the controller stored the spec) or Serving"},
        "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
        "reason": {"type": "string"},
        "message": {"type": "string"},
        "lastTransitionTime": {"type": "string", "format": "date-time"},
        "observedGeneration": {"type": "integer", "minimum": 0},
    },
}

STATUS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "What the controller reports for this workload (`stoke status`), written by the operator.",
    "properties": {
        "state": {
            "type": "string",
            "description": "serving, starting, failing, pending, degraded; Invalid when the spec is refused",
        },
        "reason": {"type": "string", "description": "why it is not serving, when it is not"},
        "replicas": {"type": "integer", "minimum": 0, "description": "replicas in the applied plan"},
        "ready": {"type": "integer", "minimum": 0, "description": "replicas their nodes report serving"},
        "predictedP99Ms": {"type": "number", "description": "worst replica's p99 predicted by the plan (ms)"},
        "p99UpperMs": {
            "type": "number",
            "description": "upper bound of the predicted p99 (ms), when the controller's plan carries one",
        },
        "observedP99Ms": {"type": "number", "description": "worst replica's p99 over the last window (ms)"},
        "observedRateRps": {"type": "number", "description": "requests per second observed, all replicas"},
        "endpoint": {
            "type": "string",
            "description": "in-cluster gRPC endpoint (the workload's Service: stable through share moves)",
        },
        "httpEndpoint": {"type": "string", "description": "in-cluster HTTP endpoint of the same Service"},
        "routers": {
            "type": "array",
            "items": {"type": "string"},
            "description": "node router gRPC endpoints behind the Service (HOST:PORT)",
        },
        "observedGeneration": {"type": "integer", "minimum": 0},
        "conditions": {"type": "array", "items": _CONDITION},
    },
}

#: `kubectl get stokeworkloads` reads like `stoke status`'s workload table.
PRINTER_COLUMNS: tuple[dict[str, Any], ...] = (
    {"name": "Model", "type": "string", "jsonPath": ".spec.model"},
    {"name": "SLO ms", "type": "number", "jsonPath": ".spec.slo_ms"},
    {"name": "Rate", "type": "string", "jsonPath": ".spec.rate_rps"},
    {"name": "State", "type": "string", "jsonPath": ".status.state"},
    {"name": "Replicas", "type": "integer", "jsonPath": ".status.replicas"},
    {"name": "p99 pred ms", "type": "number", "jsonPath": ".status.predictedP99Ms"},
    {"name": "p99 obs ms", "type": "number", "jsonPath": ".status.observedP99Ms"},
    {"name": "Endpoint", "type": "string", "jsonPath": ".status.endpoint"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
)


def crd_manifest() -> dict[str, Any]:
    """The CustomResourceDefinition (apiextensions.k8s.io/v1): spec and status schemas, printer columns."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}", "labels": {"app.kubernetes.io/part-of": "stoke"}},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
                "categories": ["stoke"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": list(PRINTER_COLUMNS),
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "A service stoke plans (MPS share, batch, replicas) and serves with "
                            "Triton within its latency SLO.",
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema(),
                                "status": STATUS_SCHEMA,
                            },
                        }
                    },
                }
            ],
        },
    }


def resource_manifest(workload: Workload, namespace: str) -> dict[str, Any]:
    """A StokeWorkload for a workload read from a workload file (`stoke k8s render --workloads`)."""
    spec: dict[str, Any] = {"model": workload.model, "slo_ms": workload.slo_ms}
    spec["rate_rps"] = "auto" if workload.rate_auto else _rate_value(workload.rate_rps)
    if workload.gpu_type:
        spec["gpu_type"] = workload.gpu_type
    if workload.arrivals != "poisson":
        spec["arrivals"] = workload.arrivals
    for key in ("min_rps", "max_rps"):
        if getattr(workload, key) is not None:
            spec[key] = getattr(workload, key)
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": kubernetes_name(workload.name, "workload name"), "namespace": namespace},
        "spec": spec,
    }


def _rate_value(rate: float) -> int | str:
    return int(rate) if float(rate).is_integer() else repr(float(rate))


_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def kubernetes_name(name: str, what: str, fix: str = "rename the workload") -> str:
    """`name` when it is a DNS label (a StokeWorkload's, its Service's and a namespace's name must be); else a
    clear error naming `what` and ending with `fix`."""
    if not _DNS_LABEL.match(name):
        raise StokeWorkloadError(
            f"{what} {shown(name)} is not a Kubernetes name (a DNS label: at most 63 of a-z 0-9 -, from and to a "
            f"letter or digit); {fix}",
            "name",
        )
    return name


def workload_from_resource(name: str, spec: Any, where: str) -> Workload:
    """The `Workload` a StokeWorkload asks for, checked by the workload file's own loader.

    Raises `StokeWorkloadError` naming `where` (namespace/name), the field and the fix.
    """
    if not isinstance(spec, Mapping):
        raise StokeWorkloadError(f"{where}: spec must be a mapping of workload fields", "spec")
    data = dict(spec)
    if "name" in data:
        raise StokeWorkloadError(f"{where}: spec.name is not a field; metadata.name names the workload", "name")
    rate = data.get("rate_rps")
    if isinstance(rate, str) and rate != "auto":
        try:
            data["rate_rps"] = float(rate)
        except ValueError:
            raise StokeWorkloadError(
                f"{where}: spec.rate_rps must be a number or 'auto', got {rate!r}", "rate_rps"
            ) from None
    data["name"] = name
    entry = check.load(WorkloadEntry, data, where=where, error=StokeWorkloadError, prefix="spec.")
    return entry_workload(entry)


def crd_text() -> str:
    header = "# Generated from planner/workload_file.py by `make schema` (python -m deploy.crd); do not edit.\n"
    return header + yaml.safe_dump(crd_manifest(), sort_keys=False, width=120)


if __name__ == "__main__":  # `make schema`: rewrite the committed CRD
    from foundation.files import atomic_write_text

    CRD_FILE.parent.mkdir(exist_ok=True)
    print(f"{CRD_FILE}: {'written' if atomic_write_text(CRD_FILE, crd_text()) else 'unchanged'}", file=sys.stderr)
