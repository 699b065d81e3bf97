"""S3 backend (AWS S3, MinIO, Ceph, any S3-compatible server) through boto3.

Endpoint, region and credentials come from the standard boto3 chain
(environment, ``~/.aws``, instance roles; ``AWS_ENDPOINT_URL`` included) unless
an explicit ``endpoint_url`` is given. Conditional writes use S3's
``If-None-Match: *`` and ``If-Match: <etag>`` on PutObject. Large objects go
up in parts from a stream (boto3's managed transfer) and come down in ranges
straight into the caller's buffer. Network failures are retried a bounded
number of times, then reported as :class:`StoreUnavailable`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any, BinaryIO

from .base import StoreConflict, StoreError, StoreUnavailable

__all__ = ["S3Backend"]

PART_BYTES = 16 * 2**20


_SESSION: Any = None
_SESSION_LOCK = threading.Lock()


def _client(**kwargs: Any) -> Any:
    """An S3 client from one shared boto3 session (a session is costly to build;
    sessions are not thread-safe, clients are, so clients are made under a lock)."""
    global _SESSION
    with _SESSION_LOCK:
        if _SESSION is None:
            import boto3

            _SESSION = boto3.session.Session()
        return _SESSION.client("s3", **kwargs)


class S3Backend:
    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        max_attempts: int = 3,
        connect_timeout: float = 3.0,
        read_timeout: float = 30.0,
    ) -> None:
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        self.bucket = bucket
        self.prefix = prefix.strip("/")
        config = Config(
            retries={"max_attempts": max_attempts, "mode": "standard"},
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            region_name=region,
        )
        self.endpoint = endpoint_url
        self.client = _client(endpoint_url=endpoint_url, config=config)
        self.transfer = TransferConfig(
            multipart_threshold=PART_BYTES, multipart_chunksize=PART_BYTES, max_concurrency=4, use_threads=True
        )

    def describe(self) -> str:
        where = f" at {self.endpoint}" if self.endpoint else ""
        return f"s3://{self.bucket}/{self.prefix}{where}"

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _call(self, what: str, fn: Any, **kwargs: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

        try:
            return fn(**kwargs)
        except NoCredentialsError:
            raise StoreError(
                f"{self.describe()}: no AWS credentials found (set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
                "AWS_PROFILE, or an instance role)"
            ) from None
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("NoSuchKey", "404", "NotFound"):
                raise KeyError(kwargs.get("Key", what)) from None
            if code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412):
                raise StoreConflict(f"{self.describe()}: {what} lost a race with another writer") from None
            if code == "NoSuchBucket":
                raise StoreError(f"{self.describe()}: bucket {self.bucket!r} does not exist") from None
            if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
                raise StoreError(f"{self.describe()}: access denied for {what} ({code})") from None
            raise StoreError(f"{self.describe()}: {what} failed ({code or status}: {exc})") from None
        except BotoCoreError as exc:
            raise StoreUnavailable(
                f"{self.describe()}: {what} failed after retries: {type(exc).__name__}: {exc}"
            ) from None

    def read(self, key: str) -> tuple[bytes, str]:
        r = self._call(f"read {key}", self.client.get_object, Bucket=self.bucket, Key=self._key(key))
        return self._body(r, key), r["ETag"]

    def _body(self, response: dict[str, Any], key: str) -> bytes:
        from botocore.exceptions import BotoCoreError

        try:
            return response["Body"].read()
        except BotoCoreError as exc:
            raise StoreUnavailable(f"{self.describe()}: reading {key} broke off: {exc}") from None

    def read_into(self, key: str, buffer: memoryview) -> None:
        """Ranged GETs written straight into ``buffer``: memory stays one copy."""
        size = len(buffer)
        for start in range(0, size, PART_BYTES):
            end = min(size, start + PART_BYTES) - 1
            r = self._call(
                f"read {key}",
                self.client.get_object,
                Bucket=self.bucket,
                Key=self._key(key),
                Range=f"bytes={start}-{end}",
            )
            body = r["Body"]
            pos = start
            while pos <= end:
                chunk = body.read(min(1 << 20, end + 1 - pos))
                if not chunk:
                    raise StoreUnavailable(f"{self.describe()}: reading {key} ended early at byte {pos}")
                buffer[pos : pos + len(chunk)] = chunk
                pos += len(chunk)

    def write(self, key: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None) -> str:
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": self._key(key), "Body": data}
        if if_none_match:
            kwargs["IfNoneMatch"] = "*"
        if if_match is not None:
            kwargs["IfMatch"] = if_match
        return self._call(f"write {key}", self.client.put_object, **kwargs)["ETag"]

    def upload(self, key: str, stream: BinaryIO, size: int) -> None:
        from boto3.exceptions import S3UploadFailedError

        try:
            self._call(
                f"upload {key}",
                self.client.upload_fileobj,
                Fileobj=stream,
                Bucket=self.bucket,
                Key=self._key(key),
                Config=self.transfer,
            )
        except S3UploadFailedError as exc:
            raise StoreUnavailable(f"{self.describe()}: upload of {key} failed: {exc}") from None

    def exists(self, key: str) -> bool:
        try:
            self._call(f"stat {key}", self.client.head_object, Bucket=self.bucket, Key=self._key(key))
        except KeyError:
            return False
        return True

    def list(self, prefix: str) -> Iterator[str]:
        full = self._key(prefix)
        token: dict[str, str] = {}
        while True:
            what = f"list {prefix}" if prefix else "list"
            r = self._call(what, self.client.list_objects_v2, Bucket=self.bucket, Prefix=full, **token)
            for obj in r.get("Contents", []):
                key = obj["Key"]
                yield key[len(self.prefix) + 1 :] if self.prefix else key
            if not r.get("IsTruncated"):
                return
            token = {"ContinuationToken": r["NextContinuationToken"]}

    def delete(self, keys: Sequence[str]) -> None:
        for i in range(0, len(keys), 1000):
            objects = [{"Key": self._key(k)} for k in keys[i : i + 1000]]
            self._call("delete", self.client.delete_objects, Bucket=self.bucket, Delete={"Objects": objects})
