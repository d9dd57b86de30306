"""A name that bricks the store (issue 47): the probe's ingest with an extra column named ``""`` was answered 201,
after which ``stats``, ``sql``, ``check`` and even ``trajstore delete`` failed for good with DuckDB's "zero-length
delimited identifier"; extra columns ``Reward`` / ``Run_Id`` were a 500 (deltalake's "Duplicate field name"); run
ids ``" "`` and ``"a\\nb"`` were refused by ingest but described by ``PATCH /runs/{run_id}``. Replayed against a
real ``trajstore serve`` (with the key): each is a 422 naming the column or the id, nothing is stored, and every
read works afterwards on exactly what the store held."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any, Callable
from urllib.parse import quote

import httpx
import numpy as np
import pyarrow as pa
import pytest

import trajstore
from tests.helpers import fingerprint, steps_table
from tests.security.conftest import auth
from tests.served import Server
from trajstore.remote.wire import ARROW_STREAM, ipc_bytes

pytestmark = [pytest.mark.server, pytest.mark.security]

BAD_COLUMNS = ["", "Reward", "Run_Id", "a\nb", "next_obs_sparse", "a b"]
BAD_RUN_IDS = [" ", "a\nb", "__HIVE_DEFAULT_PARTITION__"]  # "a/b" too, but no route of the API can name it (404)
EVERY_STEP = "SELECT * EXCLUDE (wall_time) FROM steps ORDER BY episode_id, step, env_index"


def rows(extra: dict[str, Any]) -> pa.Table:
    """One whole episode of 5 steps as a remote writer sends it (obs of 4 floats), with the ``extra`` columns."""
    n = 5
    obs = pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(n * 4, np.float32)), 4)
    table = pa.table({
        "episode_id": pa.array([7] * n, pa.int64()), "step": pa.array(range(n), pa.int32()), "obs": obs,
        "action": pa.array([0] * n, pa.int64()), "reward": pa.array([1.0] * n, pa.float32()), "next_obs": obs,
        "terminated": pa.array([False] * (n - 1) + [True]), "truncated": pa.array([False] * n)})
    for name, value in extra.items():
        table = table.append_column(name, pa.array([value] * n))
    return table


def ingest(server: Server, body: bytes, run_id: str = "probe", env_id: str = "Probe-v0") -> httpx.Response:
    return httpx.post(f"{server.url}/runs/{quote(run_id, safe='')}/batches", params={"env_id": env_id},
                      content=body, headers={**auth(), "Content-Type": ARROW_STREAM}, timeout=60)


def held(server: Server) -> tuple[pa.Table, list[str], int]:
    """What the store holds: every step, the columns of its log's schema, its version."""
    store = trajstore.open(server.store)
    return store.sql(EVERY_STEP), steps_table(store).log.read().schema.names, store.version


def test_bad_column_names_and_run_ids_are_422_and_the_store_stays_readable(
        fresh_server: Callable[..., Server]) -> None:
    server = fresh_server()
    before, files = held(server), fingerprint(server.store)
    for name in BAD_COLUMNS:
        answer = ingest(server, ipc_bytes(rows({name: 1.0})))
        assert answer.status_code == 422, (name, answer.text)
        assert answer.headers["content-type"] == "application/problem+json"
        assert f"columns: {name!r} cannot be a column name" in answer.json()["detail"], answer.json()
    for run_id in BAD_RUN_IDS:
        answer = ingest(server, ipc_bytes(rows({})), run_id=run_id)
        assert answer.status_code == 422 and "run_id must be a non-empty string" in answer.json()["detail"], \
            (run_id, answer.text)
        assert repr(run_id) in answer.json()["detail"]
    assert ingest(server, ipc_bytes(rows({})), env_id="__HIVE_DEFAULT_PARTITION__").status_code == 422
    assert fingerprint(server.store) == files  # nothing written: no file, no column reserved, no commit
    assert held(server) == before

    stats = httpx.get(f"{server.url}/stats", params={"by": "run_id"}, timeout=60)
    assert stats.status_code == 200, stats.text
    query = httpx.post(f"{server.url}/sql", json={"query": "SELECT count(*) AS n FROM steps"}, timeout=60)
    assert query.status_code == 200, query.text
    assert json.dumps(query.json()).count(str(before[0].num_rows)) == 1
    checked = subprocess.run([sys.executable, "-m", "trajstore.cli", "check", "--store", str(server.store)],
                             capture_output=True, text=True, timeout=300)
    assert checked.returncode == 0 and checked.stdout.startswith("ok: "), checked.stdout + checked.stderr
    good = ingest(server, ipc_bytes(rows({"bonus": 1.0})))  # the same request with a good name lands
    assert good.status_code == 201, good.text
    assert held(server)[0].num_rows == before[0].num_rows + 5


def test_run_ids_no_writer_takes_are_not_described(fresh_server: Callable[..., Server]) -> None:
    """``PATCH /runs/{run_id}`` with ``replace=false`` described runs that do not exist under ids ingest refuses:
    now a 4xx (the run is unknown, or its id is one no writer takes), and nothing is described."""
    server = fresh_server()
    runs = httpx.get(f"{server.url}/runs", timeout=60).json()
    for run_id in BAD_RUN_IDS:
        for replace in (False, True):
            answer = httpx.patch(f"{server.url}/runs/{quote(run_id, safe='')}", headers=auth(), timeout=60,
                                 json={"notes": "probe", "replace": replace})
            assert answer.status_code in (404, 422), (run_id, answer.text)
            assert repr(run_id) in answer.json()["detail"]
    assert httpx.get(f"{server.url}/runs", timeout=60).json() == runs
    assert trajstore.open(server.store).sql("SELECT count(*) AS n FROM runs WHERE notes = 'probe'")["n"][0] \
        .as_py() == 0
