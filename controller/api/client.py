"""Client of the controller API: the one place callers (CLI, agent, tests) go through gRPC.

Returns the messages (`controller.messages`) or the protobuf responses (for
display), and turns gRPC status codes back into the errors the service
raised (`controller.messages`: `InvalidArgument`, `NotFound`,
`FailedPrecondition`; `Unavailable` and `Unauthenticated` on the way), each
with one readable line.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import grpc

from controller.api import convert
from controller.api import stoke_pb2 as pb
from controller.api import stoke_pb2_grpc as pb_grpc
from controller.api.auth import channel_credentials, is_loopback
from controller.messages import (
    ApiError,
    FailedPrecondition,
    HeartbeatAnswer,
    HeartbeatReport,
    InvalidArgument,
    ModelAssignment,
    NodeDevice,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    TlsMismatch,
    Unauthenticated,
    Unavailable,
)
from planner.solver import Workload

log = logging.getLogger("stoke.client")
_ERRORS: dict[Any, type[ApiError]] = {
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: Unavailable,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
}
#: Substrings of gRPC's UNAVAILABLE details that mean TLS on one side only, not an unreachable controller
#: (checked against a real server: a plaintext client meets "Socket closed", a TLS one a failed handshake).
_PLAIN_TO_TLS = ("Socket closed", "Connection reset")
_TLS_TO_PLAIN = ("handshake", "SSL_ERROR", "WRONG_VERSION_NUMBER")


def unavailable_error(address: str, detail: str, tls: bool) -> Unavailable:
    """The error for an UNAVAILABLE answer: unreachable, or (likely) TLS on one side only."""
    if tls and any(m in detail for m in _TLS_TO_PLAIN):
        return TlsMismatch(
            f"controller at {address} did not complete a TLS handshake ({detail}); it may serve plaintext: "
            f"drop --tls/--tls-ca, or check the CA"
        )
    if not tls and any(m in detail for m in _PLAIN_TO_TLS) and "Connection refused" not in detail:
        return TlsMismatch(
            f"controller at {address} closed the connection ({detail}); it may serve TLS: pass --tls-ca FILE "
            f"(or --tls for the system's roots)"
        )
    return Unavailable(f"controller at {address} is unreachable: {unreachable_reason(detail)}")


#: The reason given when the controller's host name does not resolve (its fix is the name, not starting it).
UNRESOLVED = "its host name does not resolve"
#: gRPC's UNAVAILABLE details (substrings) -> the same in an operator's words (checked against grpcio 1.6x).
_UNREACHABLE_REASONS = (
    (("Connection refused",), "nothing listens on that port"),
    (
        # grpcio 1.8x: "errors resolving HOST:PORT: [... address lookup failed for HOST:PORT: Domain name not found]"
        (
            "DNS resolution failed",
            "Name or service not known",
            "Could not resolve",
            "errors resolving",
            "lookup failed",
            "Domain name not found",
        ),
        UNRESOLVED,
    ),
    (("Deadline Exceeded", "deadline", "Timeout occurred", "timed out"), "no answer in time"),
    (("No route to host", "Network is unreachable"), "no route to that host"),
    (("Socket closed", "Connection reset", "Broken pipe"), "it closed the connection"),
)


def unreachable_reason(detail: str) -> str:
    """What gRPC's UNAVAILABLE detail means, in a few plain words (never the raw text, which names
    gRPC internals such as "failed to connect to all addresses; last error: UNKNOWN: ipv4:...")."""
    lowered = detail.lower()
    for needles, reason in _UNREACHABLE_REASONS:
        if any(n.lower() in lowered for n in needles):
            return reason
    return "it did not answer"


class ControllerClient:
    def __init__(
        self,
        address: str,
        *,
        token: str | None = None,
        tls_ca: str | None = None,
        tls: bool = False,
        timeout_s: float = 10.0,
    ) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self.tls = bool(tls or tls_ca)
        if self.tls:
            self._channel = grpc.secure_channel(address, channel_credentials(tls_ca))
        else:
            self._channel = grpc.insecure_channel(address)
            if token and not is_loopback(address):
                log.warning(
                    "sending the token to %s without TLS: anyone on the path can read it; pass --tls-ca FILE "
                    "(or --tls)",
                    address,
                )
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._ctl = pb_grpc.StokeControllerStub(self._channel)
        self._agent = pb_grpc.AgentGatewayStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> ControllerClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _call(self, method: Any, request: Any, timeout_s: float | None = None) -> Any:
        try:
            return method(request, metadata=self._metadata, timeout=timeout_s or self.timeout_s)
        except grpc.RpcError as err:
            code = err.code() if hasattr(err, "code") else None
            detail = err.details() if hasattr(err, "details") else str(err)
            cls = _ERRORS.get(code, ApiError)
            if cls is Unavailable:
                raise unavailable_error(self.address, detail, self.tls) from None
            raise cls(detail) from None

    # ------------------------------------------------------------ users

    def apply_workloads(self, workloads: Sequence[Workload], *, dry_run: bool = False) -> pb.ApplyWorkloadsResponse:
        request = pb.ApplyWorkloadsRequest(workloads=[convert.workload_to_pb(w) for w in workloads], dry_run=dry_run)
        return self._call(self._ctl.ApplyWorkloads, request)

    def apply_raw(self, request: pb.ApplyWorkloadsRequest) -> pb.ApplyWorkloadsResponse:
        return self._call(self._ctl.ApplyWorkloads, request)

    def delete_workload(self, name: str) -> bool:
        return self._call(self._ctl.DeleteWorkload, pb.DeleteWorkloadRequest(name=name)).deleted

    def list_workloads(self) -> list[Workload]:
        reply = self._call(self._ctl.ListWorkloads, pb.ListWorkloadsRequest())
        return [convert.workload_from_pb(w) for w in reply.workloads]

    def preview_plan(self) -> pb.PlanResponse:
        return self._call(self._ctl.PreviewPlan, pb.PreviewPlanRequest(), timeout_s=120)

    def get_plan(self) -> pb.PlanResponse:
        return self._call(self._ctl.GetPlan, pb.GetPlanRequest())

    def apply_plan(self) -> pb.PlanResponse:
        return self._call(self._ctl.ApplyPlan, pb.ApplyPlanRequest(), timeout_s=120)

    def list_nodes(self) -> pb.ListNodesResponse:
        return self._call(self._ctl.ListNodes, pb.ListNodesRequest())

    def status(self) -> pb.StatusResponse:
        return self._call(self._ctl.GetStatus, pb.GetStatusRequest())

    def upload_profile(self, profile_json: str, gpu_type: str = "") -> pb.UploadProfileResponse:
        return self._call(
            self._ctl.UploadProfile, pb.UploadProfileRequest(profile_json=profile_json, gpu_type=gpu_type)
        )

    def list_profiles(self, versions: bool = False, model: str = "") -> pb.ListProfilesResponse:
        return self._call(self._ctl.ListProfiles, pb.ListProfilesRequest(versions=versions, model=model))

    def rollback_profile(
        self, model: str, gpu_type: str = "", version: int = 0, resume: bool = False
    ) -> pb.RollbackProfileResponse:
        request = pb.RollbackProfileRequest(model=model, gpu_type=gpu_type, version=version, resume=resume)
        return self._call(self._ctl.RollbackProfile, request)

    def list_observations(self, workload: str = "", limit: int = 100) -> pb.ListObservationsResponse:
        return self._call(self._ctl.ListObservations, pb.ListObservationsRequest(workload=workload, limit=limit))

    def mint_agent_token(self, node_id: str) -> pb.MintAgentTokenResponse:
        return self._call(self._ctl.MintAgentToken, pb.MintAgentTokenRequest(node_id=node_id))

    # ------------------------------------------------------------ agents

    def register(self, node_id: str, devices: Sequence[NodeDevice], address: str = "") -> float:
        reply = self._call(
            self._agent.Register,
            pb.RegisterRequest(node_id=node_id, devices=[convert.device_to_pb(d) for d in devices], address=address),
        )
        return reply.heartbeat_interval_s

    def heartbeat(self, report: HeartbeatReport) -> HeartbeatAnswer:
        return convert.answer_from_pb(self._call(self._agent.Heartbeat, convert.report_to_pb(report)))


def assignments_of(reply: pb.HeartbeatResponse) -> tuple[ModelAssignment, ...]:
    return tuple(convert.assignment_from_pb(a) for a in reply.assignments)
