"""Thin gRPC handlers: convert wire types, call `ControlService`, map its errors to status codes.

Every error detail is cut to `MAX_DETAIL` characters: gRPC carries it in a
metadata trailer (16 KiB by default), and an echoed value must never push the
real error out of it."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import grpc

from controller.api import convert, views
from controller.api import stoke_pb2 as pb
from controller.api import stoke_pb2_grpc as pb_grpc
from controller.messages import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted
from controller.service import ControlService
from controller.store import DatabaseError

log = logging.getLogger("stoke.controller.api")
#: Longest error detail sent back (characters).
MAX_DETAIL = 4000


def detail(text: str) -> str:
    """`text` cut to `MAX_DETAIL` characters, saying so."""
    return text if len(text) <= MAX_DETAIL else f"{text[: MAX_DETAIL - 40]}... ({len(text)} characters, cut)"


def _rpc(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return fn(self, request, context)
        except InvalidArgument as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, detail(str(err)))
        except NotFound as err:
            context.abort(grpc.StatusCode.NOT_FOUND, detail(str(err)))
        except FailedPrecondition as err:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, detail(str(err)))
        except ResourceExhausted as err:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, detail(str(err)))
        except DatabaseError as err:  # the store refuses: say why, it is the operator's to fix
            log.error("%s failed: %s", fn.__name__, err)
            context.abort(grpc.StatusCode.INTERNAL, detail(str(err)))
        except Exception as err:  # reported to the caller, logged here with its traceback
            log.exception("%s failed", fn.__name__)
            context.abort(grpc.StatusCode.INTERNAL, detail(f"{type(err).__name__}: {err}"))

    return wrapper


class ControllerHandlers(pb_grpc.StokeControllerServicer):
    def __init__(self, service: ControlService) -> None:
        self.service = service

    @_rpc
    def ApplyWorkloads(self, request, context):  # noqa: N802
        created, updated, unchanged = self.service.apply_workloads(
            [convert.workload_fields(w) for w in request.workloads], dry_run=request.dry_run
        )
        return pb.ApplyWorkloadsResponse(created=created, updated=updated, unchanged=unchanged)

    @_rpc
    def DeleteWorkload(self, request, context):  # noqa: N802
        return pb.DeleteWorkloadResponse(deleted=self.service.delete_workload(request.name))

    @_rpc
    def ListWorkloads(self, request, context):  # noqa: N802
        return pb.ListWorkloadsResponse(workloads=[convert.workload_to_pb(w) for w in self.service.list_workloads()])

    @_rpc
    def PreviewPlan(self, request, context):  # noqa: N802
        return pb.PlanResponse(plan=views.plan_to_pb(self.service.preview_plan()))

    @_rpc
    def GetPlan(self, request, context):  # noqa: N802
        view = self.service.current_plan()
        if view is None:
            raise NotFound("no plan has been applied yet; apply workloads with `stoke workload apply -f FILE`")
        return pb.PlanResponse(plan=views.plan_to_pb(view))

    @_rpc
    def ApplyPlan(self, request, context):  # noqa: N802
        outcome = self.service.apply_plan()
        return pb.PlanResponse(
            plan=views.plan_to_pb(outcome.plan),
            changed=outcome.changed,
            changes=[views.change_to_pb(c) for c in outcome.changes],
        )

    @_rpc
    def ListNodes(self, request, context):  # noqa: N802
        return pb.ListNodesResponse(nodes=[views.node_to_pb(n) for n in self.service.list_nodes()])

    @_rpc
    def GetStatus(self, request, context):  # noqa: N802
        return views.status_to_pb(self.service.status())

    @_rpc
    def UploadProfile(self, request, context):  # noqa: N802
        rows = self.service.upload_profile(request.profile_json, request.gpu_type)
        return pb.UploadProfileResponse(profiles=[views.profile_row_to_pb(r) for r in rows])

    @_rpc
    def ListProfiles(self, request, context):  # noqa: N802
        rows = [r for r in self.service.list_profiles() if not request.model or r.model == request.model]
        versions = (
            views.profile_versions_to_pb(rows, self.service.profile_versions(request.model)) if request.versions else []
        )
        return pb.ListProfilesResponse(profiles=[views.profile_row_to_pb(r) for r in rows], versions=versions)

    @_rpc
    def RollbackProfile(self, request, context):  # noqa: N802
        rows = self.service.rollback_profile(request.model, request.gpu_type, request.version, request.resume)
        return pb.RollbackProfileResponse(profiles=[views.profile_row_to_pb(r) for r in rows])

    @_rpc
    def ListObservations(self, request, context):  # noqa: N802
        records = self.service.list_observations(request.workload, request.limit)
        obs = self.service.config.observations
        return pb.ListObservationsResponse(
            observations=[views.observation_record_to_pb(r) for r in records],
            stored=self.service.store.observation_count(),
            retention_s=obs.retention_s,
            max_rows=obs.max_rows,
        )

    @_rpc
    def MintAgentToken(self, request, context):  # noqa: N802
        token, node_id, generation = self.service.mint_agent_token(request.node_id)
        return pb.MintAgentTokenResponse(token=token, node_id=node_id, generation=generation)


class AgentHandlers(pb_grpc.AgentGatewayServicer):
    def __init__(self, service: ControlService) -> None:
        self.service = service

    @_rpc
    def Register(self, request, context):  # noqa: N802
        interval = self.service.register(
            request.node_id, [convert.device_from_pb(d) for d in request.devices], request.address
        )
        return pb.RegisterResponse(heartbeat_interval_s=interval)

    @_rpc
    def Heartbeat(self, request, context):  # noqa: N802
        return convert.answer_to_pb(self.service.heartbeat(convert.report_from_pb(request)))
