"""Real moto S3 server on loopback: checksum sync of a repository, and Triton serving from S3."""

from __future__ import annotations

import boto3
import pytest
from triton_helpers import infer

from agents.repo_store import S3Store, scan_local
from agents.triton import TritonFleet
from controller.messages import ModelAssignment

pytestmark = [pytest.mark.s3]


@pytest.fixture
def store(moto_server, request):
    bucket = request.node.name.lower().replace("_", "-")[:40].strip("-")
    s3 = S3Store(f"s3://{bucket}/models/prod", endpoint_url=moto_server)
    s3.create_bucket()
    return s3


def _keys(moto_server, bucket):
    client = boto3.client("s3", endpoint_url=moto_server)
    return sorted(o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", []))


def test_sync_uploads_only_changed_files_and_deletes_stale(store, moto_server, demo_repo_copy):
    first = store.sync(demo_repo_copy)
    files = scan_local(demo_repo_copy)
    assert sorted(first.uploaded) == sorted(files) and first.deleted == ()
    assert _keys(moto_server, store.bucket) == sorted(f"models/prod/{p}" for p in files)
    assert store.listing() == files  # ETag = MD5 of each file
    assert store.sync(demo_repo_copy).uploaded == ()  # nothing changed, nothing sent

    config = demo_repo_copy / "mlp_small" / "config.pbtxt"
    config.write_text(config.read_text().replace("max_batch_size: 32", "max_batch_size: 8"))
    (demo_repo_copy / "conv_medium" / "1" / "model.py").unlink()
    (demo_repo_copy / "conv_medium" / "config.pbtxt").unlink()
    (demo_repo_copy / "mlp_small" / "2").mkdir()
    (demo_repo_copy / "mlp_small" / "2" / "model.py").write_text(
        (demo_repo_copy / "mlp_small" / "1" / "model.py").read_text()
    )
    report = store.sync(demo_repo_copy)
    assert report.uploaded == ("mlp_small/2/model.py", "mlp_small/config.pbtxt")  # payload first, config last
    assert report.deleted == ("conv_medium/config.pbtxt", "conv_medium/1/model.py")  # hidden first
    assert "max_batch_size: 8" in store.read_text("mlp_small/config.pbtxt")
    assert store.listing() == scan_local(demo_repo_copy)


def test_download_mirrors_the_store(store, demo_repo_copy, tmp_path):
    store.sync(demo_repo_copy)
    first = store.download(tmp_path / "mirror")
    assert scan_local(tmp_path / "mirror") == scan_local(demo_repo_copy) and first.uploaded
    assert store.download(tmp_path / "mirror").uploaded == ()


@pytest.mark.triton
def test_triton_serves_from_s3(store, moto_server, demo_repo_copy, tmp_path):
    store.sync(demo_repo_copy)
    url = store.triton_url
    assert url.startswith("s3://127.0.0.1:") and url.endswith(f"/{store.bucket}/models/prod")
    fleet = TritonFleet(url, workdir=str(tmp_path / "work"), ready_timeout_s=60)
    try:
        a = ModelAssignment(
            workload="web",
            model="mlp_small",
            device=0,
            share_pct=100.0,
            batch=4,
            queue_delay_ms=1.0,
            slo_ms=50.0,
            rate_rps=10.0,
        )
        report = fleet.apply([a])
        assert report.started == ("web#0",) and report.errors == ()
        assert fleet.served_config("web#0").max_batch_size == 4
        assert fleet.served_config("web#0").parameters["max_supported_batch"].string_value == "128"  # base from S3
        assert infer(fleet.endpoint("web#0"), "mlp_small", batch=2).shape == (2, 16)
    finally:
        fleet.close()


def test_large_files_stream_through_multipart_and_still_sync_by_checksum(moto_server, demo_repo_copy, tmp_path):
    """A weight file above the multipart threshold: uploaded in parts, compared by the MD5 in its metadata.

    Memory: Python allocations during the upload and the download stay a fraction of the file
    (boto3 keeps about max_concurrency x chunk in flight); reading the file whole would cost all of it.
    """
    import os
    import tracemalloc

    from agents.repo_store import MD5_METADATA, md5_file

    mib = 1 << 20
    weights = demo_repo_copy / "mlp_small" / "1" / "weights.bin"
    with open(weights, "wb") as handle:
        for _ in range(48):
            handle.write(os.urandom(mib))
    store = S3Store(
        "s3://big-weights/models",
        endpoint_url=moto_server,
        multipart_threshold=6 * mib,
        multipart_chunksize=5 * mib,
        max_concurrency=2,
    )  # 5 MiB: S3's (and moto's) smallest part
    store.create_bucket()
    tracemalloc.start()
    try:
        report = store.sync(demo_repo_copy)
        upload_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        mirror = tmp_path / "mirror"
        store.download(mirror)
        download_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "mlp_small/1/weights.bin" in report.uploaded
    assert upload_peak < 16 * mib and download_peak < 16 * mib, (upload_peak / mib, download_peak / mib)

    head = store.client.head_object(Bucket="big-weights", Key="models/mlp_small/1/weights.bin")
    assert head["ETag"].strip('"').endswith("-10")  # 48 MiB in 5 MiB parts: multipart
    assert head["Metadata"][MD5_METADATA] == md5_file(weights)
    assert store.listing() == scan_local(demo_repo_copy)  # the multipart object's MD5, not its ETag
    assert store.sync(demo_repo_copy).uploaded == ()  # nothing changed, nothing sent
    assert scan_local(mirror) == scan_local(demo_repo_copy)
    assert os.stat(mirror / "mlp_small" / "1" / "weights.bin").st_mode & 0o777 == 0o666 & ~_umask()

    with open(weights, "r+b") as handle:  # one byte changes: sent again
        handle.seek(30 * mib)
        flipped = b"\xff" if handle.read(1) != b"\xff" else b"\0"
        handle.seek(30 * mib)  # the read moved past the byte: write over it, not over the next one
        handle.write(flipped)
    assert store.sync(demo_repo_copy).uploaded == ("mlp_small/1/weights.bin",)
    assert store.listing()["mlp_small/1/weights.bin"] == md5_file(weights)
    assert store.download(mirror).uploaded == ("mlp_small/1/weights.bin",)


def _umask() -> int:
    import os

    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_huge_config_on_s3_is_refused_without_downloading_it(store, demo_repo_copy, tmp_path):
    """The config size cap holds for a remote repository too: the fleet reads the cap + 1 byte, not 16 MiB."""
    import tracemalloc

    from controller.render import MAX_CONFIG_BYTES, RenderError

    config = demo_repo_copy / "mlp_small" / "config.pbtxt"
    config.write_text(config.read_text() + "#" * (16 << 20))
    store.sync(demo_repo_copy)
    assert len(store.read_bytes("mlp_small/config.pbtxt", 100)) == 100
    fleet = TritonFleet(store.triton_url, workdir=str(tmp_path / "work"))
    try:
        tracemalloc.start()
        try:
            with pytest.raises(RenderError, match=f"over the {MAX_CONFIG_BYTES} bytes"):
                fleet._default_base_config("mlp_small")
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 6 << 20, f"{peak / 2**20:.1f} MiB allocated reading a capped config"
    finally:
        fleet.close()
