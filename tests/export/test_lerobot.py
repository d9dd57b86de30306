"""Export to LeRobot's chunked Parquet layout: a plain Parquet reader finds every episode, step and value."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

import trajstore
from tests.helpers import make_batch
from trajstore.errors import InputError
from trajstore.export.lerobot import export_lerobot


def test_round_trip_through_plain_parquet(store: trajstore.Store, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    with store.writer(run_id="r", env_id="E") as w:
        w.add_batch(make_batch(rng, 30, 3, obs_dim=4))
    result = export_lerobot(store, tmp_path / "out", run_id="r", chunk_size=4, fps=10)
    info = json.loads((tmp_path / "out/meta/info.json").read_text())
    stored = store.episodes(run_id="r")
    assert info["total_episodes"] == result.episodes == stored.num_rows
    assert info["total_frames"] == result.steps == stored["episode_length"].to_numpy().sum()
    assert info["features"]["observation.state"]["shape"] == [4]
    lines = [json.loads(x) for x in (tmp_path / "out/meta/episodes.jsonl").read_text().splitlines()]
    assert [x["episode_id"] for x in lines] == stored["episode_id"].to_pylist()
    assert [x["length"] for x in lines] == stored["episode_length"].to_pylist()
    assert len(list((tmp_path / "out/data").iterdir())) == info["total_chunks"] == -(-stored.num_rows // 4)
    frames = ds.dataset(tmp_path / "out/data", format="parquet").to_table().sort_by("index")
    assert frames["index"].to_pylist() == list(range(info["total_frames"]))
    for line in lines:
        path = tmp_path / "out" / info["data_path"].format(episode_chunk=line["episode_index"] // 4,
                                                           episode_index=line["episode_index"])
        got = pq.read_table(path)
        steps = store.sql(f"SELECT obs, reward, terminated, truncated FROM steps WHERE episode_id = "
                          f"{line['episode_id']} ORDER BY step")
        np.testing.assert_array_equal(np.array(got["observation.state"].to_pylist()),
                                      np.array(steps["obs"].to_pylist()))
        np.testing.assert_array_equal(got["next.reward"].to_numpy(), steps["reward"].to_numpy())
        assert got["next.terminated"].to_pylist() == steps["terminated"].to_pylist()
        assert got["frame_index"].to_pylist() == list(range(line["length"]))
        np.testing.assert_allclose(got["timestamp"].to_numpy(), np.arange(line["length"]) / 10)
    with pytest.raises(InputError, match="folder: .* exists and is not empty"):
        export_lerobot(store, tmp_path / "out", run_id="r")
