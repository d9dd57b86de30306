"""The ``episodes`` rows have one definition, ``schemas/episode.v1.json`` (the view over ``steps``), and every other
source of them is checked against it here on one store (several environments, multi-agent episodes, truncations,
unfinished episodes, episodes cut across files): a plain Python reading of the definition's words, the rows combined
from the summaries written with the files, from summaries computed at read time, and the rows materialized once per
version where a store keeps no summaries."""

from __future__ import annotations

import shutil
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import trajstore
from tests.helpers import engine_of
from tests.query.test_summarized import KEYS, combined, reference, write_agents, write_runs
from trajstore import schema as sch
from trajstore.settings import Settings
from trajstore.storage.summaries import FOLDER


def by_the_words(store: trajstore.Store) -> list[dict[str, Any]]:
    """The ``episodes`` rows as ``episode.v1.json``'s descriptions say, in plain Python over the stored steps: per
    ``(run_id, env_id, episode_id)``; a single-agent episode's length, ends and completeness from its rows, a
    multi-agent one's from its agents (every agent ended: complete; none by a time limit: terminated); each lineage
    column at the first step that has a value."""
    stored = store.sql("SELECT * FROM steps LIMIT 0").column_names
    lineage = [n for n in sch.episode_lineage() if n in stored]
    names = ["run_id", "env_id", "episode_id", "step", "reward", "terminated", "truncated", "wall_time", "env_steps",
             "agent_id", *lineage]
    rows = store.scan([n for n in names if n in stored]).read_all().to_pylist()
    episodes: dict[tuple[str, str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        episodes[(r["run_id"], r["env_id"], r["episode_id"])].append(r)
    out = []
    for (run, env, eid), steps in sorted(episodes.items()):
        agents = {r["agent_id"] for r in steps if r.get("agent_id") is not None}
        ends = sum(bool(r["terminated"] or r["truncated"]) for r in steps)
        any_truncated = any(r["truncated"] for r in steps)
        first, last = min(r["step"] for r in steps), max(r["step"] for r in steps)
        env_steps = [r["env_steps"] for r in steps if r["env_steps"] is not None]
        row = {"run_id": run, "env_id": env, "episode_id": eid,
               "episode_length": last - first + 1 if agents else len(steps),
               "episode_return": sum(float(r["reward"]) for r in steps),
               "terminated": ends == len(agents) and not any_truncated if agents else
               any(r["terminated"] for r in steps),
               "truncated": ends == len(agents) and any_truncated if agents else any_truncated,
               "complete": ends == len(agents) if agents else ends > 0,
               "first_step": first, "last_step": last,
               "started_at": min(r["wall_time"] for r in steps), "ended_at": max(r["wall_time"] for r in steps),
               "n_agents": len(agents) or 1, "env_steps": max(env_steps) if env_steps else None}
        for name in lineage:
            valued = sorted((r["step"], r[name]) for r in steps if r[name] is not None)
            row[name] = valued[0][1] if valued else None
        out.append(row)
    return out


def assert_rows(got: pa.Table | list[dict[str, Any]], want: pa.Table, source: str) -> None:
    """The same rows, column by column; float sums up to the order they are added in."""
    got_rows = got if isinstance(got, list) else got.sort_by(KEYS).to_pylist()
    want_rows = want.to_pylist()
    assert len(got_rows) == len(want_rows), source
    for name in want.column_names:
        theirs, ours = [r[name] for r in got_rows], [r[name] for r in want_rows]
        if name == "episode_return":
            np.testing.assert_allclose(theirs, ours, rtol=1e-12, err_msg=source)
        else:
            assert theirs == ours, (source, name)


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store (only read by the tests, each from its own copy where it changes anything)."""
    root = tmp_path_factory.mktemp("episode_rows") / "store"
    store = trajstore.open(root, create=True)
    write_runs(store)  # CartPole-v1 and Other-v0, episodes across files, truncations, unfinished episodes
    write_agents(store)  # multi-agent: agents ending at different steps, one by a time limit, one cut by a flush
    return root


def test_every_source_of_episodes_rows_gives_the_view_s(written: Path, tmp_path: Path,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    store = trajstore.open(written)
    view = reference(store)  # the definition: the view over the steps
    assert {"CartPole-v1", "Other-v0", "Spread-v0"} <= set(view["env_id"].to_pylist())
    assert 3 in view["n_agents"].to_pylist() and True in view["truncated"].to_pylist()
    assert False in view["complete"].to_pylist()
    assert_rows(by_the_words(store), view, "plain Python by the definition's words")
    assert_rows(combined(store, caplog), view, "combined from the summaries written with the files")
    copy = tmp_path / "store"
    shutil.copytree(written, copy)
    shutil.rmtree(copy / FOLDER)
    assert_rows(combined(trajstore.open(copy), caplog), view, "combined from summaries computed at read time")
    unsummarized = trajstore.open(copy, settings=Settings(episode_summaries=False))
    with engine_of(unsummarized).query_snapshot(episodes="fill") as snap:
        assert snap.episodes_materialized
        assert_rows(snap.arrow("SELECT * FROM episodes"), view, "materialized once for the version")
    assert_rows(unsummarized.episodes(), view, "Store.episodes")


def test_every_column_of_the_definition_says_how_fragments_give_it() -> None:
    """A column added to ``episode.v1.json`` without its rule over the files' fragments fails here by name."""
    spec = sch.load(sch.EPISODE_SCHEMA_FILE)
    assert [c["name"] for c in spec["columns"] if "fragments_sql" not in c] == []
    assert "fragments_sql" in spec["lineage"]
