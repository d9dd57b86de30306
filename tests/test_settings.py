"""Library options and service settings are two things (trajstore/settings.py, api/settings.py), read from the same
``TRAJSTORE_*`` variables as before: every name users set is read, each by the side it concerns (the store and the
API key by both: the CLI's defaults and the service's own), with one grammar and one error naming the variable; the
service applies its settings and opens its store with the library's, both from the environment."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

import trajstore
from trajstore.api.app import create_app
from trajstore.api.settings import ServiceSettings
from trajstore.errors import InputError
from trajstore.settings import Settings
from trajstore.store import plumbing

# every TRAJSTORE_* variable of the one Settings before the split: the names users set
NAMES = {
    "store", "flush_bytes", "row_group_rows", "api_key", "host", "port", "max_page_size", "max_page_bytes",
    "max_frame_size", "sql_max_rows", "sql_timeout_s", "sql_memory_limit", "sql_max_bytes", "sql_max_concurrent",
    "sql_worker_bytes", "max_body_bytes", "max_decoded_bytes", "sql_max_body_bytes", "run_max_body_bytes",
    "request_timeout_s", "compute_max_concurrent", "compute_timeout_s", "compute_memory_bytes", "stream_batch_rows",
    "stream_batch_bytes", "loader_batch_bytes", "writer_arrays", "replay_max_open", "replay_memory_bytes",
    "replay_idle_s", "replay_max_body_bytes", "s3_connect_timeout_s", "s3_timeout_s", "s3_retries",
    "loader_layouts", "store_layouts", "layout_cache", "loader_arrays", "episode_summaries", "dashboard_warm",
    "remote_cache", "remote_cache_bytes",
    "compact_small_files", "compact_small_bytes", "compact_target_bytes", "checkpoint_interval", "debug",
    # and the service's group commit of ingest requests (issue 49)
    "commit_interval", "commit_group_bytes", "ingest_pending_bytes", "ingest_wait_s", "ingest_threads"}
LIBRARY = {f.name for f in fields(Settings)}
SERVICE = {f.name for f in fields(ServiceSettings)}


def test_every_variable_users_set_is_still_read_each_by_its_side() -> None:
    assert LIBRARY | SERVICE == NAMES
    assert LIBRARY & SERVICE == {"store", "api_key"}  # the CLI's defaults, and the service's own
    assert {"flush_bytes", "loader_arrays", "compact_small_files", "s3_timeout_s", "debug"} <= LIBRARY
    assert {"host", "port", "sql_max_concurrent", "max_body_bytes", "compute_timeout_s", "dashboard_warm"} <= SERVICE
    assert {"commit_interval", "commit_group_bytes", "ingest_pending_bytes", "ingest_wait_s",
            "ingest_threads"} <= SERVICE


def test_both_read_one_grammar_and_name_the_variable_they_refuse() -> None:
    env = {"TRAJSTORE_FLUSH_BYTES": "1000", "TRAJSTORE_LOADER_ARRAYS": "off", "TRAJSTORE_S3_TIMEOUT_S": "500ms",
           "TRAJSTORE_PORT": "9000", "TRAJSTORE_DASHBOARD_WARM": "no", "TRAJSTORE_SQL_TIMEOUT_S": "2m",
           "TRAJSTORE_COMMIT_INTERVAL": "500ms"}
    library, service = Settings.from_env(env), ServiceSettings.from_env(env)
    assert (library.flush_bytes, library.loader_arrays, library.s3_timeout_s) == (1000, False, 0.5)
    assert (service.port, service.dashboard_warm, service.sql_timeout_s) == (9000, False, 120.0)
    assert service.commit_interval == 0.5
    with pytest.raises(InputError, match=r"^TRAJSTORE_PORT must be a number, got 'eighty'$"):
        ServiceSettings.from_env({"TRAJSTORE_PORT": "eighty"})
    with pytest.raises(InputError, match=r"^TRAJSTORE_LOADER_ARRAYS must be 1/true/yes/on or 0/false/no/off"):
        Settings.from_env({"TRAJSTORE_LOADER_ARRAYS": "maybe"})


def test_the_service_reads_its_settings_and_its_store_s_options_from_the_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = trajstore.open(tmp_path / "store", create=True)
    with store.writer(run_id="r", env_id="E") as w:
        for _ in range(8):
            w.add_step([[0.0]], [0], [1.0], [[1.0]], [True], [False])
    for name, value in {"STORE": str(store.root), "MAX_PAGE_SIZE": "3", "SQL_MAX_CONCURRENT": "1",
                        "DASHBOARD_WARM": "0", "LOADER_ARRAYS": "0", "SQL_WORKER_BYTES": str(1 << 30)}.items():
        monkeypatch.setenv(f"TRAJSTORE_{name}", value)
    with TestClient(create_app()) as client:
        app = client.app.state  # type: ignore[attr-defined]
        assert (app.settings.max_page_size, app.sql_gate.size, app.settings.dashboard_warm) == (3, 1, False)
        library = plumbing(app.store).settings
        assert (library.loader_arrays, library.sql_worker_bytes) == (False, 1 << 30)
        page = client.get("/episodes", params={"limit": 100})
        assert page.status_code == 200 and len(page.json()["items"]) == 3 < page.json()["total"]  # max_page_size
