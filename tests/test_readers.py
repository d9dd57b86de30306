"""Every reader, from Python, over REST and through the Client: the same filters, and the same error for a run the
store does not hold (RunNotFoundError naming it and listing the runs; 404 over REST)."""

from __future__ import annotations

import contextlib
import inspect
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import numpy as np
import pyarrow as pa
import pytest

import trajstore
from tests.api.helpers import Live, serve, settings_for
from tests.helpers import assert_same_stats
from trajstore.api.app import create_app
from trajstore.errors import InputError, RemoteError, RunNotFoundError
from trajstore.query.filters import EpisodeFilter, keywords
from trajstore.rollout import gym_rollout
from trajstore.store import plumbing

FILTERS = set(keywords()) | {"filter"}
# The reads code moves from a local store to a served one by changing how it is opened: the same names, arguments
# and return types on the Store and the Client.
SHARED = ["sequences", "transitions", "iter_batches", "stats", "episodes", "returns", "compare", "runs", "health",
          "curves", "scores", "probability_of_improvement", "performance_profile", "episode_steps", "run_info",
          "schema", "sql", "follow", "set_run"]
READERS_WITH_FILTERS = ["sequences", "transitions", "iter_batches", "stats", "episodes", "returns", "curves"]
# What one side takes that the other cannot, and why; a new difference fails the parity test until it is named here.
ONLY = {
    ("client", "*", "version"),  # the Client reads any version of the served store; a Store is opened at one
    ("store", "sequences", "max_batch_bytes"),  # the service bounds its loaders' batches itself (loader_batch_bytes)
    ("store", "transitions", "max_batch_bytes"),
    ("store", "follow", "poll"),  # the Client is told of each commit by the service's event stream
    ("store", "sql", "params"),  # bound parameters of your own SQL; the service takes a query's text alone
    ("client", "sql", "max_rows"),  # the service's sandbox bounds the rows of an answer
    ("client", "sql", "as_"),  # deprecated: .to_pylist() of the table
    ("client", "set_run", "replace"),  # a remote writer describes its run as Store.writer does locally
    ("client", "set_run", "provenance"),
}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> trajstore.Store:
    store = trajstore.open(tmp_path_factory.mktemp("readers") / "store", create=True)
    gym_rollout(store, "CartPole-v1", run_id="alpha", num_envs=4, episodes=240, seed=0, progress=False,
                policy_version=1)
    gym_rollout(store, "CartPole-v1", run_id="beta", num_envs=2, episodes=20, seed=1, progress=False, mode="eval")
    return store


@pytest.fixture(scope="module")
def live(store: trajstore.Store) -> Iterator[Live]:
    with contextlib.contextmanager(serve)(create_app(settings_for(store.root, max_page_size=50))) as found:
        yield found


def expected_message(store: trajstore.Store, run: str = "nope") -> str:
    return f"run_id: no run '{run}' in {store.uri}; its runs: alpha, beta"


READERS: dict[str, Callable[[trajstore.Store, dict[str, Any]], Any]] = {
    "stats": lambda s, kw: s.stats(**kw),
    "episodes": lambda s, kw: s.episodes(**kw),
    "scan": lambda s, kw: s.scan(["reward"], **kw),
    "scan_plan": lambda s, kw: plumbing(s).scan_plan(["reward"], **kw),
    "returns": lambda s, kw: s.returns(gamma=0.9, **kw),
    "returns per step": lambda s, kw: s.returns(gamma=0.9, per="step", **kw),
    "sequences": lambda s, kw: s.sequences(4, **kw),
    "transitions": lambda s, kw: s.transitions(3, gamma=0.9, **kw),
    "iter_batches": lambda s, kw: s.iter_batches(**kw),  # raised at the call, before the first batch
    "curves": lambda s, kw: s.curves(**kw),
    "binned_curves": lambda s, kw: plumbing(s).binned_curves(**kw),
    "histogram": lambda s, kw: plumbing(s).histogram(**kw),
    "latest_stats": lambda s, kw: plumbing(s).latest_stats(**kw),
}


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("how", ["run_id", "run_id list", "filter"])
def test_every_reader_says_which_run_the_store_lacks(store: trajstore.Store, reader: str, how: str) -> None:
    kwargs = {"run_id": {"run_id": "nope"}, "run_id list": {"run_id": ["alpha", "nope"]},
              "filter": {"filter": EpisodeFilter(run_id=["nope"])}}[how]
    with pytest.raises(RunNotFoundError) as raised:
        READERS[reader](store, kwargs)
    assert str(raised.value) == expected_message(store)
    assert isinstance(raised.value, LookupError) and isinstance(raised.value, ValueError)


def test_the_same_error_from_delete_and_a_version(store: trajstore.Store) -> None:
    with pytest.raises(RunNotFoundError) as raised:
        store.maintain.delete(run_id="nope", dry_run=True)
    assert str(raised.value) == expected_message(store)
    alpha_only = max(v for v in range(store.version + 1) if plumbing(store.at(version=v)).run_ids() == ["alpha"])
    with pytest.raises(RunNotFoundError, match=r"no run 'beta' in .*; its runs: alpha$"):
        store.at(version=alpha_only).stats(run_id="beta")  # before beta's first commit, only alpha was there


@pytest.mark.server
@pytest.mark.parametrize(("path", "params"), [
    ("/stats", {}), ("/episodes", {}), ("/returns", {"gamma": 0.9}), ("/steps", {}), ("/steps", {"format": "json"}),
    ("/sequences", {"length": 4}), ("/transitions", {"n": 3, "gamma": 0.9}), ("/curves", {}),
    ("/curves/binned", {}), ("/curves/histogram", {}), ("/runs/nope", {})])
def test_rest_answers_404_with_the_same_message(store: trajstore.Store, live: Live, path: str,
                                                params: dict[str, Any]) -> None:
    query = params if path.startswith("/runs/") else {**params, "run_id": ["alpha", "nope"]}
    response = httpx.get(live.url + path, params=query)
    assert response.status_code == 404, response.text
    problem = response.json()
    assert problem["detail"] == expected_message(store)
    assert problem["type"] == "urn:trajstore:error:RunNotFoundError"


@pytest.mark.server
@pytest.mark.parametrize("call", [
    lambda c: c.stats(run_id="nope"), lambda c: c.episodes(run_id=["alpha", "nope"]),
    lambda c: c.returns(gamma=0.9, run_id="nope"), lambda c: next(c.iter_batches(run_id="nope")),
    lambda c: c.sequences(4, run_id="nope"), lambda c: c.transitions(3, gamma=0.9, run_id="nope")])
def test_the_client_raises_it_too(store: trajstore.Store, live: Live, call: Callable[[Any], Any]) -> None:
    with trajstore.Client(live.url) as client, pytest.raises(RunNotFoundError) as raised:
        call(client)
    assert isinstance(raised.value, RemoteError) and raised.value.status == 404
    assert raised.value.detail == expected_message(store)


def drift(store: type, client: type, names: list[str]) -> list[str]:
    """How the public signatures of ``names`` differ between ``store`` and ``client``: a method one lacks, another
    return annotation, a parameter one lacks (unless :data:`ONLY` names it), another kind or default."""
    found = []
    for name in names:
        if not hasattr(store, name) or not hasattr(client, name):
            found.append(f"{name}: on one side only")
            continue
        ours, theirs = inspect.signature(getattr(store, name)), inspect.signature(getattr(client, name))
        if ours.return_annotation != theirs.return_annotation:
            found.append(f"{name}: returns {ours.return_annotation} here, {theirs.return_annotation} there")
        mine = {k: (p.kind, p.default) for k, p in ours.parameters.items() if k != "self"}
        other = {k: (p.kind, p.default) for k, p in theirs.parameters.items() if k != "self"}
        found += [f"{name}({k}=): the Store's only" for k in mine.keys() - other.keys()
                  if ("store", name, k) not in ONLY]
        found += [f"{name}({k}=): the Client's only" for k in other.keys() - mine.keys()
                  if ("client", name, k) not in ONLY and ("client", "*", k) not in ONLY]
        found += [f"{name}({k}=): {mine[k]} here, {other[k]} there" for k in mine.keys() & other.keys()
                  if mine[k] != other[k]]
    return found


def test_the_client_offers_the_store_s_reads_under_the_same_signatures() -> None:
    assert drift(trajstore.Store, trajstore.Client, SHARED) == []
    for name in READERS_WITH_FILTERS:  # every filter, except where a method gives the name a meaning of its own
        assert FILTERS - {"seed"} <= set(inspect.signature(getattr(trajstore.Store, name)).parameters), name
        assert FILTERS - {"seed"} <= set(inspect.signature(getattr(trajstore.Client, name)).parameters), name


def test_the_parity_check_would_see_drift() -> None:  # the check above can fail
    class Local:
        def runs(self, *, last: int | None = None) -> pa.Table: ...

        def stats(self, *, by: str | None = None) -> pa.Table: ...

    class Remote:
        def runs(self, *, last: int | None = None) -> list[dict[str, Any]]: ...

        def stats(self, *, by: str | None = "run_id", version: int | None = None, limit: int = 3) -> pa.Table: ...

    assert drift(Local, Remote, ["runs", "stats", "health"]) == [
        "runs: returns pa.Table here, list[dict[str, Any]] there", "stats(limit=): the Client's only",
        "stats(by=): (<_ParameterKind.KEYWORD_ONLY: 3>, None) here, (<_ParameterKind.KEYWORD_ONLY: 3>, 'run_id') there",
        "health: on one side only"]


@pytest.mark.server
def test_runs_health_and_where_read_alike_from_a_store_and_a_client(store: trajstore.Store, live: Live) -> None:
    condition = "episode_return > 20 AND mode = 'train'"
    with trajstore.Client(live.url) as client:
        assert client.runs().equals(store.runs())
        latest = client.runs(last=5).to_pylist()
        assert [{k: pytest.approx(v) if isinstance(v, float) else v for k, v in row.items()}
                for row in store.runs(last=5).to_pylist()] == latest
        assert client.health() == store.health() and store.health()["status"] == "ready"
        want = store.episodes(where=condition)["episode_id"].to_pylist()
        assert 0 < len(want) < store.episodes().num_rows
        assert client.episodes(where=condition)["episode_id"].to_pylist() == want
        assert client.stats(where=condition)["n_traj"].to_pylist() == [len(want)]
        assert client.returns(gamma=0.9, where=condition)["episode_id"].to_pylist() == want
        assert sorted(set(np.concatenate([b["episode_id"] for b in client.iter_batches(
            where=condition, columns=["episode_id"])]).tolist())) == sorted(want)
        local, remote = store.sequences(4, where=condition), client.sequences(4, where=condition)
        for a, b in zip(local, remote, strict=True):
            assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
        assert client.episode_steps(want[0], limit=3).equals(store.episode_steps(want[0], limit=3))


@pytest.mark.server
def test_filter_keywords_select_what_the_filter_does(store: trajstore.Store, live: Live) -> None:
    cases = [({"min_return": 30}, EpisodeFilter(min_return=30)),
             ({"mode": "eval", "max_length": 40}, EpisodeFilter(max_length=40, lineage={"mode": ["eval"]})),
             ({"policy_version": [1], "complete": True, "run_id": "alpha"},
              EpisodeFilter(run_id=["alpha"], complete=True, lineage={"policy_version": [1]}))]
    with trajstore.Client(live.url) as client:
        for kwargs, flt in cases:
            want = store.episodes(filter=flt)
            assert 0 < want.num_rows < store.episodes().num_rows, kwargs
            assert store.episodes(**kwargs).equals(want)
            assert_same_stats(store.stats(**kwargs), store.stats(filter=flt))
            assert client.episodes(**kwargs)["episode_id"].to_pylist() == want["episode_id"].to_pylist()
            assert client.episodes(filter=flt)["episode_id"].to_pylist() == want["episode_id"].to_pylist()
            assert client.stats(**kwargs)["n_traj"].to_pylist() == store.stats(**kwargs)["n_traj"].to_pylist()


@pytest.mark.server
def test_filters_are_checked_by_name(store: trajstore.Store, live: Live) -> None:
    with pytest.raises(InputError, match="min_return: given both as a keyword"):
        store.episodes(min_return=3, filter=EpisodeFilter(min_return=5))
    with pytest.raises(InputError, match=r"complete: expected True, False or None, got 'yes'"):
        store.stats(terminated=True, complete="yes")
    with pytest.raises(InputError, match=r"min_length: expected a number, got 'long'"):
        store.episodes(min_length="long")
    with trajstore.Client(live.url) as client:
        with pytest.raises(TypeError, match="unexpected keyword argument 'min_retrun'; its filters are run_id"):
            client.episodes(min_retrun=3)
        with pytest.raises(InputError, match="min_length: expected a number"):
            client.stats(min_length="long")
        # a keyword the reader has a meaning of its own for (the shuffle's seed) is never overwritten by the filter
        with pytest.raises(TypeError, match="multiple values for keyword argument 'seed'"):
            client.iter_batches(seed=3, shuffle=True, filter=EpisodeFilter(lineage={"seed": [7]}))


@pytest.mark.parametrize("reader", ["episodes", "stats", "scan", "iter_batches", "returns", "curves"])
def test_every_reader_names_a_where_that_fails(store: trajstore.Store, reader: str) -> None:
    """A failing ``where`` is the caller's: named, without the SQL trajstore built around it, from every reader
    (``iter_batches`` too, whose batches come later)."""
    call = {"episodes": lambda: store.episodes(where="nope > 1"), "stats": lambda: store.stats(where="nope > 1"),
            "scan": lambda: store.scan(where="nope > 1"), "iter_batches": lambda: next(store.iter_batches(
                where="nope > 1")), "returns": lambda: store.returns(gamma=0.9, where="nope > 1"),
            "curves": lambda: store.curves(where="nope > 1")}[reader]
    with pytest.raises(InputError, match=r"^where: .*\"nope\".*\(in 'nope > 1'\)$"):
        call()


def test_an_empty_run_id_is_a_run_the_store_lacks(store: trajstore.Store) -> None:
    with pytest.raises(RunNotFoundError, match="no run ''"):
        store.stats(run_id="")


@pytest.mark.server
@pytest.mark.parametrize(("order_by", "limit", "offset"), [
    ("episode_id", None, 0), ("-episode_id", None, 13), ("-episode_return", None, 0), ("episode_length", 120, 7),
    ("episode_id", 0, 0), ("episode_id", 30, 255)])
def test_client_episodes_returns_every_match_across_pages(store: trajstore.Store, live: Live, order_by: str,
                                                          limit: int | None, offset: int) -> None:
    want = store.episodes(order_by=order_by, limit=limit, offset=offset)
    assert want.num_rows > 50 or limit is not None  # more than a page of the server's (max_page_size=50)
    with trajstore.Client(live.url) as client:
        got = client.episodes(order_by=order_by, limit=limit, offset=offset)
    assert got["episode_id"].to_pylist() == want["episode_id"].to_pylist()
    assert got.column_names == want.column_names


@pytest.mark.server
def test_client_episodes_reads_every_page_at_one_version(tmp_path: Path) -> None:
    store = trajstore.open(tmp_path / "s", create=True)
    gym_rollout(store, "CartPole-v1", run_id="a", num_envs=2, episodes=120, seed=0, progress=False)
    pages: list[str] = []

    def on_request(request: httpx.Request) -> None:
        if request.url.path == "/episodes":
            pages.append(request.url.params.get("version", ""))
            if len(pages) == 2:  # a commit lands while the client walks the pages
                gym_rollout(store, "CartPole-v1", run_id="a", num_envs=2, episodes=20, seed=1, progress=False,
                            append=True)

    before = store.version
    app = create_app(settings_for(store.root, max_page_size=50))
    with contextlib.contextmanager(serve)(app) as found:
        client = trajstore.Client(found.url)
        client._http.event_hooks["request"].append(on_request)
        got = client.episodes()
    assert got["episode_id"].to_pylist() == store.at(version=before).episodes()["episode_id"].to_pylist()
    assert pages[0] == "" and set(pages[1:]) == {str(before)}
