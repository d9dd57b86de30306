"""The library's options, read once from ``TRAJSTORE_*`` environment variables, and the one reader of those
variables (:func:`read_env`: one grammar of numbers, durations and switches, one error naming the variable), which
the service's own settings (:class:`trajstore.api.settings.ServiceSettings`) use too."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any, Mapping, TypeVar

from trajstore.durations import seconds
from trajstore.errors import InputError

PREFIX = "TRAJSTORE_"
DURATIONS = {"commit_interval"}  # durations whose names do not end in _s (TRAJSTORE_COMMIT_INTERVAL=500ms)

T = TypeVar("T")


@dataclass
class Settings:
    """The library's options: how a store writes, reads, caches, keeps itself up and waits for an object store, and
    the CLI's defaults; ``Settings.from_env()`` reads ``TRAJSTORE_<NAME>`` for each field. The service's settings
    (its address, page sizes, SQL and compute budgets, body limits) are
    :class:`trajstore.api.settings.ServiceSettings`, read from the same variables."""

    store: str = "./trajdata"  # the store of the CLI's commands without --store (and of the service: its own field)
    # the key a remote writer sends (trajstore rollout --url --api-key's default); the service's own field requires it
    api_key: str | None = None
    flush_bytes: int = 128 * 1024 * 1024
    row_group_rows: int = 1024 * 1024
    stream_batch_bytes: int = 16 * 1024 * 1024  # fewer rows per streamed batch when rows are wide
    # the memory each sandboxed query's worker process may take above its idle size (hard: 413 beyond), for
    # `trajstore sql` and the service's POST /sql and comparisons; with the service's sql_max_concurrent, what SQL can
    # take at all (4 x 1.5 GiB, plus ~0.25 GiB per idle worker)
    sql_worker_bytes: int = 1536 * 1024 * 1024
    s3_connect_timeout_s: float = 3.0  # object store: the longest wait for a connection
    s3_timeout_s: float = 3.0  # object store: the longest wait for an answer (see storage/location.py)
    s3_retries: int = 1  # object store: retries of a request that failed or got no answer in time
    loader_layouts: int = 1  # loader layouts kept open in a Store for the next epoch; 0: none
    store_layouts: bool = True  # loader layouts saved in the store (layouts/) for every process; off: temporary
    layout_cache: str = "~/.cache/trajstore/layouts"  # this machine's copies of s3:// stores' loader layouts
    # this machine's folder for what an s3:// store keeps beside its table (storage/cache.py: summaries, array copies,
    # copies of its data files that DuckDB reads), one folder per store, filled by writers and readers; "": none
    remote_cache: str = "~/.cache/trajstore/stores"
    # each store's folder at most (the entries written longest ago go first; 0: no bound); a reader copies a version's
    # files only while they take at most half of it
    remote_cache_bytes: int = 8 * 1024 ** 3
    # loaders of a local store gather from its files' plain-array copies (arrays/, storage/arrays.py), each made by
    # the first loader that reads the file; off: loaders lay the files out (layouts/) at their first read
    loader_arrays: bool = True
    # writers (and compaction, ingest) also write each file's copy as they write it, from the rows in memory: the
    # first batch of a store just written reads no Parquet, at 2-3.5x the Parquet's bytes whether or not anything
    # trains from it; off (the default): the first loader that reads a file makes its copy
    writer_arrays: bool = False
    # each committed file's footer and its episodes' fragments kept beside a local store (summaries/,
    # storage/summaries.py), so that the episodes of a version add up its files' fragments; off: readers aggregate
    # every step of a version once per process
    episode_summaries: bool = True
    # upkeep by writers after their commits (operations/upkeep): a partition holding more than compact_small_files
    # files below compact_small_bytes has them merged into files of up to compact_target_bytes (0: never)
    compact_small_files: int = 8
    compact_small_bytes: int = 16 * 1024 * 1024
    compact_target_bytes: int = 128 * 1024 * 1024
    checkpoint_interval: int = 25  # a Delta checkpoint once the log is this many versions past the last (0: never)
    debug: bool = False  # the CLI prints tracebacks

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        return read_env(cls, environ)


def read_env(cls: type[T], environ: Mapping[str, str] | None = None) -> T:
    """The dataclass ``cls`` with each field read from ``TRAJSTORE_<FIELD>`` in ``environ`` (default: the process's
    environment) where it is set, else its default: ``bool`` fields take 1/true/yes/on or 0/false/no/off, fields
    named ``…_s`` a duration (``10``, ``"500ms"``, ``"2m"``), numbers a number; a value that is none of these is an
    :class:`InputError` naming the variable."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for f in fields(cls):  # type: ignore[arg-type]
        raw = environ.get(PREFIX + f.name.upper())
        if raw is not None:
            values[f.name] = _parse(f.name, f.type, raw)
    return cls(**values)


def _parse(name: str, annotation: object, raw: str) -> object:
    kind = str(annotation)
    if kind == "bool":
        if raw.strip().lower() in ("1", "true", "yes", "on"):
            return True
        if raw.strip().lower() in ("", "0", "false", "no", "off"):
            return False
        raise InputError(f"{PREFIX}{name.upper()} must be 1/true/yes/on or 0/false/no/off, got {raw!r}")
    if name.endswith("_s") or name in DURATIONS:  # seconds: a duration of the one grammar (10, "10s", "500ms", "2m")
        return seconds(raw, f"{PREFIX}{name.upper()}", bare_seconds=True)
    try:
        if kind.startswith("int"):
            return int(raw)
        if kind.startswith("float"):
            return float(raw)
    except ValueError:
        raise InputError(f"{PREFIX}{name.upper()} must be a number, got {raw!r}") from None
    return raw
