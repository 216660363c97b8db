"""Cluster provisioning on EC2 for training: the one module that imports boto3.

Cluster-wide (run by the CLI, not on the nodes): it prices, launches and
watches the training cluster that `training` plans.

- `PriceSource`: the instance catalog with prices. Offline: the bundled
  catalog (no credentials, no network). Live: spot prices from
  `describe_spot_price_history` (the lowest current price over the zones)
  and on-demand prices from the pricing API (`get_products`), cached in a
  JSON file with the fetch timestamp and reused while younger than
  `max_age_s`; a price the API does not return keeps the offline figure and
  is named in `notes`.
- `SpotLauncher`: makes the cluster match a `TrainingPlan`, idempotently:
  it lists the cluster's instances by tag, launches only what is missing
  (spot workers, on-demand parameter servers), reports created vs reused,
  and terminates the instances it launched if a later launch of the same
  apply fails (roll back). `terminate` ends the cluster.
- `MetadataClient` / `RevocationWatcher`: poll each instance's
  `spot/instance-action` metadata with the IMDSv2 token flow (PUT a token,
  then GET with it); a notice is handled once: the instance is tagged
  revoked and terminated, the spot provisioner re-plans with the survivors
  kept and the revoked capacity removed (a constraint, not a hand edit), and
  the launcher adds the replacements. Clock and sleep are injected.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import json
import math
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, InvalidRegionError

from foundation.aws import aws_failure
from foundation.errors import StokeError
from foundation.files import atomic_write_text
from foundation.names import shown
from training.readers import catalog_from_dict, catalog_to_dict, offline_catalog
from training.spec import Catalog, TrainingPlan, TrainingSpec, with_overrides
from training.spot import SpotState, provision_spot

CLUSTER_TAG = "stoke-cluster"
ROLE_TAG = "stoke-role"
STATE_TAG = "stoke-state"
JOB_TAG = "stoke-job"
LIVE_STATES = ("pending", "running")
DEFAULT_IMAGE = "ami-12c6146b"  # any AMI id; real use passes the training image
PRICING_REGION = "us-east-1"  # the pricing API lives in us-east-1
REGION_NAMES = {
    "us-east-1": "US East (N. Virginia)",
    "us-east-2": "US East (Ohio)",
    "us-west-2": "US West (Oregon)",
    "eu-west-1": "EU (Ireland)",
}


class CloudError(StokeError, RuntimeError):
    """EC2 refused or failed a call; the message says which and why, `reason` what kind of failure."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


def _utcnow_iso(clock: Callable[[], float]) -> str:
    return _dt.datetime.fromtimestamp(clock(), _dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def make_clients(region: str, endpoint_url: str | None = None) -> tuple[Any, Any]:
    """(ec2, pricing) boto3 clients; `endpoint_url` points both at a test server (moto).

    A region or endpoint botocore refuses before any request (``InvalidRegionError``, "Invalid endpoint")
    is a `CloudError` with reason "region" or "endpoint"."""
    config = Config(retries={"max_attempts": 2, "mode": "standard"}, connect_timeout=5, read_timeout=20)
    try:
        ec2 = boto3.client("ec2", region_name=region, endpoint_url=endpoint_url, config=config)
        pricing = boto3.client("pricing", region_name=PRICING_REGION, endpoint_url=endpoint_url, config=config)
    except InvalidRegionError:
        raise CloudError(f"region {shown(region)} is not an AWS region name", reason="region") from None
    except ValueError:  # botocore: "Invalid endpoint: URL" (also for an empty region)
        if endpoint_url is None:
            raise CloudError(f"region {shown(region)} is not an AWS region name", reason="region") from None
        raise CloudError(f"endpoint URL {shown(endpoint_url)} is not a URL", reason="endpoint") from None
    return ec2, pricing


# --------------------------------------------------------------------------- prices


@dataclass
class PriceSource:
    """Offline catalog, or the same overlaid with live prices (cached with a timestamp)."""

    ec2: Any = None
    pricing: Any = None
    region: str = "us-east-1"
    cache_path: str | os.PathLike[str] | None = None
    max_age_s: float = 3600.0
    clock: Callable[[], float] = time.time
    notes: list[str] = field(default_factory=list)

    def offline(self) -> Catalog:
        return offline_catalog()

    def live(self, types: Iterable[str] | None = None) -> Catalog:
        base = offline_catalog()
        wanted = sorted(set(types) if types is not None else set(base.types))
        cached = self._read_cache(wanted)
        if cached is not None:
            return cached
        if self.ec2 is None:
            raise CloudError("live prices need EC2 credentials/endpoint; use --prices offline")
        prices = self._spot_prices(wanted)
        on_demand = self._on_demand_prices(wanted)
        merged = {}
        for name, inst in base.types.items():
            spot = prices.get(name, inst.spot_per_hour)
            od = on_demand.get(name, inst.on_demand_per_hour)
            if name in wanted and name not in prices:
                self.notes.append(f"no live spot price for {name}; kept the offline {inst.spot_per_hour}")
            if name in wanted and name not in on_demand:
                self.notes.append(f"no live on-demand price for {name}; kept the offline {inst.on_demand_per_hour}")
            merged[name] = dataclasses.replace(inst, spot_per_hour=spot, on_demand_per_hour=od)
        catalog = Catalog(types=merged, source="live", prices_as_of=_utcnow_iso(self.clock), region=self.region)
        self._write_cache(catalog, wanted)
        return catalog

    def _spot_prices(self, types: list[str]) -> dict[str, float]:
        start = _dt.datetime.fromtimestamp(self.clock(), _dt.UTC)
        try:
            pages = self.ec2.get_paginator("describe_spot_price_history").paginate(
                InstanceTypes=types, ProductDescriptions=["Linux/UNIX", "Linux/UNIX (Amazon VPC)"], StartTime=start
            )
            history = [item for page in pages for item in page.get("SpotPriceHistory", [])]
        except (ClientError, BotoCoreError) as err:
            raise CloudError(f"describe_spot_price_history failed: {err}", aws_failure(err)) from None
        latest: dict[tuple[str, str], tuple[Any, float]] = {}
        for item in history:
            key = (item["InstanceType"], item.get("AvailabilityZone", ""))
            stamp = item.get("Timestamp")
            if key not in latest or (stamp is not None and latest[key][0] is not None and stamp > latest[key][0]):
                latest[key] = (stamp, float(item["SpotPrice"]))
        out: dict[str, float] = {}
        for (itype, _zone), (_stamp, price) in latest.items():
            out[itype] = min(price, out.get(itype, price))
        return out

    def _on_demand_prices(self, types: list[str]) -> dict[str, float]:
        if self.pricing is None:
            return {}
        location = REGION_NAMES.get(self.region, self.region)
        out: dict[str, float] = {}
        for itype in types:
            filters = [
                {"Type": "TERM_MATCH", "Field": f, "Value": v}
                for f, v in (
                    ("instanceType", itype),
                    ("location", location),
                    ("operatingSystem", "Linux"),
                    ("tenancy", "Shared"),
                    ("preInstalledSw", "NA"),
                    ("capacitystatus", "Used"),
                )
            ]
            try:
                response = self.pricing.get_products(ServiceCode="AmazonEC2", Filters=filters, MaxResults=10)
            except (ClientError, BotoCoreError) as err:
                self.notes.append(f"pricing API unavailable ({type(err).__name__}); on-demand prices are offline")
                return out
            price = parse_on_demand(response.get("PriceList", []))
            if price is not None:
                out[itype] = price
        return out

    def _read_cache(self, wanted: list[str]) -> Catalog | None:
        if self.cache_path is None:
            return None
        try:
            data = json.loads(Path(self.cache_path).read_text())
            fetched = float(data["fetched_at"])
            if data.get("region") != self.region or sorted(data.get("wanted", [])) != wanted:
                return None
            if self.clock() - fetched > self.max_age_s:
                return None
            catalog = catalog_from_dict(data["catalog"], str(self.cache_path), live=True)
        except (OSError, ValueError, KeyError, TypeError):
            return None
        self.notes.append(f"live prices from cache {self.cache_path} ({catalog.prices_as_of})")
        return catalog

    def _write_cache(self, catalog: Catalog, wanted: list[str]) -> None:
        if self.cache_path is None:
            return
        body = {
            "fetched_at": self.clock(),
            "region": self.region,
            "wanted": wanted,
            "catalog": catalog_to_dict(catalog),
        }
        atomic_write_text(self.cache_path, json.dumps(body, indent=1, sort_keys=True) + "\n")


def parse_on_demand(price_list: list[Any]) -> float | None:
    """Hourly USD price from the pricing API's PriceList (JSON strings), or None."""
    for raw in price_list:
        product = json.loads(raw) if isinstance(raw, str) else raw
        for term in product.get("terms", {}).get("OnDemand", {}).values():
            for dim in term.get("priceDimensions", {}).values():
                usd = dim.get("pricePerUnit", {}).get("USD")
                if usd is not None and dim.get("unit", "Hrs") in ("Hrs", "Hours") and float(usd) > 0:
                    return float(usd)
    return None


# --------------------------------------------------------------------------- launcher


@dataclass(frozen=True)
class CloudInstance:
    id: str
    type: str
    role: str  # "worker" or "ps"
    state: str
    revoked: bool
    launch_time: float


@dataclass(frozen=True)
class LaunchReport:
    created: tuple[str, ...]
    reused: tuple[str, ...]
    terminated: tuple[str, ...] = ()

    def summary(self) -> str:
        return f"created {len(self.created)}, reused {len(self.reused)}, terminated {len(self.terminated)}"


class SpotLauncher:
    """Makes the tagged cluster `cluster` match a plan; safe to repeat."""

    def __init__(
        self,
        ec2: Any,
        cluster: str,
        *,
        image_id: str = DEFAULT_IMAGE,
        subnet_id: str | None = None,
        key_name: str | None = None,
    ):
        self.ec2 = ec2
        self.cluster = cluster
        self.image_id = image_id
        self.subnet_id = subnet_id
        self.key_name = key_name

    def instances(self, *, include_revoked: bool = False) -> list[CloudInstance]:
        """The cluster's pending/running instances (revoked ones only when asked)."""
        filters = [
            {"Name": f"tag:{CLUSTER_TAG}", "Values": [self.cluster]},
            {
                "Name": "instance-state-name",
                "Values": list(LIVE_STATES)
                + (["shutting-down", "terminated", "stopping", "stopped"] if include_revoked else []),
            },
        ]
        try:
            pages = self.ec2.get_paginator("describe_instances").paginate(Filters=filters)
            found = []
            for page in pages:
                for reservation in page.get("Reservations", []):
                    for inst in reservation.get("Instances", []):
                        tags = {t["Key"]: t["Value"] for t in inst.get("Tags", [])}
                        revoked = tags.get(STATE_TAG) == "revoked"
                        if revoked and not include_revoked:
                            continue
                        launched = inst.get("LaunchTime")
                        found.append(
                            CloudInstance(
                                id=inst["InstanceId"],
                                type=inst["InstanceType"],
                                role=tags.get(ROLE_TAG, "worker"),
                                state=inst["State"]["Name"],
                                revoked=revoked,
                                launch_time=launched.timestamp() if hasattr(launched, "timestamp") else 0.0,
                            )
                        )
        except (ClientError, BotoCoreError) as err:
            raise CloudError(f"describe_instances failed: {err}", aws_failure(err)) from None
        return sorted(found, key=lambda i: i.id)

    def desired(self, plan: TrainingPlan) -> dict[tuple[str, str], int]:
        want = {(t, "worker"): c for t, c in plan.counts if c > 0}
        if plan.ps_count > 0 and plan.ps_type:
            want[(plan.ps_type, "ps")] = plan.ps_count
        return want

    def apply(self, plan: TrainingPlan) -> LaunchReport:
        """Launch what the plan lacks; reuse what runs. Rolls back this call's launches on failure."""
        if not plan.feasible:
            raise CloudError(f"plan for {plan.job!r} is infeasible ({plan.reason}); nothing to launch")
        known = self.instances(include_revoked=True)
        running = [i for i in known if i.state in LIVE_STATES and not i.revoked]
        created: list[str] = []
        reused: list[str] = []
        try:
            for (itype, role), count in sorted(self.desired(plan).items()):
                have = [i for i in running if i.type == itype and i.role == role]
                reused.extend(i.id for i in have[:count])
                missing = count - len(have)
                if missing > 0:
                    # the idempotency token names every instance this cluster ever had of the kind, revoked
                    # and terminated ones included: a launch that replaces revoked workers is a new request
                    # (EC2 would answer a repeated token with the old, terminated instances)
                    history = [i.id for i in known if i.type == itype and i.role == role]
                    created.extend(self._launch(itype, role, missing, plan.job, history))
        except CloudError:
            if created:
                self._terminate(created)
            raise
        return LaunchReport(created=tuple(created), reused=tuple(reused))

    def _launch(self, itype: str, role: str, count: int, job: str, history: list[str]) -> list[str]:
        token = hashlib.sha256(
            f"{self.cluster}|{itype}|{role}|{count}|{','.join(sorted(history))}".encode()
        ).hexdigest()[:32]
        tags = [
            {"Key": CLUSTER_TAG, "Value": self.cluster},
            {"Key": ROLE_TAG, "Value": role},
            {"Key": JOB_TAG, "Value": job},
            {"Key": STATE_TAG, "Value": "active"},
        ]
        kwargs: dict[str, Any] = dict(
            ImageId=self.image_id,
            InstanceType=itype,
            MinCount=count,
            MaxCount=count,
            ClientToken=token,
            TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
        )
        if role == "worker":
            kwargs["InstanceMarketOptions"] = {
                "MarketType": "spot",
                "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
            }
        if self.subnet_id:
            kwargs["SubnetId"] = self.subnet_id
        if self.key_name:
            kwargs["KeyName"] = self.key_name
        try:
            response = self.ec2.run_instances(**kwargs)
        except (ClientError, BotoCoreError) as err:
            raise CloudError(f"run_instances {count} x {itype} ({role}) failed: {err}", aws_failure(err)) from None
        return [i["InstanceId"] for i in response.get("Instances", [])]

    def mark_revoked(self, instance_ids: list[str]) -> None:
        if not instance_ids:
            return
        try:
            self.ec2.create_tags(Resources=instance_ids, Tags=[{"Key": STATE_TAG, "Value": "revoked"}])
        except (ClientError, BotoCoreError) as err:
            raise CloudError(f"create_tags failed: {err}", aws_failure(err)) from None

    def _terminate(self, ids: list[str]) -> list[str]:
        if not ids:
            return []
        try:
            self.ec2.terminate_instances(InstanceIds=ids)
        except (ClientError, BotoCoreError) as err:
            raise CloudError(f"terminate_instances failed: {err}", aws_failure(err)) from None
        return ids

    def terminate(self, ids: list[str] | None = None) -> LaunchReport:
        """Terminate the given instances, or the whole cluster; repeating terminates nothing more."""
        live = {i.id for i in self.instances(include_revoked=True) if i.state in LIVE_STATES}
        targets = sorted(live if ids is None else live & set(ids))
        return LaunchReport(created=(), reused=(), terminated=tuple(self._terminate(targets)))


# --------------------------------------------------------------------------- revocations


class MetadataClient:
    """IMDSv2: PUT /latest/api/token, then GET metadata with the token (refreshed on 401 or expiry)."""

    def __init__(
        self, base_url: str, *, ttl_s: int = 21600, timeout_s: float = 2.0, clock: Callable[[], float] = time.monotonic
    ):
        self.base_url = base_url.rstrip("/")
        self.ttl_s = ttl_s
        self.timeout_s = timeout_s
        self.clock = clock
        self._token: str | None = None
        self._expires = 0.0
        # the metadata service is link-local: never through an http(s)_proxy, which would answer for it
        # (a proxy's "HTTP 500" is what an operator saw), as the AWS SDKs do for IMDS
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def _unavailable(self, what: str, detail: str) -> CloudError:
        return CloudError(
            f"instance metadata at {self.base_url} is not available ({what}: {detail}); `train watch` reads each "
            f"spot worker's interruption notice there (IMDSv2, only reachable from inside EC2)",
            reason="metadata",
        )

    def _fetch_token(self) -> str:
        req = urllib.request.Request(
            f"{self.base_url}/latest/api/token",
            method="PUT",
            headers={"X-aws-ec2-metadata-token-ttl-seconds": str(self.ttl_s)},
        )
        try:
            with self._opener.open(req, timeout=self.timeout_s) as resp:
                body: bytes = resp.read()
        except urllib.error.HTTPError as err:
            raise self._unavailable("token request", f"HTTP {err.code}") from None
        except (urllib.error.URLError, OSError) as err:
            raise self._unavailable("token request", str(getattr(err, "reason", err))) from None
        token = body.decode()
        self._token, self._expires = token, self.clock() + self.ttl_s - 60
        return token

    def get(self, path: str) -> str | None:
        """Body of a metadata path, or None on 404 (no such item, e.g. no interruption notice)."""
        for attempt in range(2):
            if self._token is None or self.clock() >= self._expires:
                self._fetch_token()
            req = urllib.request.Request(
                f"{self.base_url}/latest/meta-data/{path}", headers={"X-aws-ec2-metadata-token": self._token or ""}
            )
            try:
                with self._opener.open(req, timeout=self.timeout_s) as resp:
                    page: bytes = resp.read()
                    return page.decode()
            except urllib.error.HTTPError as err:
                if err.code == 404:
                    return None
                if err.code == 401 and attempt == 0:
                    self._token = None
                    continue
                raise self._unavailable(path, f"HTTP {err.code}") from None
            except (urllib.error.URLError, OSError) as err:
                raise self._unavailable(path, str(getattr(err, "reason", err))) from None
        return None

    def instance_action(self) -> dict[str, Any] | None:
        body = self.get("spot/instance-action")
        if body is None:
            return None
        try:
            notice = json.loads(body)
        except json.JSONDecodeError:
            raise CloudError(f"metadata spot/instance-action is not JSON: {body[:80]!r}") from None
        return notice if isinstance(notice, dict) else None


@dataclass(frozen=True)
class RevocationResult:
    revoked: tuple[str, ...]
    plan: TrainingPlan | None
    launch: LaunchReport | None


class RevocationWatcher:
    """Polls the instance-action metadata of every worker; on a notice, re-plans and replaces.

    `metadata_url` is a base URL, or a template containing ``{instance_id}``
    (one endpoint per instance, e.g. a metadata relay). `elapsed_s` of the
    job is now minus the earliest launch time of the cluster.
    """

    def __init__(
        self,
        launcher: SpotLauncher,
        spec: TrainingSpec,
        plan: TrainingPlan,
        metadata_url: str,
        *,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        interval_s: float = 10.0,
    ):
        self.launcher = launcher
        self.spec = spec
        self.plan = plan
        self.metadata_url = metadata_url
        self.clock = clock
        self.sleep = sleep
        self.interval_s = interval_s
        self._clients: dict[str, MetadataClient] = {}
        self.watched = 0  # live spot workers at the last poll
        self.job_started: float | None = None  # earliest launch time seen

    def training_progress(self) -> tuple[float, float]:
        """(seconds the job has run, its predicted run time): elapsed since the cluster's earliest launch."""
        elapsed = max(0.0, self.clock() - self.job_started) if self.job_started is not None else 0.0
        return elapsed, self.plan.predicted_time_s

    def _client(self, instance_id: str) -> MetadataClient:
        url = self.metadata_url.replace("{instance_id}", instance_id)
        if url not in self._clients:
            self._clients[url] = MetadataClient(url, clock=self.clock)
        return self._clients[url]

    def poll(self) -> dict[str, dict[str, Any]]:
        """Notices of the cluster's live spot workers: {instance_id: notice}."""
        notices = {}
        instances = self.launcher.instances()
        self.watched = sum(1 for i in instances if i.role == "worker" and i.state in LIVE_STATES)
        started = [i.launch_time for i in instances if i.launch_time]
        if started:
            self.job_started = min(self.job_started or math.inf, *started)
        for inst in instances:
            if inst.role != "worker" or inst.state not in LIVE_STATES:
                continue
            try:
                notice = self._client(inst.id).instance_action()
            except CloudError as err:
                raise CloudError(f"worker {inst.id}: {err}", reason=err.reason) from None
            if notice:
                notices[inst.id] = notice
        return notices

    def handle(self, notices: Mapping[str, Mapping[str, Any]]) -> RevocationResult:
        """Tag the noticed instances revoked, terminate them, re-plan with survivors, launch replacements."""
        ids = sorted(notices)
        if not ids:
            return RevocationResult(revoked=(), plan=None, launch=None)
        self.launcher.mark_revoked(ids)
        self.launcher.terminate(ids)
        return self.replan(ids)

    def replan(self, revoked_now: list[str] | tuple[str, ...] = ()) -> RevocationResult:
        everyone = self.launcher.instances(include_revoked=True)
        survivors = [i for i in everyone if not i.revoked and i.role == "worker" and i.state in LIVE_STATES]
        revoked = [i for i in everyone if i.revoked and i.role == "worker"]
        names = {w.type for w in self.spec.workers}
        existing: dict[str, int] = {}
        for i in survivors:
            if i.type in names:
                existing[i.type] = existing.get(i.type, 0) + 1
        lost: dict[str, int] = {}
        for i in revoked:
            if i.type in names:
                lost[i.type] = lost.get(i.type, 0) + 1
        started = min((i.launch_time for i in everyone if i.launch_time), default=self.clock())
        elapsed = max(0.0, self.clock() - started)
        predicted = self.plan.predicted_time_s if self.plan.predicted_time_s > 0 else float("inf")
        remaining = max(0.05, 1.0 - elapsed / predicted) if predicted != float("inf") else 1.0
        spec = with_overrides(self.spec, deadline_s=max(1.0, self.spec.deadline_s - elapsed))
        new_plan = provision_spot(spec, SpotState(existing=existing, revoked=lost, remaining=remaining, replan=True))
        launch = self.launcher.apply(new_plan) if new_plan.feasible else None
        if new_plan.feasible:
            self.plan = dataclasses.replace(new_plan, predicted_time_s=new_plan.predicted_time_s + elapsed)
        return RevocationResult(revoked=tuple(revoked_now), plan=new_plan, launch=launch)

    def run(
        self,
        *,
        max_polls: int | None = None,
        on_event: Callable[[RevocationResult], None] | None = None,
        on_poll: Callable[[int], None] | None = None,
    ) -> int:
        """Poll every `interval_s` (injected sleep) until `max_polls`; returns how many notices were handled.

        `on_event(result)` follows each handled notice; `on_poll(polls)` each poll."""
        handled, polls = 0, 0
        while max_polls is None or polls < max_polls:
            notices = self.poll()
            polls += 1
            if notices:
                result = self.handle(notices)
                handled += len(result.revoked)
                if on_event is not None:
                    on_event(result)
            if on_poll is not None:
                on_poll(polls)
            if max_polls is None or polls < max_polls:
                self.sleep(self.interval_s)
        return handled
