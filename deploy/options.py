"""The parameters of `stoke k8s render` (a module of its own: the CLI reads the defaults without the renderer)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from foundation.errors import InputError
from foundation.names import shown


@dataclass(frozen=True)
class RenderOptions:
    """Parameters of the rendered installation (each has a flag of `stoke k8s render`)."""

    namespace: str = "stoke"
    image: str = "stoke:0.1.0"  # built from this repository; see the README, "Kubernetes"; checked by parse_image
    gpu_node_selector: tuple[tuple[str, str], ...] = (("nvidia.com/gpu.present", "true"),)
    runtime_class: str = "nvidia"  # the NVIDIA container runtime: all of the node's GPUs in the agent's pod
    repository: str = "/models"  # the Triton model repository the agents serve: a path or s3://bucket/path
    agent_ports: str = "30000-30199"  # the routers' ports (two per workload on a node)
    db_storage: str = "1Gi"
    storage_class: str = ""  # "" = the cluster's default StorageClass
    gpu_type: str = ""  # the nodes' GPU type ("" = left to the controller's gpu_types)


# A container image reference, as the OCI distribution grammar (distribution/reference) writes it:
#   [HOST[:PORT]/]PATH[:TAG][@DIGEST]
# HOST: DNS labels joined by dots (letters of either case), or an IPv6 address in brackets; PATH: components of
# lower-case a-z 0-9 joined by one of . _ __ or dashes, separated by /; TAG: 1-128 of A-Z a-z 0-9 _ . -, not
# starting with . or -; DIGEST: ALGORITHM:HEX (32 or more hex digits), e.g. sha256:<64 hex digits>. The name
# (HOST/PATH) is at most 255 characters. Kubernetes refuses any other image (InvalidImageName, pod by pod).
_ALNUM = r"[a-z0-9]+"
_PATH_COMPONENT = rf"{_ALNUM}(?:(?:[._]|__|-+){_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])"
_IMAGE = re.compile(
    rf"(?P<name>(?:{_HOST}(?::[0-9]+)?/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*)"
    r"(?::(?P<tag>[\w][\w.-]{0,127}))?"
    r"(?:@(?P<digest>[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}))?",
    re.ASCII,
)
IMAGE_FORM = "[REGISTRY[:PORT]/]PATH[:TAG][@DIGEST], PATH lower-case a-z 0-9 . _ - and /"
_IMAGE_NAME_MAX = 255
_IMAGE_MAX = 1024  # longer is refused before the grammar runs (no reference is near it)


def parse_image(image: str) -> tuple[str, str, str]:
    """(name, tag, digest) of a container image reference ("" for a part not given), or `InputError`
    naming --image: not a reference Kubernetes can pull (see `IMAGE_FORM`)."""
    match = _IMAGE.fullmatch(image) if isinstance(image, str) and len(image) <= _IMAGE_MAX else None
    if match is not None and len(match["name"]) <= _IMAGE_NAME_MAX:
        return match["name"], match["tag"] or "", match["digest"] or ""
    if not isinstance(image, str) or not image:
        why = "is empty"
    elif any(c.isspace() or not c.isprintable() for c in image):
        why = "holds a space or control character"
    elif match is not None:
        why = f"has a name (before :TAG) longer than {_IMAGE_NAME_MAX} characters"
    elif len(image) <= _IMAGE_MAX and _IMAGE.fullmatch(image.lower()):
        why = "has upper-case letters in its repository path"
    else:
        why = "is not a container image reference"
    raise InputError(
        f"--image {shown(image)} {why} ({IMAGE_FORM}); give one such as --image reg.example/stoke:0.1.0", "image"
    )
