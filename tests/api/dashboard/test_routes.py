"""The dashboard's routes without a browser: the page, its assets and the ``/curves`` data."""

from __future__ import annotations

import hashlib
import re
import threading
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
from fastapi.testclient import TestClient

import trajstore
from trajstore.api.app import create_app
from trajstore.api.dashboard.routes import ASSETS, HERE
from trajstore.api.settings import ServiceSettings
from trajstore.store import plumbing


@pytest.fixture(scope="module")
def client(demo_store: trajstore.Store) -> Iterator[TestClient]:
    """The app over ``demo_store`` in-process, made once for the module's tests, which only read through it."""
    with TestClient(create_app(ServiceSettings(store=str(demo_store.root)))) as c:
        yield c


def test_root_redirects_to_the_dashboard(client: TestClient) -> None:
    r = client.get("/", follow_redirects=False)
    assert r.status_code in (302, 307) and r.headers["location"] == "/dashboard"


def test_assets_are_compressed_named_by_their_hash_and_kept(client: TestClient) -> None:
    page = client.get("/dashboard", headers={"Accept-Encoding": "gzip"})
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.headers["content-encoding"] == "gzip" and page.headers["cache-control"] == "no-cache"
    assert client.get("/dashboard", headers={"If-None-Match": page.headers["etag"]}).status_code == 304
    links = re.findall(r'(?:href|src|data-plotly)="(/dashboard/assets/[^"]+)"', page.text)
    assert {link.split("?")[0].rsplit("/", 1)[1] for link in links} == {"common.js", "sketch.js", "dashboard.js",
                                                                        "dashboard.css", "plotly.min.js"}
    for link in links:
        name = link.split("?")[0].rsplit("/", 1)[1]
        source = HERE / ASSETS[name][0]
        assert link.endswith("?v=" + hashlib.sha256(source.read_bytes()).hexdigest()[:16])
        zipped = client.get(link, headers={"Accept-Encoding": "gzip"})
        assert zipped.status_code == 200 and zipped.headers["content-encoding"] == "gzip"
        assert zipped.content == source.read_bytes()  # (httpx decompresses it)
        size = source.stat().st_size  # a few kB compress less than the page's script and Plotly
        assert int(zipped.headers["content-length"]) < (0.45 if size > 10_000 else 0.6) * size
        assert zipped.headers["cache-control"] == "public, max-age=31536000, immutable"
        plain = client.get(link, headers={"Accept-Encoding": "identity"})
        assert "content-encoding" not in plain.headers and plain.content == source.read_bytes()
        assert client.get(link, headers={"If-None-Match": zipped.headers["etag"]}).status_code == 304
        stale = client.get(link.split("?")[0] + "?v=0123")  # another version's hash: not kept for good
        assert stale.headers["cache-control"] == "no-cache" and stale.content == source.read_bytes()
    assert client.get("/dashboard/assets/other.js").status_code == 404


def test_plotly_is_the_vendored_basic_bundle() -> None:
    head = (HERE / "vendor" / "plotly-basic.min.js").read_text()[:200]
    assert "plotly.js (basic - minified) v" in head
    assert (HERE / "vendor" / "plotly-LICENSE").read_text().startswith("MIT License")
    js = (HERE / "dashboard.js").read_text()
    used = set(re.findall(r'type: "(\w+)"', js)) - set(re.findall(r'shapes: \[\{ type: "(\w+)"', js))  # no trace
    assert used <= {"scatter", "bar"}, used  # the traces the basic bundle has (it has no scattergl)


def test_nothing_comes_from_another_host() -> None:
    for name in ("page.html", "common.js", "dashboard.js", "dashboard.css"):
        text = (HERE / name).read_text()
        assert "http://" not in text and "https://" not in text and "//cdn" not in text, name


def test_curves_hold_every_complete_episode_in_end_order(client: TestClient, demo_store: trajstore.Store) -> None:
    body = client.get("/curves").json()
    eps = demo_store.curves().to_pylist()
    assert body["gamma"] is None
    assert [(s["run_id"], s["env_id"]) for s in body["series"]] == sorted({(e["run_id"], e["env_id"]) for e in eps})
    for s in body["series"]:
        mine = [e for e in eps if (e["run_id"], e["env_id"]) == (s["run_id"], s["env_id"])]
        assert [(e["ended_at"], e["env_steps"]) for e in mine] == sorted((e["ended_at"], e["env_steps"]) for e in mine)
        assert s["episode_id"] == [str(e["episode_id"]) for e in mine]  # exact 63-bit ids, as strings
        assert s["episode_length"] == [e["episode_length"] for e in mine]
        assert s["env_steps"] == [e["total_env_steps"] for e in mine]
        assert s["env_steps"] == sorted(s["env_steps"]) and s["env_steps"][0] > 0
        assert s["episode_return"] == pytest.approx([e["episode_return"] for e in mine])
        assert s["wall_time"] == pytest.approx([e["ended_at"].timestamp() for e in mine])
        assert s["policy_version"] == [e["policy_version"] for e in mine]
        assert s["discounted_return"] is None


@pytest.mark.slow
def test_a_random_policy_curve_has_no_batch_periodic_component(tmp_path: Path) -> None:
    """Uniform random CartPole over many (T, B) batches: the mean return of episodes grouped by their place in a
    batch (env steps modulo T·B, in 8 bins) is the overall mean within a few standard errors. Ordered by batch
    write time and cumulated lengths, the episodes carried over from the batch before (longer ones) came first in
    every batch: bins of the same curve were 10–70 standard errors apart."""
    pytest.importorskip("jax")
    from trajstore.rollout import jax_rollout

    B, T, batches, bins = 256, 32, 48, 8
    store = trajstore.open(tmp_path / "store", create=True)
    jax_rollout(store, "cartpole", run_id="random", num_envs=B, rollout_length=T, steps=B * T * batches, seed=0,
                progress=False)
    with TestClient(create_app(ServiceSettings(store=str(store.root)))) as c:
        (series,) = c.get("/curves").json()["series"]
    x, y = np.array(series["env_steps"]), np.array(series["episode_return"])
    assert len(x) > 15_000
    place = (x % (T * B)) * bins // (T * B)
    z = [(y[place == k].mean() - y.mean()) / (y[place == k].std() / np.sqrt(np.sum(place == k)))
         for k in range(bins)]
    assert max(map(abs, z)) < 4, np.round(z, 1)
    assert np.all(np.diff(x) >= 0) and np.all(x % B == 0)  # one writer: positions are whole time indices


def test_curves_with_gamma_and_filters(client: TestClient, demo_store: trajstore.Store) -> None:
    body = client.get("/curves", params={"gamma": 0.9, "run_id": ["ppo-seed1", "acrobot-random"]}).json()
    assert [s["run_id"] for s in body["series"]] == ["acrobot-random", "ppo-seed1"]
    expected = {str(r["episode_id"]): r["discounted_return"] for r in demo_store.returns(gamma=0.9).to_pylist()}
    for s in body["series"]:
        assert s["discounted_return"] == pytest.approx([expected[i] for i in s["episode_id"]])
    assert client.get("/curves", params={"gamma": 1.5}).status_code == 422


def test_curves_of_an_empty_store(tmp_path: Path) -> None:
    with TestClient(create_app(ServiceSettings(store=str(tmp_path / "empty")), create=True)) as c:
        assert c.get("/curves").json() == {"gamma": None, "series": []}


def test_binned_curves_route_gives_the_store_bins_per_series(client: TestClient, demo_store: trajstore.Store) -> None:
    body = client.get("/curves/binned", params={"bins": 30, "x": "episode_index", "gamma": 0.9}).json()
    assert body["metric"] == "discounted_return"  # the return, discounted with gamma
    want = plumbing(demo_store).binned_curves(bins=30, x="episode_index", y="discounted_return", gamma=0.9).to_pylist()
    got = [{"run_id": s["run_id"], "env_id": s["env_id"], **{k: s[k][i] for k in ("bin", "lo", "hi", "count", "mean",
                                                                                 "p10", "p50", "p90")}}
           for s in body["series"] for i in range(len(s["bin"]))]
    assert got == want and body["version"] == demo_store.version and body["bins"] == 30
    one = client.get("/curves/binned", params={"run_id": body["series"][0]["run_id"], "bins": 5}).json()
    assert [s["run_id"] for s in one["series"]] == [body["series"][0]["run_id"]]
    assert all(len(s["bin"]) <= 5 for s in one["series"])
    hist = client.get("/curves/histogram", params={"y": "episode_length", "bins": 12}).json()
    assert sum(sum(s["count"]) for s in hist["series"]) == demo_store.curves().num_rows


def test_binned_curves_per_agent_over_rest(tmp_path: Path, client: TestClient) -> None:
    """by=agent_id / agent_group: one series per agent of a real simple_spread run, as the Store bins them; none
    for single-agent runs; gamma and metric refused with by, naming it."""
    simple_spread_v3 = pytest.importorskip("mpe2.simple_spread_v3")
    from trajstore.rollout import parallel_rollout

    store = trajstore.open(tmp_path / "store", create=True)
    parallel_rollout(store, lambda: simple_spread_v3.parallel_env(max_cycles=10), run_id="team", episodes=6,
                     seed=0, progress=False)
    with TestClient(create_app(ServiceSettings(store=str(store.root)))) as c:
        for by in ("agent_id", "agent_group"):
            body = c.get("/curves/binned", params={"by": by, "bins": 4}).json()
            want = plumbing(store).binned_curves(by=by, bins=4).to_pylist()
            got = [{"run_id": s["run_id"], "env_id": s["env_id"], by: s["agent"],
                    **{k: s[k][i] for k in ("bin", "lo", "hi", "count", "mean", "p10", "p50", "p90")}}
                   for s in body["series"] for i in range(len(s["bin"]))]
            assert got == want and body["by"] == by
        assert [s["agent"] for s in c.get("/curves/binned", params={"by": "agent_id"}).json()["series"]] == \
            ["agent_0", "agent_1", "agent_2"]
        for params in ({"by": "agent_id", "gamma": 0.9}, {"by": "agent_id", "metric": "episode_length"}):
            r = c.get("/curves/binned", params=params)
            assert r.status_code == 422 and "by: curves per agent" in r.text
        assert c.get("/curves/binned", params={"by": "nope"}).status_code == 422
    assert client.get("/curves/binned", params={"by": "agent_id"}).json()["series"] == []  # single-agent runs


@pytest.mark.parametrize(("params", "field"), [({"x": "steps"}, "x"), ({"bins": 0}, "bins"),
                                               ({"y": "reward"}, "y"), ({"gamma": 2}, "gamma")])
def test_binned_curves_route_refuses_bad_parameters(client: TestClient, params: dict, field: str) -> None:
    r = client.get("/curves/binned", params=params)
    assert r.status_code in (400, 422) and field in r.text


def test_the_experiment_view_is_served_with_hashed_assets(client: TestClient) -> None:
    page = client.get("/dashboard/experiment", headers={"Accept-Encoding": "gzip"})
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.headers["content-encoding"] == "gzip" and page.headers["cache-control"] == "no-cache"
    assert client.get("/dashboard/experiment", headers={"If-None-Match": page.headers["etag"]}).status_code == 304
    assert "{{" not in page.text and 'href="/dashboard"' in page.text  # every placeholder filled; a way back
    links = re.findall(r'(?:href|src|data-plotly)="(/dashboard/assets/[^"]+)"', page.text)
    assert {link.split("?")[0].rsplit("/", 1)[1] for link in links} == {"common.js", "experiment.js",
                                                                        "dashboard.css", "plotly.min.js"}
    for link in links:
        source = HERE / ASSETS[link.split("?")[0].rsplit("/", 1)[1]][0]
        assert link.endswith("?v=" + hashlib.sha256(source.read_bytes()).hexdigest()[:16])
        got = client.get(link, headers={"Accept-Encoding": "gzip"})
        assert got.status_code == 200 and got.content == source.read_bytes()
        assert got.headers["cache-control"] == "public, max-age=31536000, immutable"
    assert 'href="/dashboard/experiment" id="to-experiment"' in client.get("/dashboard").text
    for name in ("experiment.html", "experiment.js"):
        text = (HERE / name).read_text()
        assert "http://" not in text and "https://" not in text and "//cdn" not in text, name


def test_a_service_reads_the_first_page_ahead_and_answers_it_from_what_it_read(
        demo_store: trajstore.Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """``warm``, run as the service starts, reads the latest version's episodes, latest statistics, runs,
    histograms, statistics per series and curves per agent: afterwards they are answered without reading a file's
    summary or a step again."""
    from trajstore.api.dashboard import routes
    from trajstore.query import summarized
    from trajstore.query.engine import Engine

    expected = plumbing(demo_store).latest_stats(routes.LAST_N), demo_store.runs()
    fresh = trajstore.open(demo_store.root)  # a service just started: nothing read yet
    routes.warm(fresh).join(120)

    def no_more(*args: object, **kwargs: object) -> None:
        raise AssertionError("read again after the warm-up")

    monkeypatch.setattr(summarized, "read", no_more)
    monkeypatch.setattr(Engine, "snapshot", no_more)  # on every engine: the warm-up is over
    assert plumbing(fresh).latest_stats(routes.LAST_N).equals(expected[0]) and fresh.runs().equals(expected[1])
    histogram = plumbing(fresh).histogram(y="episode_return", bins=routes.HIST_BINS, density=True)
    assert histogram.num_rows > 0
    assert fresh.stats(by=["run_id", "env_id"]).num_rows > 0
    assert plumbing(fresh).binned_curves(by="agent_id").num_rows == 0  # single-agent runs: no series per agent


def test_the_read_ahead_is_waited_for_at_exit_even_when_started_from_a_daemon_thread(
        demo_store: trajstore.Store) -> None:
    """A test client serves from a daemon thread, whose threads are daemons unless told: a read-ahead still inside
    DuckDB when the interpreter shuts down aborts the process ("FATAL: exception not rethrown")."""
    from trajstore.api.dashboard import routes

    started: list[threading.Thread] = []
    starter = threading.Thread(target=lambda: started.append(routes.warm(trajstore.open(demo_store.root))),
                               daemon=True)
    starter.start()
    starter.join()
    started[0].join(120)
    assert not started[0].daemon
