"""Export to LeRobot's dataset format v3.0: the real lerobot release opens it and serves the store's steps frame
by frame (run in its own venv, `make lerobot-venv`, since it needs Python >= 3.12 and its own torch); a plain
Parquet reader finds the same layout; bad destinations and failed exports leave nothing behind."""

from __future__ import annotations

import io
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import trajstore
from tests.helpers import make_batch, stacked_stream
from trajstore import cli
from trajstore.errors import InputError, RunNotFoundError
from trajstore.export import episodes as selection_module
from trajstore.export import lerobot as lr
from trajstore.export.lerobot import export_lerobot
from trajstore.schema import to_numpy

ROOT = Path(__file__).resolve().parents[2]
LEROBOT_PYTHON = Path(os.environ.get("TRAJSTORE_TEST_LEROBOT_PYTHON", ROOT / ".venv-lerobot" / "bin" / "python"))
CHECK = Path(__file__).with_name("lerobot_check.py")


def steps(store: trajstore.Store, **selection: Any) -> dict[str, np.ndarray]:
    """The selected steps in export order (episode_id, step), of complete episodes (what an export holds unless
    asked for more): the plain reference the exports are checked on."""
    ids = store.episodes(**selection, complete=True)["episode_id"].to_pylist()
    rows = store.sql("SELECT episode_id, env_id, obs, action, next_obs, reward, terminated, truncated FROM steps "
                     f"WHERE episode_id IN ({', '.join(map(str, ids))}) ORDER BY episode_id, step")
    out = {name: to_numpy(rows[name]) for name in rows.column_names if name != "env_id"}
    out["env_id"] = np.array(rows["env_id"].to_pylist())
    return out


def write(store: trajstore.Store, run_id: str, env_id: str, batch: dict[str, Any]) -> None:
    with store.writer(run_id=run_id, env_id=env_id) as w:
        w.add_batch(batch)


def cartpole_like(store: trajstore.Store) -> None:
    rng = np.random.default_rng(0)
    write(store, "r", "EnvA-v0", make_batch(rng, 60, 4, obs_dim=4))
    write(store, "r", "EnvB-v0", make_batch(rng, 40, 3, obs_dim=4))
    write(store, "other", "EnvA-v0", make_batch(rng, 10, 2, obs_dim=4))


@pytest.fixture
def small_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    """Exports read a few episodes at a time (not the whole small store at once)."""
    monkeypatch.setattr(selection_module, "GROUP_BYTES", 2_000)


def test_the_v3_layout_as_a_plain_parquet_reader_sees_it(store: trajstore.Store, tmp_path: Path,
                                                         small_groups: None) -> None:
    cartpole_like(store)
    want = steps(store, run_id="r")
    result = export_lerobot(store, tmp_path / "out", run_id="r", fps=10, chunk_size=2, file_size_mb=0.004)
    root = tmp_path / "out"
    info = json.loads((root / "meta/info.json").read_text())
    ids = want["episode_id"]
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    assert (info["codebase_version"], info["fps"], info["total_frames"], info["total_episodes"]) == \
        ("v3.0", 10, len(ids), len(starts)) == ("v3.0", 10, result.steps, result.episodes)
    assert info["data_path"] == "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
    assert info["features"]["observation.state"] == {"dtype": "float32", "shape": [4], "names": None}
    assert info["features"]["action"] == {"dtype": "int64", "shape": [1], "names": None}  # a scalar per step
    files = sorted(root.glob("data/chunk-*/file-*.parquet"))
    assert len(files) > 2 and len({f.parent for f in files}) > 1  # many files, in several chunk folders
    frames = pa.concat_tables([pq.read_table(f) for f in files])
    assert frames.schema.field("action").type == "int64"
    np.testing.assert_array_equal(to_numpy(frames["observation.state"]), want["obs"])
    np.testing.assert_array_equal(frames["action"].to_numpy(), want["action"])
    np.testing.assert_array_equal(to_numpy(frames["next.observation.state"]), want["next_obs"])
    np.testing.assert_array_equal(frames["next.reward"].to_numpy(), want["reward"])
    np.testing.assert_array_equal(frames["next.done"].to_numpy(zero_copy_only=False),
                                  want["terminated"] | want["truncated"])
    assert frames["index"].to_pylist() == list(range(len(ids)))
    episodes = pa.concat_tables(
        [pq.read_table(f) for f in sorted(root.glob("meta/episodes/chunk-*/file-*.parquet"))])
    assert episodes["trajstore/episode_id"].to_pylist() == ids[starts].tolist()
    assert episodes["dataset_from_index"].to_pylist() == starts.tolist()
    assert episodes["episode_index"].to_pylist() == list(range(len(starts)))
    for e in episodes.to_pylist():  # each episode is in the file its row names
        path = root / info["data_path"].format(chunk_index=e["data/chunk_index"], file_index=e["data/file_index"])
        rows = pq.read_table(path)
        mine = rows.filter(pc.equal(rows["episode_index"], e["episode_index"]))
        assert mine["index"].to_pylist() == list(range(e["dataset_from_index"], e["dataset_to_index"]))
    lengths = dict(zip(episodes["episode_index"].to_pylist(), episodes["length"].to_pylist()))
    for f in files:  # row groups of whole episodes
        parquet = pq.ParquetFile(f)
        for g in range(parquet.num_row_groups):
            rows = parquet.read_row_group(g, columns=["episode_index", "frame_index"])
            assert rows["frame_index"][0].as_py() == 0
            assert rows["frame_index"][-1].as_py() == lengths[rows["episode_index"][-1].as_py()] - 1
    total = json.loads((root / "meta/stats.json").read_text())
    assert total["observation.state"]["count"] == [len(ids)]
    np.testing.assert_allclose(total["observation.state"]["mean"], want["obs"].astype(np.float64).mean(axis=0),
                               rtol=1e-9)
    np.testing.assert_allclose(total["next.reward"]["std"], [want["reward"].astype(np.float64).std()], rtol=1e-6)
    assert total["action"]["max"] == [float(want["action"].max())]
    tasks = pq.read_table(root / "meta/tasks.parquet").to_pandas()
    assert tasks.index.name == "task" and tasks.to_dict()["task_index"] == {"EnvA-v0": 0, "EnvB-v0": 1}


def test_a_condition_selects_the_episodes(store: trajstore.Store, tmp_path: Path, small_groups: None) -> None:
    cartpole_like(store)
    where = "episode_length > 3 AND env_id = 'EnvB-v0' OR episode_id % 3 = 0"
    result = export_lerobot(store, tmp_path / "out", where=where)
    chosen = store.episodes(where=where, complete=True)
    episodes = pq.read_table(tmp_path / "out/meta/episodes/chunk-000/file-000.parquet")
    assert episodes["trajstore/episode_id"].to_pylist() == chosen["episode_id"].to_pylist()
    assert episodes["trajstore/run_id"].to_pylist() == chosen["run_id"].to_pylist()
    assert episodes["trajstore/env_id"].to_pylist() == chosen["env_id"].to_pylist() == \
        [list(t)[0] for t in episodes["tasks"].to_pylist()]
    assert result.runs == ["other", "r"] and result.steps == chosen["episode_length"].to_numpy().sum()
    frames = pq.read_table(tmp_path / "out/data/chunk-000/file-000.parquet")
    np.testing.assert_array_equal(to_numpy(frames["observation.state"]), steps(store, where=where)["obs"])


def test_episode_statistics_match_numpy_per_episode() -> None:
    rng = np.random.default_rng(1)
    lengths = np.array([1, 5, 2, 9])
    values = rng.standard_normal((lengths.sum(), 3))
    got = lr.stats.episode_stats(values, lengths)
    for i, (a, n) in enumerate(zip(np.r_[0, np.cumsum(lengths)[:-1]], lengths)):
        part = values[a:a + n]
        np.testing.assert_allclose(got["mean"][i], part.mean(axis=0))
        np.testing.assert_allclose(got["std"][i], part.std(axis=0), atol=1e-12)
        np.testing.assert_allclose(got["q10"][i], np.quantile(part, 0.10, axis=0))
        np.testing.assert_allclose(got["q99"][i], np.quantile(part, 0.99, axis=0))
        assert got["count"][i].tolist() == [n]


def _other_shapes(tmp: Path) -> list[tuple[trajstore.Store, str]]:
    """Stores whose steps LeRobot declares differently: a one-element Box action (Pendulum's), 2-D
    observations, scalar (Discrete) observations."""
    rng = np.random.default_rng(2)
    out = []
    T, B = 50, 3
    pendulum = trajstore.open(tmp / "pendulum", create=True)
    batch = make_batch(rng, T, B, obs_dim=3)
    batch["action"] = rng.uniform(-2, 2, (T, B, 1)).astype(np.float32)
    write(pendulum, "r", "Pendulum-v1", batch)
    out.append((pendulum, "pendulum"))
    grid = trajstore.open(tmp / "grid", create=True)
    batch = make_batch(rng, T, B)
    batch["obs"], batch["next_obs"] = (rng.standard_normal((T, B, 2, 3)).astype(np.float32) for _ in range(2))
    write(grid, "r", "Grid-v0", batch)
    out.append((grid, "grid"))
    discrete = trajstore.open(tmp / "discrete", create=True)
    batch = make_batch(rng, T, B)
    batch["obs"], batch["next_obs"] = (rng.integers(0, 16, (T, B)) for _ in range(2))
    write(discrete, "r", "FrozenLake-v1", batch)
    out.append((discrete, "discrete"))
    return out


def _picture_stores(tmp: Path) -> list[tuple[trajstore.Store, str]]:
    """Stores of uint8 pictures: gray frame stacks (4, 24, 32) declared with ``frame_stack``, as
    FrameStackObservation gives them (padded at each episode's start with its first frame), and RGB pictures
    channels first (3, 16, 20)."""
    rng = np.random.default_rng(3)
    stacks = trajstore.open(tmp / "stacks", create=True)
    with stacks.writer(run_id="r", env_id="Stacks-v0", frame_stack={"obs": 4}) as w:
        w.add_batch(stacked_stream(rng, 60, 3, shape=(24, 32), noise=True, p_end=0.06))
    rgb = trajstore.open(tmp / "rgb", create=True)
    batch = make_batch(rng, 40, 2)
    pictures = rng.integers(0, 256, (41, 2, 3, 16, 20), dtype=np.uint8)
    batch["obs"], batch["next_obs"] = pictures[:-1], pictures[1:]
    write(rgb, "r", "RgbChw-v0", batch)
    return [(stacks, "stacks"), (rgb, "rgb")]


def picture_reference(want: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What LeRobot must serve for stored pictures, ``(C, H, W)``: a stack's newest frame (and the whole stack,
    which delta_timestamps restacks), or an RGB picture as stored channels first."""
    if want["obs"].ndim == 4 and want["obs"].shape[1] == 4:  # (k, H, W) stacks of gray frames
        return {"obs_picture": want["obs"][:, -1, None], "next_obs_picture": want["next_obs"][:, -1, None],
                "obs_stack": want["obs"][:, :, None]}
    return {"obs_picture": want["obs"], "next_obs_picture": want["next_obs"]}


def test_picture_observations_are_png_image_features(tmp_path: Path, small_groups: None) -> None:
    from PIL import Image

    for store, name in _picture_stores(tmp_path / "stores"):
        want = steps(store)
        want.update(picture_reference(want))
        export_lerobot(store, tmp_path / name, fps=10)
        info = json.loads((tmp_path / name / "meta/info.json").read_text())
        c, h, w = want["obs_picture"].shape[1:]
        for feature in ("observation.image", "next.observation.image"):
            assert info["features"][feature] == {"dtype": "image", "shape": [h, w, c],
                                                 "names": ["height", "width", "channels"]}
        assert "observation.state" not in info["features"]
        stats = json.loads((tmp_path / name / "meta/stats.json").read_text())["observation.image"]
        assert np.array(stats["mean"]).shape == (c, 1, 1)
        np.testing.assert_allclose(np.array(stats["mean"]).reshape(c),
                                   want["obs_picture"].mean(axis=(0, 2, 3)) / 255, rtol=1e-6)
        frames = pa.concat_tables([pq.read_table(f) for f in sorted((tmp_path / name).glob("data/*/*.parquet"))])
        for feature, column in (("observation.image", "obs_picture"), ("next.observation.image", "next_obs_picture")):
            decoded = [np.array(Image.open(io.BytesIO(v["bytes"]))) for v in frames[feature].to_pylist()]
            got = np.stack(decoded).reshape(len(decoded), h, w, c).transpose(0, 3, 1, 2)
            np.testing.assert_array_equal(got, want[column])


@pytest.mark.lerobot
@pytest.mark.skipif(not LEROBOT_PYTHON.exists(), reason="no lerobot venv: build it with `make lerobot-venv` "
                                                        "(needs Python >= 3.12)")
def test_the_real_lerobot_opens_the_export(store: trajstore.Store, tmp_path: Path, small_groups: None) -> None:
    cartpole_like(store)
    cases = [(store, "cartpole", {"run_id": "r"}, {"chunk_size": 2, "file_size_mb": 0.004})]
    cases += [(s, name, {}, {}) for s, name in _other_shapes(tmp_path / "stores")]
    cases += [(s, name, {}, {}) for s, name in _picture_stores(tmp_path / "pictures")]
    listed = []
    for s, name, selection, options in cases:
        export_lerobot(s, tmp_path / name, fps=15, **selection, **options)
        want = steps(s, **selection)
        if name in ("stacks", "rgb"):
            want.update(picture_reference(want))
        np.savez(tmp_path / f"{name}.npz", fps=15, **want)
        listed.append({"root": str(tmp_path / name), "expected": str(tmp_path / f"{name}.npz")})
    (tmp_path / "cases.json").write_text(json.dumps(listed))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "PYTHONPATH": ""}
    done = subprocess.run([str(LEROBOT_PYTHON), str(CHECK), str(tmp_path / "cases.json")], capture_output=True,
                          text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-6000:]
    assert done.stdout.count("OK ") == len(cases), done.stdout


def test_bad_destinations_are_refused_in_one_line(store: trajstore.Store, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    cartpole_like(store)
    (tmp_path / "afile").write_text("x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("x")
    for folder, message in [("afile", "exists and is not a folder"), ("full", "exists and is not empty"),
                            ("afile/sub", "afile is a file, not a folder")]:
        with pytest.raises(InputError, match=f"folder: .*{message}"):
            export_lerobot(store, tmp_path / folder)
        assert cli.main(["export", "lerobot", "--store", str(store.root), str(tmp_path / folder)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err
    with pytest.raises(RunNotFoundError, match="run_id: no run 'nope'"):
        export_lerobot(store, tmp_path / "new", run_id="nope")
    with pytest.raises(InputError, match="run_id/where: nothing to export"):
        export_lerobot(store, tmp_path / "new", where="episode_length < 0")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "full", "store"]
    assert sorted(p.name for p in (tmp_path / "full").iterdir()) == ["keep.txt"]
    if os.geteuid() != 0:  # root writes anywhere
        (tmp_path / "locked").mkdir(mode=0o500)
        with pytest.raises(InputError, match="folder: cannot write in .*locked"):
            export_lerobot(store, tmp_path / "locked" / "out")


def test_a_failed_or_interrupted_export_leaves_nothing(store: trajstore.Store, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch, small_groups: None) -> None:
    cartpole_like(store)
    calls = {"n": 0}
    real = lr.RollingFiles.add

    def interrupted(self: lr.RollingFiles, *args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    monkeypatch.setattr(lr.RollingFiles, "add", interrupted)
    with pytest.raises(KeyboardInterrupt):
        export_lerobot(store, tmp_path / "deep" / "er" / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"]  # no folder, no parents, no hidden stage
    (tmp_path / "empty").mkdir()
    calls["n"] = 0
    with pytest.raises(KeyboardInterrupt):
        export_lerobot(store, tmp_path / "empty")
    assert list((tmp_path / "empty").iterdir()) == []
    monkeypatch.setattr(lr.RollingFiles, "add", real)
    result = export_lerobot(store, tmp_path / "empty")  # an empty folder is fine
    assert result.steps == store.sql("SELECT sum(episode_length) AS n FROM episodes WHERE complete")["n"][0].as_py()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "store"]


def test_an_export_holds_complete_episodes_unless_asked(store: trajstore.Store, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """A rollout stopped mid-episode leaves fragments; an export holds the complete episodes, and the fragments
    too with --include-unfinished."""
    from trajstore.rollout import gym_rollout

    gym_rollout(store, "CartPole-v1", run_id="r", num_envs=4, episodes=10, seed=0, progress=False)
    every = store.episodes(run_id="r")
    complete = store.episodes(run_id="r", complete=True)
    assert 0 < complete.num_rows < every.num_rows
    for flags, want in (([], complete), (["--include-unfinished"], every)):
        out = tmp_path / f"out{len(flags)}"
        assert cli.main(["export", "lerobot", str(out), "--store", str(store.root), *flags]) == 0
        exported = pq.read_table(out / "meta/episodes/chunk-000/file-000.parquet")
        assert sorted(exported["trajstore/episode_id"].to_pylist()) == sorted(want["episode_id"].to_pylist())
        assert f"exported {want.num_rows} episode(s)" in capsys.readouterr().out
