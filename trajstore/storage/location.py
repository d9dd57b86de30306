"""Where a store lives: a local directory or an ``s3://bucket/prefix``, reached through one ``pyarrow.fs``
filesystem (for Parquet files and the store's marker) and one set of deltalake storage options (for the
commit log). Every other module takes paths from a :class:`Location`, so local and remote stores share
one code path.

Credentials and endpoint come from ``storage_options`` with the keys deltalake uses (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION``, ``AWS_ALLOW_HTTP``),
and for each key not given, from the environment variable of that name.

Every request to the object store is bounded, so a store that stops answering (a stopped or overloaded server:
connections accepted, no reply) is an error within seconds, never a hang. Three ``storage_options`` keys
(deltalake's names; for each one not given, the ``TRAJSTORE_S3_*`` setting) bound both clients:

- ``connect_timeout`` (``TRAJSTORE_S3_CONNECT_TIMEOUT_S``, 3 s): the longest wait for a connection;
- ``timeout`` (``TRAJSTORE_S3_TIMEOUT_S``, 3 s, the AWS SDK's own default): the longest wait for an answer.
  pyarrow (Parquet files, the marker) gives up on a request that receives nothing for that long (curl's
  low-speed limit: a large transfer that keeps moving is not cut); deltalake (the commit log) on a log request
  that takes longer in all (raise it for a log whose checkpoints take longer than that to download);
- ``max_retries`` (``TRAJSTORE_S3_RETRIES``, 1): how often a request that failed or went unanswered is tried
  again (deltalake's ``retry_timeout``, after which it retries no more, follows: ``timeout`` times
  ``max_retries`` plus a second, unless given).

So one silent request fails after about ``(max_retries + 1) * timeout`` (6 s by default), with a
:class:`~trajstore.errors.StoreAccessError` naming the store and what to do (:func:`explain`); a read of many
files that the store leaves in the middle may wait for two (its next files' requests were under way). Durations
are seconds, or text such as ``"5s"``, ``"500ms"``, ``"1m"``.

>>> locate("/tmp/store").uri, locate("/tmp/store").is_local
('/tmp/store', True)
>>> loc = locate("s3://bucket/runs/a", {"AWS_ENDPOINT_URL": "http://127.0.0.1:8333", "AWS_REGION": "us-east-1",
...                                     "timeout": "2s", "max_retries": 2})
>>> loc.bucket, loc.path("steps"), loc.uri_of("steps")
('bucket', 'bucket/runs/a/steps', 's3://bucket/runs/a/steps')
>>> loc.limits
Limits(connect_s=3.0, timeout_s=2.0, retries=2)
>>> {k: loc.storage_options[k] for k in ("connect_timeout", "timeout", "max_retries", "retry_timeout")}
{'connect_timeout': '3000ms', 'timeout': '2000ms', 'max_retries': '2', 'retry_timeout': '5000ms'}
"""

from __future__ import annotations

import os
import posixpath
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import urlsplit

import pyarrow.fs as pafs

from trajstore.durations import seconds
from trajstore.errors import InputError, StoreAccessError, plain
from trajstore.settings import Settings

S3_KEYS = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION",
           "AWS_ALLOW_HTTP")
LIMIT_KEYS = ("connect_timeout", "timeout", "max_retries", "retry_timeout")
# deltalake's object store: conditional puts (If-Match) make concurrent commits safe without a lock service
DELTA_DEFAULTS = {"conditional_put": "etag"}


@dataclass(frozen=True)
class Limits:
    """How long an object store may keep a caller waiting: ``connect_s`` for a connection, ``timeout_s`` for an
    answer, and how often a request that failed or went unanswered is retried (``retries``)."""

    connect_s: float = 3.0
    timeout_s: float = 3.0
    retries: int = 1

    @property
    def attempts(self) -> int:
        return self.retries + 1

    def delta_options(self) -> dict[str, str]:
        """The same limits as deltalake's storage options."""
        return {"connect_timeout": _ms(self.connect_s), "timeout": _ms(self.timeout_s),
                "max_retries": str(self.retries), "retry_timeout": _ms(self.timeout_s * self.retries + 1)}


@dataclass(frozen=True)
class Location:
    """A store's place: ``uri`` as given (normalized), the filesystem that reaches it, ``root`` (its path in
    that filesystem) and the storage options deltalake needs there."""

    uri: str
    fs: pafs.FileSystem = field(repr=False)
    root: str
    storage_options: dict[str, str] = field(default_factory=dict, repr=False)
    limits: Limits = field(default_factory=Limits, repr=False)

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
        return Location(self.uri_of(*parts), self.fs, self.path(*parts), self.storage_options, self.limits)

    def relative(self, path: str) -> str:
        """``path`` (a path in the filesystem) relative to the root."""
        prefix = self.root.rstrip("/") + "/"
        rest = path[len(prefix):]
        if path.startswith(prefix) and rest and "//" not in rest and "/." not in "/" + rest and not rest.endswith("/"):
            return rest  # a plain path under the root: what relpath says, without its cost per file
        return posixpath.relpath(path, self.root)

    def normalized(self, path: str) -> str:
        """A path as the log gives it (relative to the root, or a full URI) or a path of the filesystem, as one
        path of the filesystem (local paths normalized, so that two spellings of one file compare equal)."""
        if "://" in path:
            path = path.split("://", 1)[1]
            return os.path.normpath(path) if self.is_local else path
        if self.is_local:
            return os.path.normpath(path if os.path.isabs(path) else self.path(path))
        return path if self.bucket and path.startswith(self.root + "/") else self.path(path)


def locate(uri: str | Path | Location, storage_options: Mapping[str, Any] | None = None, *,
           settings: Settings | None = None) -> Location:
    """The location of ``uri``: a local directory (a path or ``file://``) or ``s3://bucket/prefix``; the
    ``TRAJSTORE_S3_*`` limits come from ``settings`` (default: the environment)."""
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
    limits = limits_of(options, settings or Settings.from_env())
    delta = {**DELTA_DEFAULTS, **limits.delta_options(), **{k: v for k, v in options.items() if k not in LIMIT_KEYS}}
    if "retry_timeout" in options:
        delta["retry_timeout"] = _ms(_seconds("retry_timeout", options["retry_timeout"]))
    return Location(f"s3://{root}", s3_filesystem(options, limits), root, delta, limits)


def s3_options(given: Mapping[str, Any] | None) -> dict[str, Any]:
    """The AWS_* options: those given (any case), and for each one not given its environment variable; and the
    limits and deltalake options given (lower case)."""
    options = {str(k).upper(): v if str(k).lower() in LIMIT_KEYS and isinstance(v, (int, float)) else str(v)
               for k, v in (given or {}).items() if v is not None}  # a limit given as a number: seconds
    known = (*LIMIT_KEYS, *DELTA_DEFAULTS)
    unknown = sorted(k for k in options if k not in S3_KEYS and k.lower() not in known)
    if unknown:
        raise InputError(f"storage_options: unknown key(s) {unknown}; expected some of {[*S3_KEYS, *known]}")
    for key in S3_KEYS:
        if key not in options and os.environ.get(key):
            options[key] = os.environ[key]
    return {k if k in S3_KEYS else k.lower(): v for k, v in options.items()}


def limits_of(options: Mapping[str, str], settings: Settings) -> Limits:
    """The limits of ``options`` (``connect_timeout``, ``timeout``, ``max_retries``), each one not given from
    ``settings``; an :class:`InputError` names the key or setting that is out of range."""
    connect = _seconds("connect_timeout", options.get("connect_timeout", settings.s3_connect_timeout_s),
                       "TRAJSTORE_S3_CONNECT_TIMEOUT_S" if "connect_timeout" not in options else None)
    timeout = _seconds("timeout", options.get("timeout", settings.s3_timeout_s),
                       "TRAJSTORE_S3_TIMEOUT_S" if "timeout" not in options else None)
    raw = options.get("max_retries", settings.s3_retries)
    try:
        retries = int(raw)
    except (TypeError, ValueError):
        retries = -1
    if retries < 0 or str(raw).strip() != str(retries):
        where = "storage_options: max_retries" if "max_retries" in options else "TRAJSTORE_S3_RETRIES"
        raise InputError(f"{where} must be a whole number >= 0, got {raw!r}")
    return Limits(connect, timeout, retries)


def _seconds(key: str, value: Any, setting: str | None = None) -> float:
    """``value`` (a duration of :mod:`trajstore.durations`: ``"5s"``, ``"500ms"``, ``"1m"``, or seconds, as a
    number or as text: a timeout's unit is seconds) in seconds; > 0."""
    return seconds(value, setting or f"storage_options: {key}", inclusive=False, bare_seconds=True)


def _ms(seconds: float) -> str:
    return f"{max(1, round(seconds * 1000))}ms"


def s3_filesystem(options: Mapping[str, str], limits: Limits = Limits()) -> pafs.S3FileSystem:
    """pyarrow's S3 filesystem for ``options`` (the AWS_* keys), with the timeouts and retries of ``limits``."""
    endpoint = options.get("AWS_ENDPOINT_URL")
    kwargs: dict[str, Any] = {}
    if endpoint:
        split = urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
        kwargs["endpoint_override"] = split.netloc
        kwargs["scheme"] = split.scheme
    elif options.get("AWS_ALLOW_HTTP", "").lower() in ("1", "true", "yes"):
        kwargs["scheme"] = "http"
    # request_timeout is curl's low-speed time on Linux: a request that receives nothing for that long fails
    return pafs.S3FileSystem(access_key=options.get("AWS_ACCESS_KEY_ID"),
                             secret_key=options.get("AWS_SECRET_ACCESS_KEY"),
                             session_token=options.get("AWS_SESSION_TOKEN"), region=options.get("AWS_REGION"),
                             connect_timeout=limits.connect_s, request_timeout=limits.timeout_s,
                             retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=limits.attempts), **kwargs)


_DENIED = ("ACCESS_DENIED", "AccessDenied", "403 Forbidden", "InvalidAccessKeyId", "SignatureDoesNotMatch",
           "INVALID_ACCESS_KEY")
_SILENT = ("Timeout was reached", "curlCode: 28", "timed out", "Operation too slow")
_UNREACHABLE = ("NETWORK_CONNECTION", "Could not connect", "Connection refused", "error sending", "dns error",
                "Couldn't resolve", "Connection reset", "connection closed")
_FULL = ("No space left on device", "Disk quota exceeded", "XMinioStorageFull")
_FAILING = ("INTERNAL_FAILURE", "InternalError", "internal error", "SERVICE_UNAVAILABLE", "ServiceUnavailable",
            "SlowDown", "SLOW_DOWN", "500 Internal Server Error", "503 Service Unavailable")


def explain(exc: BaseException, location: Location) -> StoreAccessError | None:
    """A one-line :class:`StoreAccessError` naming the store, the cause and what to do, for an error that says
    the store cannot be reached in time, refused us (wrong keys, a missing bucket, no server), is full, or
    failed on its side; else None (the caller keeps its own error)."""
    cause = _cause(plain(str(exc)), location)
    return None if cause is None else StoreAccessError(f"{location.uri}: {cause}")


def _cause(text: str, location: Location) -> str | None:
    endpoint = location.storage_options.get("AWS_ENDPOINT_URL", "the S3 endpoint")
    limits = location.limits
    if any(s in text for s in _FULL):
        return ("the disk holding it is full (no space left on device): free space or give the store more, then "
                "write again; what was committed before is intact")
    if location.is_local:
        return None
    if any(s in text for s in _DENIED):
        return "access denied: check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and the bucket's policy)"
    if "NoSuchBucket" in text or "NO_SUCH_BUCKET" in text:
        return f"bucket {location.bucket!r} does not exist (create it, or check the store's URI)"
    if any(s in text for s in _SILENT) or _waited(text) >= limits.timeout_s:
        return (f"no answer from {endpoint} within {limits.timeout_s:g} s ({limits.attempts} attempt(s)): the "
                "object store is stopped, overloaded or unreachable; try again once it answers (if it is only "
                "slow, raise storage_options 'timeout' or TRAJSTORE_S3_TIMEOUT_S)")
    unreachable = f"cannot reach {endpoint} (is the object store running, and AWS_ENDPOINT_URL right?)"
    if any(s in text for s in _UNREACHABLE):
        return unreachable
    if any(s in text for s in _FAILING):  # it answered (deltalake's retried PUT of a log entry included)
        return (f"the object store at {endpoint} failed on its side ({_gist(text)}): its disk may be full, or it "
                "is overloaded or failing; check its free space and its log, then try again")
    if "Error performing" in text and "retries" in text:  # deltalake's words for a request that got no answer
        return unreachable
    return None


def _waited(text: str) -> float:
    """How long a deltalake request waited before it failed, from its error text ("… in 10.1s, after 1
    retries"; its short forms drop the "timed out" that follows), or 0."""
    found = re.search(r"Error performing \w+ \S+ in ([\d.]+)s", text)
    return float(found.group(1)) if found else 0.0


def _gist(text: str) -> str:
    """The server's own words from a pyarrow or deltalake error text, on one line and short."""
    said = re.search(r"during (\w+) operation: ([^(\n]+)", text)
    answer = re.search(r"<Code>([^<]+)</Code>\s*<Message>([^<]+)</Message>", text)  # deltalake's: the reply's XML
    request = re.search(r"Error performing (\w+) \S*?([^/\s]+) in ", text)
    if said:
        gist = f"{said.group(1)}: {said.group(2)}"
    elif answer:
        gist = (f"{request.group(1)} {request.group(2)}: " if request else "") + f"{answer.group(1)}: {answer.group(2)}"
    else:
        gist = text.strip().splitlines()[0]
    gist = " ".join(gist.split()).rstrip(" .;,")
    return gist if len(gist) <= 160 else gist[:157] + "..."
