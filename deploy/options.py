"""The parameters of `stoke k8s render` (a module of its own: the CLI reads the defaults without the renderer)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RenderOptions:
    """Parameters of the rendered installation (each has a flag of `stoke k8s render`)."""

    namespace: str = "stoke"
    image: str = "stoke:0.1.0"  # built from this repository; see the README, "Kubernetes"
    gpu_node_selector: tuple[tuple[str, str], ...] = (("nvidia.com/gpu.present", "true"),)
    runtime_class: str = "nvidia"  # the NVIDIA container runtime: all of the node's GPUs in the agent's pod
    repository: str = "/models"  # the Triton model repository the agents serve: a path or s3://bucket/path
    agent_ports: str = "30000-30199"  # the routers' ports (two per workload on a node)
    db_storage: str = "1Gi"
    storage_class: str = ""  # "" = the cluster's default StorageClass
    gpu_type: str = ""  # the nodes' GPU type ("" = left to the controller's gpu_types)
