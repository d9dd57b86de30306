"""Run configs that poisoned the experiment features (issue 47), replayed against a real ``trajstore serve``:
``PATCH /runs/X {"config": {"t": "\\ud800"}}`` committed and then made ``/runs`` 500 for good; a config nested 900
deep was a 500 RecursionError; ``replace=false`` described runs that do not exist; 20 notes of 1 MB made every
metadata commit rewrite all of them (a 238 MB log, 22 MB per commit, a new writer's commit 8.3 s); a 342-byte YAML
``--config-file`` of nested aliases took 105 s and 1.3 GB. Now each bad value is a 422 naming its path before
anything is committed, an unknown run a 404, a change one small commit of its own, and the bomb one line at once."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable
from urllib.parse import quote

import httpx
import numpy as np
import pytest

import trajstore
from tests.api.helpers import API_KEY
from tests.cli.test_config_file import BOMB
from tests.helpers import fingerprint, make_batch
from tests.security.conftest import auth
from tests.served import Server
from trajstore.store import plumbing

pytestmark = [pytest.mark.server, pytest.mark.security]


def patch(server: Server, run_id: str, body: str | dict[str, object]) -> httpx.Response:
    """``PATCH /runs/{run_id}`` with the key: ``body`` as JSON text sent as it is, or a value to encode (lone
    surrogates as JSON escapes, as a client in another language sends them)."""
    text = body if isinstance(body, str) else json.dumps(body)
    return httpx.patch(f"{server.url}/runs/{quote(run_id, safe='')}", content=text,
                       headers={**auth(), "Content-Type": "application/json"}, timeout=120)


def every_read_answers(server: Server) -> None:
    """What the poisoned config broke for good: the runs, one run, grouping by a config value, the SQL runs view."""
    for path, params in (("/runs", {}), ("/runs/ppo-0", {}), ("/stats", {"by": "config.algo"}),
                         ("/compare", {"by": "config.algo"})):
        answer = httpx.get(server.url + path, params=params, timeout=120)
        assert answer.status_code == 200, (path, answer.text)
    query = httpx.post(f"{server.url}/sql", json={"query": "SELECT run_id, config->>'$.algo' AS algo FROM runs"},
                       timeout=120)
    assert query.status_code == 200, query.text


def test_a_surrogate_or_a_deep_config_is_422_naming_its_path_and_nothing_is_committed(
        fresh_server: Callable[..., Server]) -> None:
    server = fresh_server()
    files = fingerprint(server.store)
    surrogate = patch(server, "ppo-0", '{"config": {"t": "\\ud800"}}')
    assert surrogate.status_code == 422, surrogate.text
    assert surrogate.json()["detail"].startswith("config.t: not valid Unicode text (a lone surrogate")
    deep = patch(server, "ppo-0", '{"config": ' + '{"a": ' * 900 + "1" + "}" * 900 + "}")
    assert deep.status_code == 422, deep.text
    assert deep.json()["detail"].startswith("config" + ".a" * 32 + ": nested deeper than 32 levels")
    for body in ({"tags": ["\ud800"]}, {"notes": "\udfff", "replace": False}, {"config": {"x": 2**64}}):
        assert patch(server, "ppo-0", body).status_code == 422, body
    assert fingerprint(server.store) == files  # no commit, no file
    every_read_answers(server)
    assert trajstore.open(server.store).run_info("ppo-0")["config"] == {"algo": "ppo", "seed": 0}


def test_describing_a_run_the_store_does_not_hold_is_404_and_describes_nothing(
        fresh_server: Callable[..., Server]) -> None:
    server = fresh_server()
    files = fingerprint(server.store)
    for run_id in (" ", "a\nb", "ghost"):
        for replace in (False, True):
            answer = patch(server, run_id, {"config": {"algo": "x"}, "tags": ["t"], "replace": replace})
            assert answer.status_code == 404, (run_id, replace, answer.text)
            assert answer.json()["type"] == "urn:trajstore:error:RunNotFoundError"
    assert fingerprint(server.store) == files
    assert sorted(plumbing(trajstore.open(server.store)).run_infos()) == ["dqn-0", "dqn-1", "ppo-0", "ppo-1"]


def new_writer_s_commit(store: Path, run_id: str) -> int:
    """Bytes this process reads while a new process-local writer describes a new run and commits its first batch."""
    start = bytes_read("self")
    with trajstore.open(store).writer(run_id=run_id, env_id="E") as w:
        w.add_batch(make_batch(np.random.default_rng(0), 16, 2))
    return bytes_read("self") - start


def bytes_read(pid: int | str) -> int:
    """What a process has read through system calls, from files and the page cache alike (``rchar``)."""
    fields = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    return int(fields["rchar"])


def median_of(n: int, measure: Callable[[int], float]) -> float:
    return statistics.median(measure(i) for i in range(n))


def test_twenty_notes_of_a_megabyte_each_commit_only_what_changed(fresh_server: Callable[..., Server]) -> None:
    server = fresh_server()
    store = trajstore.open(server.store)
    for i in range(16):  # 20 runs, as the probe had
        with store.writer(run_id=f"extra-{i}", env_id="E") as w:
            w.add_batch(make_batch(np.random.default_rng(i), 8, 2))
    runs = sorted(plumbing(store).run_ids())
    assert len(runs) == 20
    commit_before = median_of(5, lambda i: new_writer_s_commit(server.store, f"before-{i}"))
    stats_before = sum(bytes_read_by_get(server, "/stats") for _ in range(5))  # the first one reads, the rest are kept
    steps_log = {p.name for p in (server.store / "steps" / "_delta_log").glob("*.json")}
    runs_log = {p.name for p in (server.store / "runs" / "_delta_log").glob("*.json")}
    for i, run_id in enumerate(runs):
        answer = patch(server, run_id, {"notes": chr(ord("A") + i) * 1_000_000})
        assert answer.status_code == 200, answer.text
    new_entries = [p for p in (server.store / "runs" / "_delta_log").glob("*.json") if p.name not in runs_log]
    assert len(new_entries) == 20
    assert max(p.stat().st_size for p in new_entries) < 4096  # about the size of the change's commit, not 20 MB
    assert {p.name for p in (server.store / "steps" / "_delta_log").glob("*.json")} == steps_log
    commit_after = median_of(5, lambda i: new_writer_s_commit(server.store, f"after-{i}"))
    stats_after = sum(bytes_read_by_get(server, "/stats") for _ in range(5))
    # Bytes read, not seconds, so a loaded machine cannot fail it: before the runs table, a new writer read the whole
    # 238 MB log (8.3 s against a fraction of one); now it reads about 0.6 MB before the notes and 0.9 MB after.
    assert commit_after < 3 * commit_before, (commit_before, commit_after)
    assert stats_after < 3 * stats_before, (stats_before, stats_after)
    notes = {r["run_id"]: r["notes"] for r in httpx.get(server.url + "/runs", timeout=120).json()}
    assert all(notes[run_id] == chr(ord("A") + i) * 1_000_000 for i, run_id in enumerate(runs))


def bytes_read_by_get(server: Server, path: str) -> int:
    start = bytes_read(server.proc.pid)
    assert httpx.get(server.url + path, timeout=120).status_code == 200
    return bytes_read(server.proc.pid) - start


def test_a_yaml_alias_bomb_through_the_cli_is_refused_at_once(fresh_server: Callable[..., Server],
                                                              tmp_path: Path) -> None:
    server = fresh_server()
    (tmp_path / "bomb.yaml").write_text(BOMB)
    (tmp_path / "plain.yaml").write_text("algo: a2c\n")

    def rollout(config: str, run: str, timeout: float) -> tuple[subprocess.CompletedProcess[str], float]:
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "trajstore.cli", "rollout", "--url", server.url, "--api-key",
                               API_KEY, "--env", "CartPole-v1", "--steps", "32", "--run", run, "--config-file",
                               str(tmp_path / config), "--no-progress"], capture_output=True, text=True,
                              timeout=timeout)
        return done, time.perf_counter() - start

    plain, took = rollout("plain.yaml", "plain", 600)
    assert plain.returncode == 0, plain.stderr
    bomb, refused_in = rollout("bomb.yaml", "bomb", 10 * took + 30)
    assert bomb.returncode == 2 and bomb.stdout == "" and bomb.stderr.count("\n") == 1, bomb.stderr
    assert bomb.stderr.startswith("trajstore: error: --config-file: ") and "alias" in bomb.stderr
    assert "Traceback" not in bomb.stderr
    assert refused_in < took  # refused before any environment is made or request sent
    runs = {r["run_id"]: r for r in httpx.get(server.url + "/runs", timeout=120).json()}
    assert "bomb" not in runs and runs["plain"]["config"] == {"algo": "a2c"}
