"""Shards in S3 (or any S3-compatible store): listing, whole-object fetches and ranged reads.

One boto3 client per process, made on first use (a client never crosses a fork), reused for every
read. Credentials, region and endpoint come the standard AWS way (environment, config files,
instance roles) unless :class:`S3Options` names them; botocore's "standard" retry mode retries
transient failures (5xx, throttling, resets, timeouts) a bounded number of times with backoff.
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class S3Options:
    """How to reach the store; None means the standard AWS default for that setting."""

    endpoint_url: str | None = None
    region: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None
    max_attempts: int = 5
    #: Seconds to wait for a connection and for data on it, per attempt (botocore's defaults are 60).
    connect_timeout: float = 10.0
    read_timeout: float = 60.0


def split_url(url: str) -> tuple[str, str]:
    """``s3://bucket/key`` as (bucket, key)."""
    rest = url[len("s3://"):]
    bucket, _, key = rest.partition("/")
    if not bucket or not key:
        raise ValueError(f"shard URL {url!r} must look like s3://bucket/key")
    return bucket, key


_clients: dict[tuple[int, S3Options], Any] = {}


def client(options: S3Options):
    """This process's client for ``options``."""
    key = (os.getpid(), options)
    found = _clients.get(key)
    if found is None:
        try:
            import boto3
            from botocore.config import Config
        except ImportError as exc:
            raise ImportError("s3:// shards need boto3: pip install 'hydrax[s3]'") from exc
        found = boto3.client(
            "s3",
            endpoint_url=options.endpoint_url,
            region_name=options.region,
            aws_access_key_id=options.access_key_id,
            aws_secret_access_key=options.secret_access_key,
            aws_session_token=options.session_token,
            config=Config(retries={"max_attempts": options.max_attempts, "mode": "standard"},
                          connect_timeout=options.connect_timeout, read_timeout=options.read_timeout),
        )
        _clients[key] = found
    return found


def _explain(url: str, exc: Exception, permission: str, where: str = "") -> Exception:
    """A clear error for a failed request on ``url`` that needed the IAM action ``permission``."""
    code = getattr(exc, "response", {}).get("Error", {}).get("Code", "") if hasattr(exc, "response") else ""
    if code in ("NoSuchKey", "404", "NotFound", "NoSuchBucket"):
        return FileNotFoundError(f"shard {url!r} does not exist ({code}); check the bucket and key")
    if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken"):
        return PermissionError(f"shard {url!r}{where}: the store refused the credentials ({code}); check the access key, secret and session token")
    if code in ("AccessDenied", "403", "Forbidden"):
        return PermissionError(f"shard {url!r}{where}: access denied ({code}); the credentials need {permission} on it (check the IAM and bucket policies)")
    return OSError(f"shard {url!r}{where}: the request failed after retries: {exc}")


def head(url: str, options: S3Options) -> tuple[int, int]:
    """(size in bytes, last-modified time in ns) of the object at ``url``."""
    bucket, key = split_url(url)
    try:
        reply = client(options).head_object(Bucket=bucket, Key=key)
    except Exception as exc:
        raise _explain(url, exc, "s3:GetObject") from exc
    return int(reply["ContentLength"]), int(reply["LastModified"].timestamp() * 1e9)


def fetch(url: str, options: S3Options, offset: int = 0, size: int | None = None) -> bytes:
    """The bytes of ``url`` (the whole object, or ``size`` bytes from ``offset``: one ranged GET)."""
    bucket, key = split_url(url)
    request: dict[str, Any] = {"Bucket": bucket, "Key": key}
    if size is not None:
        if size == 0:
            return b""
        request["Range"] = f"bytes={offset}-{offset + size - 1}"
    try:
        body = client(options).get_object(**request)["Body"]
        try:
            data = body.read()
        finally:
            body.close()
    except Exception as exc:
        raise _explain(url, exc, "s3:GetObject", "" if size is None else f" at byte offset {offset}") from exc
    if size is not None and len(data) != size:
        raise OSError(f"shard {url!r}: asked for {size} bytes at offset {offset}, got {len(data)} (the object changed?)")
    return data


def glob(pattern: str, options: S3Options) -> list[str]:
    """The objects matching the shell pattern ``pattern`` (``s3://bucket/prefix*.tar``), sorted."""
    bucket, key_pattern = split_url(pattern)
    prefix = key_pattern[: min((key_pattern.find(c) for c in "*?[" if c in key_pattern), default=len(key_pattern))]
    found = []
    try:
        for page in client(options).get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            found += [item["Key"] for item in page.get("Contents", []) if fnmatch.fnmatchcase(item["Key"], key_pattern)]
    except Exception as exc:
        raise _explain(pattern, exc, "s3:ListBucket") from exc
    return [f"s3://{bucket}/{key}" for key in sorted(found)]
