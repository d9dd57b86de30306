"""The service's settings, read once from ``TRAJSTORE_*`` environment variables (the names of
:func:`trajstore.settings.read_env`, with its grammar and errors): what ``trajstore serve`` listens on, whom it lets
write, and what each request may take. The store it serves keeps the library's own options
(:class:`trajstore.settings.Settings`: writing, reading, caches, object-store limits), read from the same
environment when the service opens it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from trajstore.settings import read_env


@dataclass
class ServiceSettings:
    """Every setting of the service; ``ServiceSettings.from_env()`` reads ``TRAJSTORE_<NAME>`` for each field."""

    store: str = "./trajdata"  # the store served (trajstore serve --store)
    api_key: str | None = None  # the key ingest requires (Authorization: Bearer); none: writes are refused
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
    loader_batch_bytes: int = 256 * 1024 * 1024  # the largest batch /sequences and /transitions build (422 beyond)
    # replays held open by the service for remote learners (POST /replays, api/replays.py): at most replay_max_open
    # at once (429 beyond), replay_memory_bytes of trees and slots together (413 beyond), each closed (its updates
    # committed) once unused for replay_idle_s; a POST /replays/{id}/update body at most replay_max_body_bytes
    replay_max_open: int = 8
    replay_memory_bytes: int = 1024 * 1024 * 1024
    replay_idle_s: float = 600.0
    replay_max_body_bytes: int = 16 * 1024 * 1024
    # the service commits ingest requests in groups, at most one commit of a store per commit_interval (seconds; a
    # duration: 250ms), sooner once a group holds commit_group_bytes of rows; requests past ingest_pending_bytes
    # (their bodies and rows, from arrival to answer) wait up to ingest_wait_s for room, then get 429 (see
    # operations/group_commit.py)
    commit_interval: float = 0.25
    commit_group_bytes: int = 64 * 1024 * 1024
    ingest_pending_bytes: int = 1024 * 1024 * 1024
    ingest_wait_s: float = 5.0
    # the threads ingest requests are read and checked on, apart from the other routes' pool (0: one per core; see
    # api/routes/ingest.py)
    ingest_threads: int = 0
    # the service reads, when it starts, what the dashboard's first page asks of the latest version (its episodes,
    # learning curves, runs) on a background thread, so that a first visit finds it ready (api/dashboard/routes.py)
    dashboard_warm: bool = True

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ServiceSettings:
        return read_env(cls, environ)
