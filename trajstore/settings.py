"""Settings read once from ``TRAJSTORE_*`` environment variables."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Mapping

from trajstore.durations import seconds
from trajstore.errors import InputError

PREFIX = "TRAJSTORE_"
DURATIONS = {"commit_interval"}  # durations whose names do not end in _s (TRAJSTORE_COMMIT_INTERVAL=500ms)


@dataclass
class Settings:
    """Every tunable of trajstore; ``Settings.from_env()`` reads ``TRAJSTORE_<NAME>`` for each field."""

    store: str = "./trajdata"
    flush_bytes: int = 128 * 1024 * 1024
    row_group_rows: int = 1024 * 1024
    api_key: str | None = None
    host: str = "127.0.0.1"
    port: int = 8321
    max_page_size: int = 1000
    max_page_bytes: int = 8 * 1024 * 1024  # the most decoded bytes of steps one JSON page or one episode's answer holds
    max_frame_size: int = 1024  # the longest side, in pixels, of a frame the dashboard's frame route draws
    sql_max_rows: int = 100_000
    sql_timeout_s: float = 10.0
    sql_memory_limit: str = "1GB"  # DuckDB's memory limit of each /sql query
    sql_max_bytes: int = 32 * 1024 * 1024  # the largest /sql answer (decoded result and body): 413 beyond
    sql_max_concurrent: int = 4  # /sql queries and /sequences, /transitions streams at once (429 beyond)
    # the memory each sandboxed query's worker process may take above its idle size (hard: 413 beyond); with
    # sql_max_concurrent, what SQL can take at all (4 x 1.5 GiB, plus ~0.25 GiB per idle worker)
    sql_worker_bytes: int = 1536 * 1024 * 1024
    max_body_bytes: int = 256 * 1024 * 1024  # the largest POST /runs/{run_id}/batches body (413 beyond, unread)
    # the most a POST /runs/{run_id}/batches body may decode to, counted from its metadata before it is decoded
    # (remote/decoded_size.py: its buffers uncompressed, plus what its arrays and rows take once checked; 413
    # beyond). Twice max_body_bytes: an uncompressed body under that limit fits when its rows are 32 bytes or
    # wider, a compressed one may shrink to half; one request takes up to about twice this (1.1-1.7x measured)
    max_decoded_bytes: int = 512 * 1024 * 1024
    # the largest POST /sql body (413 beyond, unread): its query of at most 100,000 characters fits even with every
    # character escaped in JSON (6 bytes each)
    sql_max_body_bytes: int = 1024 * 1024
    run_max_body_bytes: int = 1024 * 1024  # the largest PATCH /runs/{run_id} body, a run's description (413 beyond)
    # every read's time limit for what it computes (its queries of the process's DuckDB interrupted past it: 408)
    request_timeout_s: float = 60.0
    # comparisons, performance profiles and learning curves across seeds: bootstraps computed per request. At most
    # compute_max_concurrent at once (429 with Retry-After beyond: one per core, so that a cheap request such as
    # /stats still finds a core), each stopped at compute_timeout_s (408) and refused past compute_memory_bytes for
    # any one block of its work (413); a bootstrap holds one block of 256 replications at a time, whatever its reps
    compute_max_concurrent: int = 2
    compute_timeout_s: float = 30.0
    compute_memory_bytes: int = 256 * 1024 * 1024
    stream_batch_rows: int = 65_536
    stream_batch_bytes: int = 16 * 1024 * 1024  # fewer rows per streamed batch when rows are wide
    loader_batch_bytes: int = 256 * 1024 * 1024  # the largest batch /sequences and /transitions build (422 beyond)
    s3_connect_timeout_s: float = 3.0  # object store: the longest wait for a connection
    s3_timeout_s: float = 3.0  # object store: the longest wait for an answer (see storage/location.py)
    s3_retries: int = 1  # object store: retries of a request that failed or got no answer in time
    loader_layouts: int = 1  # loader layouts kept open in a Store for the next epoch; 0: none
    store_layouts: bool = True  # loader layouts saved in the store (layouts/) for every process; off: temporary
    layout_cache: str = "~/.cache/trajstore/layouts"  # this machine's copies of s3:// stores' loader layouts
    # each file written into a local store also written as plain arrays (arrays/, storage/arrays.py) that loaders
    # gather from at once; off: loaders lay the files out at their first read
    loader_arrays: bool = True
    # each committed file's footer and its episodes' fragments kept beside a local store (summaries/,
    # storage/summaries.py), so that the episodes of a version add up its files' fragments; off: readers aggregate
    # every step of a version once per process
    episode_summaries: bool = True
    # the service reads, when it starts, what the dashboard's first page asks of the latest version (its episodes,
    # learning curves, runs) on a background thread, so that a first visit finds it ready (api/dashboard/routes.py)
    dashboard_warm: bool = True
    # upkeep by writers after their commits (operations/upkeep): a partition holding more than compact_small_files
    # files below compact_small_bytes has them merged into files of up to compact_target_bytes (0: never)
    compact_small_files: int = 8
    compact_small_bytes: int = 16 * 1024 * 1024
    compact_target_bytes: int = 128 * 1024 * 1024
    checkpoint_interval: int = 25  # a Delta checkpoint once the log is this many versions past the last (0: never)
    # the service commits ingest requests in groups, at most one commit of a store per commit_interval (seconds; a
    # duration: 250ms), sooner once a group holds commit_group_bytes of rows; requests past ingest_pending_bytes
    # (their bodies and rows, from arrival to answer) wait up to ingest_wait_s for room, then get 429 (see
    # operations/group_commit.py)
    commit_interval: float = 0.25
    commit_group_bytes: int = 64 * 1024 * 1024
    ingest_pending_bytes: int = 1024 * 1024 * 1024
    ingest_wait_s: float = 5.0
    debug: bool = False  # the CLI prints tracebacks

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        environ = os.environ if environ is None else environ
        values: dict[str, object] = {}
        for f in fields(cls):
            raw = environ.get(PREFIX + f.name.upper())
            if raw is None:
                continue
            values[f.name] = _parse(f.name, f.type, raw)
        return cls(**values)  # type: ignore[arg-type]


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
