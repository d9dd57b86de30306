"""Run configs (issue 31): what a run was — config, tags, notes, the code that made it — stored with the store (its
``runs`` table since issue 47: tests/storage/test_run_config.py), versioned with the steps, in SQL as the ``runs``
view and usable as ``by="config.<path>"``."""

from __future__ import annotations

import json
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

import trajstore
from tests.helpers import make_batch
from trajstore.errors import InputError, RunNotFoundError
from trajstore.storage import run_config
from trajstore.store import plumbing


def write(store: trajstore.Store, run_id: str, seed: int, **describe: object) -> None:
    with store.writer(run_id=run_id, env_id="E", **describe) as w:
        w.add_batch(make_batch(np.random.default_rng(seed), 40, 4, p_terminated=0.1, p_truncated=0.0))


@pytest.fixture
def described(store: trajstore.Store) -> trajstore.Store:
    for seed in range(2):
        write(store, f"ppo-{seed}", seed, config={"algo": "ppo", "lr": 3e-4, "net": {"width": 64}},
              tags=["baseline"], notes="first try")
        write(store, f"dqn-{seed}", 10 + seed, config={"algo": "dqn", "lr": np.float32(1e-3),
                                                       "net": {"width": np.int64(128)}})
    write(store, "plain", 20)
    return store


def test_a_run_s_info_is_what_its_writer_gave(described: trajstore.Store) -> None:
    before = datetime.now(timezone.utc)
    info = described.run_info("ppo-0")
    assert info["config"] == {"algo": "ppo", "lr": 3e-4, "net": {"width": 64}}
    assert info["tags"] == ["baseline"] and info["notes"] == "first try"
    assert info["created"] <= before and info["trajstore_version"] == trajstore.__version__ and info["host"]
    dqn = described.run_info("dqn-1")["config"]
    assert dqn == {"algo": "dqn", "lr": pytest.approx(1e-3), "net": {"width": 128}}  # numpy values made plain
    plain = described.run_info("plain")  # written without a description: its program is recorded all the same
    assert plain["config"] == {} and plain["tags"] == [] and plain["notes"] is None
    assert info["created"] <= plain["created"] <= before and plain["host"] == info["host"]
    assert plain["trajstore_version"] == trajstore.__version__ and plain["git_commit"] == info["git_commit"]
    with pytest.raises(RunNotFoundError, match="nope"):
        described.run_info("nope")


def test_the_runs_view_joins_configs_with_episodes(described: trajstore.Store) -> None:
    runs = described.sql("SELECT run_id, config->>'$.algo' AS algo, tags, notes FROM runs ORDER BY run_id")
    assert runs.to_pydict() == {"run_id": ["dqn-0", "dqn-1", "plain", "ppo-0", "ppo-1"],
                                "algo": ["dqn", "dqn", None, "ppo", "ppo"],
                                "tags": [[], [], [], ["baseline"], ["baseline"]],
                                "notes": [None, None, None, "first try", "first try"]}
    joined = described.sql("SELECT config->>'$.algo' AS algo, count(*) AS n FROM episodes JOIN runs USING (run_id) "
                           "WHERE complete GROUP BY ALL ORDER BY algo NULLS LAST")
    per_run = described.sql("SELECT run_id, count(*) AS n FROM episodes WHERE complete GROUP BY run_id")
    counts = dict(zip(per_run["run_id"].to_pylist(), per_run["n"].to_pylist()))
    assert joined.to_pydict() == {"algo": ["dqn", "ppo", None],
                                  "n": [counts["dqn-0"] + counts["dqn-1"], counts["ppo-0"] + counts["ppo-1"],
                                        counts["plain"]]}
    width = plumbing(described).sandboxed_sql("SELECT run_id, (config->'$.net'->>'$.width')::INT AS width FROM runs "
                                    "WHERE run_id LIKE 'dqn%' ORDER BY run_id")
    assert width.table["width"].to_pylist() == [128, 128]
    only = described.sql("SELECT run_id FROM runs", run_id="ppo-1")  # the selection's runs only
    assert only["run_id"].to_pylist() == ["ppo-1"]


def test_stats_by_a_config_value_pool_the_runs_that_share_it(described: trajstore.Store) -> None:
    got = described.stats(by="config.algo")
    assert got["config.algo"].to_pylist() == ["dqn", "ppo", None]
    for algo in ("dqn", "ppo"):
        want = described.stats(run_id=[f"{algo}-0", f"{algo}-1"])
        row = got.filter(pc.equal(got["config.algo"], algo))
        for column in ("n_traj", "return_mean", "return_std", "len_max"):
            assert row[column].to_pylist() == pytest.approx(want[column].to_pylist()), column
    nested = described.stats(by=["config.net.width", "run_id"], run_id=["dqn-0", "ppo-0"])
    assert nested.select(["config.net.width", "run_id"]).to_pylist() == [
        {"config.net.width": "128", "run_id": "dqn-0"}, {"config.net.width": "64", "run_id": "ppo-0"}]
    with pytest.raises(InputError, match="config path"):
        described.stats(by="config..x")


def test_set_run_changes_the_info_time_travel_shows_the_old_one(described: trajstore.Store) -> None:
    version = described.version
    described.set_run("ppo-0", config={"algo": "ppo", "lr": 1e-4}, tags=["tuned"])
    assert described.version == version  # a row of the runs table, not a version of the steps
    now = described.run_info("ppo-0")
    assert now["config"] == {"algo": "ppo", "lr": 1e-4} and now["tags"] == ["tuned"]
    assert now["notes"] == "first try"  # not given: kept
    assert described.at(version=version).run_info("ppo-0")["tags"] == ["tuned"]  # changed while it was the latest
    then = described.at(version=version - 1).run_info("ppo-0")
    assert then["config"]["lr"] == 3e-4 and then["tags"] == ["baseline"]
    described.set_run("plain", notes="no config")
    assert described.run_info("plain")["notes"] == "no config"
    with pytest.raises(RunNotFoundError):
        described.set_run("nope", tags=["x"])


def test_a_later_writer_adds_tags_and_must_give_the_same_config(described: trajstore.Store) -> None:
    version = described.version
    write(described, "ppo-0", 5, config={"algo": "ppo", "lr": 3e-4, "net": {"width": 64}})  # same: no commit
    assert described.version == version + 1  # its steps only
    write(described, "ppo-0", 6, tags=["resumed"], notes="other notes")
    info = described.run_info("ppo-0")
    assert info["tags"] == ["baseline", "resumed"] and info["notes"] == "first try"
    steps = described.sql("SELECT count(*) AS n FROM steps WHERE run_id = 'ppo-0'")["n"][0].as_py()
    with pytest.raises(InputError, match=r"config: run 'ppo-0' was recorded with another config \(lr: 0.0003 → "):
        write(described, "ppo-0", 7, config={"algo": "ppo", "lr": 1e-2, "net": {"width": 64}})
    assert described.sql("SELECT count(*) AS n FROM steps WHERE run_id = 'ppo-0'")["n"][0].as_py() == steps


@pytest.mark.parametrize(("config", "message"), [
    ({"lr": float("nan")}, r"config.lr: nan has no JSON value"),
    ({"f": object()}, r"config.f: expected JSON values"),
    ({"a": {1: 2}}, r"config.a: keys must be non-empty strings"),
    ([("lr", 1)], r"config: expected a dict"),
])
def test_a_config_that_is_not_json_is_refused_by_name(store: trajstore.Store, config: object, message: str) -> None:
    with pytest.raises(InputError, match=message):
        write(store, "r", 0, config=config)
    assert store.version == -1 or store.maintain.files() == []
    with pytest.raises(InputError, match="tags: expected a list of strings"):
        write(store, "r", 0, tags="baseline")


def test_other_engines_see_the_configs_and_their_maintenance_keeps_them(described: trajstore.Store) -> None:
    runs = DeltaTable(str(described.root / "runs"))
    rows = [r for r in runs.to_pyarrow_table().to_pylist() if r["run_id"] == "ppo-1"]
    (latest,) = [r for r in rows if r["revision"] == max(r["revision"] for r in rows)]
    assert json.loads(latest["config"])["algo"] == "ppo" and latest["tags"] == ["baseline"] and not latest["deleted"]
    for table in (DeltaTable(str(described.root / "steps")), runs):
        table.optimize.compact()
        table.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    reopened = trajstore.open(described.root)
    assert reopened.run_info("ppo-1")["config"]["net"] == {"width": 64}
    assert reopened.stats(by="config.algo")["n_traj"].to_pylist() == described.stats(by="config.algo")[
        "n_traj"].to_pylist()


def test_the_git_commit_of_the_calling_program_s_repository(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    try:
        subprocess.run([*git, "init", "-q"], check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("git is not installed")
    assert run_config.git_commit(repo) is None  # no commit yet
    (repo / "train.py").write_text("print(1)\n")
    subprocess.run([*git, "add", "train.py"], check=True)
    subprocess.run([*git, "commit", "-qm", "c"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    assert run_config.git_commit(repo) == head
    (repo / "train.py").write_text("print(2)\n")
    assert run_config.git_commit(repo) == head + "+dirty"
    subprocess.run([*git, "commit", "-qam", "d"], check=True)
    (repo / "notes.txt").write_text("untracked\n")  # an untracked file is no change of the program
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    assert run_config.git_commit(repo) == head
    assert run_config.git_commit(tmp_path) is None


def _gym(store: trajstore.Store, **describe: object) -> None:
    from trajstore.rollout import gym_rollout

    gym_rollout(store, "CartPole-v1", run_id="run", num_envs=2, steps=64, progress=False, **describe)


def _jax(store: trajstore.Store, **describe: object) -> None:
    from trajstore.rollout import jax_rollout

    jax_rollout(store, "cartpole", run_id="run", num_envs=4, rollout_length=8, steps=64, progress=False, **describe)


def _jax_evaluate(store: trajstore.Store, **describe: object) -> None:
    from trajstore.rollout import jax_evaluate

    jax_evaluate(store, "cartpole", run_id="run", episodes=2, num_envs=2, progress=False, **describe)


def _recorder(store: trajstore.Store, **describe: object) -> None:
    import gymnasium as gym

    from trajstore.integrations import RecordToStore

    with RecordToStore(gym.make("CartPole-v1"), store, run_id="run", **describe) as env:
        env.reset(seed=0)
        for _ in range(20):
            if any(env.step(env.action_space.sample())[2:4]):
                env.reset()


def _vector_recorder(store: trajstore.Store, **describe: object) -> None:
    import gymnasium as gym

    from trajstore.integrations import VectorRecordToStore

    with VectorRecordToStore(gym.make_vec("CartPole-v1", num_envs=2), store, run_id="run", **describe) as env:
        env.reset(seed=0)
        for _ in range(20):
            env.step(env.action_space.sample())


@pytest.mark.parametrize("record", [_gym, _jax, _jax_evaluate, _recorder, _vector_recorder],
                         ids=lambda f: f.__name__.strip("_"))
def test_every_rollout_and_recorder_describes_its_run(store: trajstore.Store, record: object) -> None:
    record(store, config={"algo": "random", "seed": 0}, tags=["smoke"], notes="by hand")  # type: ignore[operator]
    info = store.run_info("run")
    assert (info["config"], info["tags"], info["notes"]) == ({"algo": "random", "seed": 0}, ["smoke"], "by hand")
    assert store.sql("SELECT count(*) AS n FROM steps")["n"][0].as_py() > 0


def test_the_cli_records_lists_and_changes_a_run_s_description(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    from trajstore.cli import main

    path = str(tmp_path / "store")
    (tmp_path / "ppo.yaml").write_text("algo: ppo\nnet:\n  width: 64\n  depth: 2\nlr: 0.0003\n")
    assert main(["rollout", "--env", "CartPole-v1", "--num-envs", "2", "--steps", "64", "--store", path, "--run",
                 "a", "--config-file", str(tmp_path / "ppo.yaml"), "--config", "lr=1e-3", "--config",
                 "net.width=128", "--config", "name=first try", "--tag", "baseline", "--tag", "cpu", "--notes",
                 "from the shell", "--no-progress"]) == 0
    info = trajstore.open(path).run_info("a")
    assert info["config"] == {"algo": "ppo", "net": {"width": 128, "depth": 2}, "lr": 1e-3, "name": "first try"}
    assert info["tags"] == ["baseline", "cpu"] and info["notes"] == "from the shell"
    capsys.readouterr()
    assert main(["runs", "--store", path, "--format", "json"]) == 0
    (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert row["run_id"] == "a" and row["tags"] == "baseline,cpu" and json.loads(row["config"]) == info["config"]
    assert main(["describe", "a", "--store", path, "--config", "algo=sac", "--notes", "renamed"]) == 0
    assert "config {\"algo\": \"sac\"}" in capsys.readouterr().out
    changed = trajstore.open(path).run_info("a")
    assert changed["config"] == {"algo": "sac"} and changed["tags"] == ["baseline", "cpu"]
    assert main(["stats", "--store", path, "--by", "config.algo", "--format", "json",
                 "--include-incomplete"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0])["config.algo"] == "sac"
    for argv, message in [(["--config", "lr"], "--config: expected KEY=VALUE, got 'lr'"),
                          (["--config-file", str(tmp_path / "nope.yaml")], "--config-file: cannot read"),
                          (["--config", "lr=1", "--config", "lr.x=2"], "--config: lr.x nests under lr")]:
        assert main(["describe", "a", "--store", path, *argv]) != 0
        assert message in capsys.readouterr().err


@pytest.mark.server
def test_the_service_shows_and_changes_descriptions_and_remote_writers_describe_runs(tmp_path: Path) -> None:
    from tests.api.helpers import API_KEY, serve, settings_for
    from trajstore.api.app import create_app
    from trajstore.remote.client import Client
    from trajstore.remote.writer import RemoteStore

    path = tmp_path / "store"
    write(trajstore.open(path, create=True), "local", 0, config={"algo": "ppo"}, tags=["a"])
    for live in serve(create_app(settings_for(path))):
        with Client(live.url, api_key=API_KEY) as client:
            assert client.runs()["run_id"].to_pylist() == ["local"]
            run = client.run_info("local")
            assert run["config"] == {"algo": "ppo"} and run["tags"] == ["a"] and run["host"]
            remote = RemoteStore(live.url, api_key=API_KEY)
            with remote.writer(run_id="remote", env_id="E", config={"algo": "dqn"}, tags=["r"]) as w:
                w.add_batch(make_batch(np.random.default_rng(1), 20, 2))
            assert client.run_info("remote")["config"] == {"algo": "dqn"}
            with pytest.raises(Exception, match="another config"):
                remote.writer(run_id="remote", env_id="E", config={"algo": "sac"})
            grouped = httpx.get(live.url + "/stats", params={"by": "config.algo", "include_incomplete": "true"})
            assert [row["config.algo"] for row in grouped.json()] == ["dqn", "ppo"]
            assert client.set_run("remote", tags=["r", "s"])["tags"] == ["r", "s"]
            assert trajstore.open(path).run_info("remote")["tags"] == ["r", "s"]
            sloppy = httpx.patch(live.url + "/runs/remote", json={"tags": ["t"], "replace": 0},
                                 headers={"Authorization": f"Bearer {API_KEY}"})  # 0 is no JSON boolean
            assert sloppy.status_code == 422 and "replace" in sloppy.text
            assert trajstore.open(path).run_info("remote")["tags"] == ["r", "s"]
            with remote.writer(run_id="bare", env_id="E") as w:  # a new run, nothing given: described after its
                w.add_batch(make_batch(np.random.default_rng(2), 20, 2))  # first commit, with the worker's program
            bare = client.run_info("bare")
            assert bare["created"] is not None and bare["trajstore_version"] == trajstore.__version__ and bare["host"]
            unauthorized = Client(live.url)
            with pytest.raises(Exception, match="401|403"):
                unauthorized.set_run("remote", notes="x")
            remote.close()


def test_the_git_commit_is_asked_of_one_git_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each git process is a fork of the (large) Python process: the commit and whether it is dirty come from one."""
    calls: list[list[str]] = []
    real = subprocess.run

    def counted(args: list[str], **kw: Any) -> Any:
        calls.append(args)
        return real(args, **kw)

    monkeypatch.setattr(run_config.subprocess, "run", counted)
    run_config.git_commit(Path(__file__).parent)
    assert len(calls) == 1
