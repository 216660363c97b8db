"""Model repository stores: a local directory and S3, behind one interface.

The one module that imports boto3. A store holds files under relative POSIX
paths (``model/config.pbtxt``, ``model/1/model.py``); `sync` makes a store
hold exactly a local repository's files, by checksum (MD5):

- only changed or new files are written; identical ones are left alone;
- within a model, payload files (versions, code, weights) go first and
  ``config.pbtxt`` last, so a reader never sees a config that points at files
  not there yet (a new model becomes visible only once complete);
- stale files are deleted after every upload; a model that disappears loses
  its ``config.pbtxt`` first, so it is never half visible.

Files are streamed, never read whole into memory, so model weights of any size
sync: checksums are computed chunk by chunk, and S3 transfers go through boto3's
transfer manager (multipart above `S3Store`'s multipart_threshold, at most
``max_concurrency x multipart_chunksize`` bytes in flight). A single-part
upload's ETag is its MD5; a multipart ETag is not, so every upload also carries
its MD5 in the object metadata (``x-amz-meta-stoke-md5``), which `listing` reads
for the objects whose ETag is not a plain MD5.

S3 credentials and region come from the standard AWS environment
(``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``,
profiles); the endpoint from ``endpoint_url`` (or ``AWS_ENDPOINT_URL``, or the
``s3://host:port/bucket/path`` form Triton uses for a custom endpoint).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import boto3
from boto3.exceptions import S3UploadFailedError
from boto3.s3.transfer import TransferConfig
from botocore.exceptions import BotoCoreError, ClientError

from foundation.aws import aws_failure
from foundation.errors import StokeError
from foundation.files import atomic_replace, atomic_write_bytes

CONFIG_NAME = "config.pbtxt"
#: Object metadata key holding a file's MD5 (S3 returns it as x-amz-meta-stoke-md5).
MD5_METADATA = "stoke-md5"
COPY_CHUNK = 1 << 20
_PLAIN_MD5 = re.compile(r"^[0-9a-f]{32}$")
IGNORED_PARTS = {"__pycache__", ".git", ".ipynb_checkpoints"}


class StoreError(StokeError, RuntimeError):
    """A repository store cannot be read or written; `reason` says what kind of failure (`aws_failure`)."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class SyncReport:
    uploaded: tuple[str, ...]
    deleted: tuple[str, ...]
    unchanged: tuple[str, ...]

    @property
    def changed(self) -> bool:
        return bool(self.uploaded or self.deleted)


def _md5() -> hashlib._Hash:
    return hashlib.md5(usedforsecurity=False)


def md5_hex(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def md5_file(path: str | os.PathLike[str]) -> str:
    """MD5 of a file, read in chunks (a multi-GB weight file never sits in memory)."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, _md5).hexdigest()


def scan_local(root: str | os.PathLike[str]) -> dict[str, str]:
    """{relative POSIX path: md5} of a local repository (temp files and caches skipped)."""
    base = Path(root)
    if not base.is_dir():
        raise StoreError(f"{base}: model repository directory not found")
    out: dict[str, str] = {}
    for path in sorted(base.rglob("*")):
        rel = path.relative_to(base)
        if not path.is_file() or any(p in IGNORED_PARTS or p.startswith(".") for p in rel.parts):
            continue
        if path.suffix == ".pyc":
            continue
        out[rel.as_posix()] = md5_file(path)
    return out


def upload_order(paths: list[str]) -> list[str]:
    """Payload files before each model's config.pbtxt (deeper paths first, config last)."""
    return sorted(paths, key=lambda p: (PurePosixPath(p).name == CONFIG_NAME, p))


def delete_order(paths: list[str]) -> list[str]:
    """config.pbtxt first, so a disappearing model is hidden before its files go."""
    return sorted(paths, key=lambda p: (PurePosixPath(p).name != CONFIG_NAME, p))


class RepoStore(ABC):
    """A model repository somewhere; paths are relative POSIX paths."""

    url: str

    @abstractmethod
    def listing(self) -> dict[str, str]:
        """{path: md5} of every file in the store."""

    @abstractmethod
    def read_bytes(self, path: str, max_bytes: int | None = None) -> bytes:
        """The stored `path`, or its first `max_bytes` bytes when given (the rest is never read)."""

    @abstractmethod
    def write_bytes(self, path: str, data: bytes) -> None: ...

    @abstractmethod
    def put_file(self, path: str, source: Path, md5: str) -> None:
        """Store the local file `source` (checksum `md5`) under `path`, streamed."""

    @abstractmethod
    def get_file(self, path: str, target: Path) -> None:
        """Copy the stored `path` into the local file `target`, streamed; `target` changes only when complete."""

    @abstractmethod
    def delete(self, path: str) -> None: ...

    def read_text(self, path: str) -> str:
        return self.read_bytes(path).decode("utf-8")

    def sync(self, local_dir: str | os.PathLike[str], *, dry_run: bool = False) -> SyncReport:
        """Make the store hold exactly the files of `local_dir`, writing only what changed.

        `dry_run`: compare only, and report what would be uploaded and deleted."""
        wanted = scan_local(local_dir)
        present = self.listing()
        changed = [p for p, digest in wanted.items() if present.get(p) != digest]
        stale = [p for p in present if p not in wanted]
        for path in upload_order(changed) if not dry_run else ():
            self.put_file(path, Path(local_dir) / path, wanted[path])
        for path in delete_order(stale) if not dry_run else ():
            self.delete(path)
        unchanged = sorted(p for p in wanted if p not in changed)
        return SyncReport(tuple(upload_order(changed)), tuple(delete_order(stale)), tuple(unchanged))

    def download(self, local_dir: str | os.PathLike[str]) -> SyncReport:
        """The reverse of `sync`: make `local_dir` hold exactly the store's files."""
        local = LocalStore(local_dir, create=True)
        wanted, present = self.listing(), local.listing()
        changed = [p for p, digest in wanted.items() if present.get(p) != digest]
        stale = [p for p in present if p not in wanted]
        for path in upload_order(changed):
            self.get_file(path, local.root / _check_rel(path))
        for path in delete_order(stale):
            local.delete(path)
        return SyncReport(
            tuple(upload_order(changed)),
            tuple(delete_order(stale)),
            tuple(sorted(p for p in wanted if p not in changed)),
        )


def _check_rel(path: str) -> str:
    rel = PurePosixPath(path)
    if rel.is_absolute() or ".." in rel.parts or not rel.parts:
        raise StoreError(f"{path!r}: store paths must be relative and stay inside the repository")
    return rel.as_posix()


class LocalStore(RepoStore):
    """A model repository directory; every write is a temp file + rename."""

    def __init__(self, root: str | os.PathLike[str], *, create: bool = False) -> None:
        self.root = Path(root)
        if create:
            self.root.mkdir(parents=True, exist_ok=True)
        self.url = str(self.root)

    def listing(self) -> dict[str, str]:
        if not self.root.exists():
            return {}
        return scan_local(self.root)

    def read_bytes(self, path: str, max_bytes: int | None = None) -> bytes:
        try:
            with open(self.root / _check_rel(path), "rb") as f:
                return f.read(-1 if max_bytes is None else max_bytes)
        except OSError as err:
            raise StoreError(f"{self.root / path}: cannot read ({err.strerror})") from None

    def write_bytes(self, path: str, data: bytes) -> None:
        atomic_write_bytes(self.root / _check_rel(path), data)  # the mode open() would give, not 0600

    def put_file(self, path: str, source: Path, md5: str) -> None:
        with open(source, "rb") as src, atomic_replace(self.root / _check_rel(path)) as out:
            shutil.copyfileobj(src, out, COPY_CHUNK)

    def get_file(self, path: str, target: Path) -> None:
        source = self.root / _check_rel(path)
        try:
            with open(source, "rb") as src, atomic_replace(target) as out:
                shutil.copyfileobj(src, out, COPY_CHUNK)
        except FileNotFoundError:
            raise StoreError(f"{source}: cannot read (no such file)") from None

    def sync(self, local_dir: str | os.PathLike[str], *, dry_run: bool = False) -> SyncReport:
        _refuse_overlap(local_dir, self.root)
        return super().sync(local_dir, dry_run=dry_run)

    def download(self, local_dir: str | os.PathLike[str]) -> SyncReport:
        _refuse_overlap(self.root, local_dir)
        return super().download(local_dir)

    def delete(self, path: str) -> None:
        target = self.root / _check_rel(path)
        target.unlink(missing_ok=True)
        parent = target.parent
        while parent != self.root and parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()
            parent = parent.parent


_S3_URL = re.compile(r"^s3://(?P<rest>.+)$")
#: An S3 endpoint: http(s)://host[:port][/path] (a bracketed IPv6 host too).
_ENDPOINT_URL = re.compile(r"https?://(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(?::[0-9]{1,5})?(?:/[^\s]*)?")


def parse_s3_url(url: str, endpoint_url: str | None = None) -> tuple[str, str, str | None]:
    """(bucket, prefix, endpoint_url) of ``s3://bucket/prefix`` or ``s3://host:port/bucket/prefix``."""
    match = _S3_URL.match(url)
    if not match:
        raise StoreError(f"{url!r}: not an S3 URL; use s3://bucket/path or s3://host:port/bucket/path")
    parts = [p for p in match.group("rest").split("/") if p]
    if parts and re.fullmatch(r"[^/]+:\d+", parts[0]):
        host = parts.pop(0)
        endpoint_url = endpoint_url or f"http://{host}"
    if not parts:
        raise StoreError(f"{url!r}: the S3 URL names no bucket; use s3://bucket/path")
    bucket, prefix = parts[0], "/".join(parts[1:])
    if bucket != bucket.lower():
        raise StoreError(f"{url!r}: S3 bucket names must be lowercase ({bucket!r})")
    return bucket, prefix, endpoint_url or os.environ.get("AWS_ENDPOINT_URL") or None


def triton_s3_url(bucket: str, prefix: str, endpoint_url: str | None) -> str:
    """The ``--model-repository`` value Triton needs (a custom endpoint goes in the URL)."""
    path = "/".join(p for p in (bucket, prefix.strip("/")) if p)
    if endpoint_url:
        host = re.sub(r"^https?://", "", endpoint_url).rstrip("/")
        return f"s3://{host}/{path}"
    return f"s3://{path}"


class S3Store(RepoStore):
    """A model repository under ``s3://bucket/prefix`` (boto3; standard AWS credentials)."""

    def __init__(
        self,
        url: str,
        *,
        endpoint_url: str | None = None,
        client: object | None = None,
        multipart_threshold: int = 64 << 20,
        multipart_chunksize: int = 16 << 20,
        max_concurrency: int = 4,
    ) -> None:
        self.bucket, self.prefix, self.endpoint_url = parse_s3_url(url, endpoint_url)
        if self.endpoint_url is not None and not _ENDPOINT_URL.fullmatch(self.endpoint_url):
            # botocore raises a bare ValueError ("Invalid endpoint") for it: a traceback at the command line
            raise StoreError(
                f"endpoint {self.endpoint_url!r} is not an http(s) URL; give e.g. --endpoint-url "
                "http://127.0.0.1:9000 (or AWS_ENDPOINT_URL), or leave it out for AWS"
            )
        self.url = url
        self.client: Any = client or boto3.client("s3", endpoint_url=self.endpoint_url)
        # memory in flight per transfer is about max_concurrency x multipart_chunksize, whatever the file size
        self.transfer = TransferConfig(
            multipart_threshold=multipart_threshold,
            multipart_chunksize=multipart_chunksize,
            max_concurrency=max_concurrency,
        )

    @property
    def triton_url(self) -> str:
        return triton_s3_url(self.bucket, self.prefix, self.endpoint_url)

    def _key(self, path: str) -> str:
        rel = _check_rel(path)
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def create_bucket(self) -> None:
        try:
            self.client.create_bucket(Bucket=self.bucket)
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise StoreError(f"s3://{self.bucket}: cannot create bucket: {err}") from None

    def listing(self) -> dict[str, str]:
        out: dict[str, str] = {}
        prefix = f"{self.prefix}/" if self.prefix else ""
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
                for obj in page.get("Contents", []):
                    out[obj["Key"][len(prefix) :]] = self._md5_of(obj["Key"], obj["ETag"].strip('"'))
        except (ClientError, BotoCoreError) as err:
            raise StoreError(f"{self.url}: cannot list ({err})", aws_failure(err)) from None
        return out

    def _md5_of(self, key: str, etag: str) -> str:
        """The ETag when it is a plain MD5 (single-part upload), else the MD5 stored in the metadata."""
        if _PLAIN_MD5.match(etag):
            return etag
        metadata = self.client.head_object(Bucket=self.bucket, Key=key).get("Metadata", {})
        return metadata.get(MD5_METADATA, etag)  # no checksum recorded: never equal, so it is uploaded again

    def read_bytes(self, path: str, max_bytes: int | None = None) -> bytes:
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self._key(path))["Body"]
            try:
                return bytes(body.read(max_bytes))  # None: all of it
            finally:
                body.close()  # the rest of a capped read is not downloaded
        except (ClientError, BotoCoreError) as err:
            raise StoreError(f"{self.url}/{path}: cannot read ({err})", aws_failure(err)) from None

    def write_bytes(self, path: str, data: bytes) -> None:
        # one PUT is atomic on S3: readers see the old object or the new one, never half
        try:
            self.client.put_object(Bucket=self.bucket, Key=self._key(path), Body=data)
        except (ClientError, BotoCoreError) as err:
            raise StoreError(f"{self.url}/{path}: cannot write ({err})", aws_failure(err)) from None

    def put_file(self, path: str, source: Path, md5: str) -> None:
        try:
            self.client.upload_file(
                str(source),
                self.bucket,
                self._key(path),
                Config=self.transfer,
                ExtraArgs={"Metadata": {MD5_METADATA: md5}},
            )
        except (ClientError, BotoCoreError, S3UploadFailedError) as err:
            raise StoreError(f"{self.url}/{path}: cannot upload {source} ({err})", aws_failure(err)) from None

    def get_file(self, path: str, target: Path) -> None:
        try:
            with atomic_replace(target) as out:
                self.client.download_fileobj(self.bucket, self._key(path), out, Config=self.transfer)
        except (ClientError, BotoCoreError) as err:
            raise StoreError(f"{self.url}/{path}: cannot download ({err})", aws_failure(err)) from None

    def delete(self, path: str) -> None:
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self._key(path))
        except (ClientError, BotoCoreError) as err:
            raise StoreError(f"{self.url}/{path}: cannot delete ({err})", aws_failure(err)) from None


def _refuse_overlap(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
    """A copy from `source` into `target` makes `target` hold exactly `source`'s files, deleting the rest: when one
    folder holds the other, that deletes the source's own files (a sync of triton_repo/mlp_small into triton_repo
    left 2 of its 15 files)."""
    a, b = Path(source).resolve(), Path(target).resolve()
    if a == b or a.is_relative_to(b) or b.is_relative_to(a):
        raise StoreError(
            f"{source} and {target} overlap (one holds the other): making {target} hold exactly {source}'s files "
            "would delete files of the repository itself; give a destination outside it"
        )


def open_store(url: str, *, endpoint_url: str | None = None) -> RepoStore:
    """`S3Store` for ``s3://...``, `LocalStore` for a path; another URL scheme is refused (it was taken for a
    folder: `gs://bucket/p` wrote ./gs:/bucket/p)."""
    if url.startswith("s3://"):
        return S3Store(url, endpoint_url=endpoint_url)
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", url):
        raise StoreError(f"{url!r}: only s3:// URLs and local directories are model repository stores")
    return LocalStore(url)
