"""Where a store lives: a local directory or an ``s3://bucket/prefix``, reached through one ``pyarrow.fs``
filesystem (for Parquet files and the store's marker) and one set of deltalake storage options (for the
commit log). Every other module takes paths from a :class:`Location`, so local and remote stores share
one code path.

Credentials and endpoint come from ``storage_options`` with the keys deltalake uses (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION``, ``AWS_ALLOW_HTTP``),
and for each key not given, from the environment variable of that name. Requests give up within seconds
(a few retries, short connect timeouts), so a wrong endpoint is an error, not minutes of waiting.

>>> locate("/tmp/store").uri, locate("/tmp/store").is_local
('/tmp/store', True)
>>> loc = locate("s3://bucket/runs/a", {"AWS_ENDPOINT_URL": "http://127.0.0.1:8333", "AWS_REGION": "us-east-1"})
>>> loc.bucket, loc.path("steps"), loc.uri_of("steps")
('bucket', 'bucket/runs/a/steps', 's3://bucket/runs/a/steps')
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import urlsplit

import pyarrow.fs as pafs

from trajstore.errors import InputError, StoreAccessError

S3_KEYS = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION",
           "AWS_ALLOW_HTTP")
CONNECT_TIMEOUT_S = 5
REQUEST_TIMEOUT_S = 60
RETRIES = 3
# deltalake's object store: conditional puts (If-Match) make concurrent commits safe without a lock service;
# its own retries bounded like pyarrow's
DELTA_DEFAULTS = {"conditional_put": "etag", "max_retries": str(RETRIES), "retry_timeout": "20s",
                  "connect_timeout": f"{CONNECT_TIMEOUT_S}s", "timeout": f"{REQUEST_TIMEOUT_S}s"}


@dataclass(frozen=True)
class Location:
    """A store's place: ``uri`` as given (normalized), the filesystem that reaches it, ``root`` (its path in
    that filesystem) and the storage options deltalake needs there."""

    uri: str
    fs: pafs.FileSystem = field(repr=False)
    root: str
    storage_options: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def is_local(self) -> bool:
        return isinstance(self.fs, pafs.LocalFileSystem)

    @property
    def bucket(self) -> str | None:
        return None if self.is_local else self.root.split("/", 1)[0]

    def path(self, *parts: str) -> str:
        """The path of ``parts`` below the root, in the filesystem."""
        return posixpath.join(self.root, *parts) if parts else self.root

    def uri_of(self, *parts: str) -> str:
        """The URI of ``parts`` below the root (a local path, or an ``s3://`` URI), for deltalake."""
        return self.path(*parts) if self.is_local else "s3://" + self.path(*parts)

    def child(self, *parts: str) -> Location:
        """The location of a folder below this one (with the same filesystem and options)."""
        return Location(self.uri_of(*parts), self.fs, self.path(*parts), self.storage_options)

    def relative(self, path: str) -> str:
        """``path`` (a path in the filesystem) relative to the root."""
        return posixpath.relpath(path, self.root)


def locate(uri: str | Path | Location, storage_options: Mapping[str, Any] | None = None) -> Location:
    """The location of ``uri``: a local directory (a path or ``file://``) or ``s3://bucket/prefix``."""
    if isinstance(uri, Location):
        return uri
    text = str(uri)
    if "://" not in text or text.startswith("file://"):
        if storage_options:
            raise InputError("storage_options: only for s3:// stores; a local directory takes none")
        root = os.path.abspath(os.path.expanduser(text.removeprefix("file://")))
        return Location(root, pafs.LocalFileSystem(), root)
    parts = urlsplit(text)
    if parts.scheme != "s3":
        raise InputError(f"uri: expected a local directory or s3://bucket/prefix, got {text!r} "
                         f"(scheme {parts.scheme!r} is not supported)")
    if not parts.netloc:
        raise InputError(f"uri: {text!r} names no bucket; expected s3://bucket/prefix")
    root = posixpath.join(parts.netloc, parts.path.strip("/")).rstrip("/")
    options = s3_options(storage_options)
    return Location(f"s3://{root}", s3_filesystem(options), root, {**DELTA_DEFAULTS, **options})


def s3_options(given: Mapping[str, Any] | None) -> dict[str, str]:
    """The AWS_* options: those given (any case), and for each one not given its environment variable."""
    options = {str(k).upper(): str(v) for k, v in (given or {}).items() if v is not None}
    unknown = sorted(k for k in options if k not in S3_KEYS and k.lower() not in DELTA_DEFAULTS)
    if unknown:
        raise InputError(f"storage_options: unknown key(s) {unknown}; expected some of {list(S3_KEYS)}")
    for key in S3_KEYS:
        if key not in options and os.environ.get(key):
            options[key] = os.environ[key]
    return {k if k in S3_KEYS else k.lower(): v for k, v in options.items()}


def s3_filesystem(options: Mapping[str, str]) -> pafs.S3FileSystem:
    """pyarrow's S3 filesystem for ``options`` (the AWS_* keys), with bounded timeouts and retries."""
    endpoint = options.get("AWS_ENDPOINT_URL")
    kwargs: dict[str, Any] = {}
    if endpoint:
        split = urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
        kwargs["endpoint_override"] = split.netloc
        kwargs["scheme"] = split.scheme
    elif options.get("AWS_ALLOW_HTTP", "").lower() in ("1", "true", "yes"):
        kwargs["scheme"] = "http"
    return pafs.S3FileSystem(access_key=options.get("AWS_ACCESS_KEY_ID"),
                             secret_key=options.get("AWS_SECRET_ACCESS_KEY"),
                             session_token=options.get("AWS_SESSION_TOKEN"), region=options.get("AWS_REGION"),
                             connect_timeout=CONNECT_TIMEOUT_S, request_timeout=REQUEST_TIMEOUT_S,
                             retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=RETRIES), **kwargs)


def explain(exc: BaseException, location: Location) -> StoreAccessError | None:
    """A one-line :class:`StoreAccessError` naming the store and the cause, for an error that says the object
    store cannot be reached or refused us (wrong keys, a missing bucket, no server); else None."""
    text = str(exc)
    endpoint = location.storage_options.get("AWS_ENDPOINT_URL", "the S3 endpoint")
    if any(s in text for s in ("ACCESS_DENIED", "AccessDenied", "403 Forbidden", "InvalidAccessKeyId",
                               "SignatureDoesNotMatch", "INVALID_ACCESS_KEY")):
        cause = "access denied: check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and the bucket's policy)"
    elif "NoSuchBucket" in text or "NO_SUCH_BUCKET" in text:
        cause = f"bucket {location.bucket!r} does not exist"
    elif any(s in text for s in ("NETWORK_CONNECTION", "Could not connect", "Connection refused", "error sending",
                                 "dns error", "Couldn't resolve", "timed out")) or \
            ("Error performing" in text and "retries" in text):
        cause = f"cannot reach {endpoint} (is the object store running, and AWS_ENDPOINT_URL right?)"
    else:
        return None
    return StoreAccessError(f"{location.uri}: {cause}")
