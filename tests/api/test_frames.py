"""GET /episodes/{id}/frames: one step's image observation as a PNG drawn at the size asked for, and /schema's
``images`` (which observation leaves are pictures); nothing for environments without pictures."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image

import trajstore
from tests.api.helpers import settings_for
from tests.helpers import write_pixel_store
from trajstore.api.app import create_app

JSON = {"Accept": "application/json"}


@pytest.fixture(scope="module")
def pixels(tmp_path_factory: pytest.TempPathFactory) -> trajstore.Store:
    return write_pixel_store(tmp_path_factory.mktemp("frames") / "store")


@pytest.fixture(scope="module")
def client(pixels: trajstore.Store) -> Iterator[TestClient]:
    with TestClient(create_app(settings_for(Path(pixels.root), max_frame_size=400))) as c:
        yield c


def first_episode(store: trajstore.Store, env_id: str, min_length: int = 3) -> dict[str, Any]:
    return next(e for e in store.episodes(env_id=env_id).to_pylist() if e["episode_length"] >= min_length)


def stored_obs(store: trajstore.Store, episode_id: int) -> list[Any]:
    """Every step's obs of one episode, as scan returns them (in step order)."""
    t = store.scan(["step", "obs"], episode_id=episode_id).read_all().sort_by("step")
    assert t["step"].to_pylist() == list(range(t.num_rows))
    return t["obs"].to_pylist()


def picture(body: bytes) -> np.ndarray:
    img = Image.open(io.BytesIO(body))
    assert img.format == "PNG"
    return np.array(img)


def test_a_frame_stack_shows_its_newest_frame_as_stored(client: TestClient, pixels: trajstore.Store) -> None:
    ep = first_episode(pixels, "Stacks-v0")
    obs = stored_obs(pixels, ep["episode_id"])
    for step in (0, 1, ep["episode_length"] - 1):
        r = client.get(f"/episodes/{ep['episode_id']}/frames", params={"step": step})
        assert r.status_code == 200 and r.headers["content-type"] == "image/png"
        newest = np.array(obs[step], np.uint8)[-1]  # (4, 24, 32): the last frame of the stack
        np.testing.assert_array_equal(picture(r.content), newest)
    assert not np.array_equal(np.array(obs[0])[-1], np.array(obs[1])[-1])  # the steps really differ


def test_size_scales_the_longer_side(client: TestClient, pixels: trajstore.Store) -> None:
    ep = first_episode(pixels, "Stacks-v0")
    newest = np.array(stored_obs(pixels, ep["episode_id"])[2], np.uint8)[-1]
    big = picture(client.get(f"/episodes/{ep['episode_id']}/frames", params={"step": 2, "size": 320}).content)
    assert big.shape == (240, 320)  # 24x32 enlarged 10 times, each pixel a sharp 10x10 block
    np.testing.assert_array_equal(big, np.kron(newest, np.ones((10, 10), np.uint8)))
    small = picture(client.get(f"/episodes/{ep['episode_id']}/frames", params={"step": 2, "size": 16}).content)
    assert small.shape == (12, 16)  # halved: each pixel the mean of a 2x2 block
    means = newest.reshape(12, 2, 16, 2).astype(float).mean(axis=(1, 3))
    assert np.abs(small.astype(float) - means).max() <= 1
    capped = picture(client.get(f"/episodes/{ep['episode_id']}/frames", params={"step": 2, "size": 10**9}).content)
    assert capped.shape == (300, 400)  # at most the server's max_frame_size (400 here), as limit= is capped


def test_a_dict_observation_shows_its_picture_leaf(client: TestClient, pixels: trajstore.Store) -> None:
    ep = first_episode(pixels, "Rgb-v0")
    obs = stored_obs(pixels, ep["episode_id"])
    r = client.get(f"/episodes/{ep['episode_id']}/frames", params={"step": 1, "leaf": "obs.pixels"})
    got = picture(r.content)
    assert got.shape == (16, 20, 3)
    np.testing.assert_array_equal(got, np.array(obs[1]["pixels"], np.uint8))
    same = client.get(f"/episodes/{ep['episode_id']}/frames", params={"step": 1})  # the first picture leaf
    assert same.content == r.content


def test_schema_lists_the_picture_leaves_and_none_for_vectors(client: TestClient) -> None:
    def images(env: str) -> list[dict[str, Any]]:
        r = client.get("/schema", params={"env_id": env}, headers=JSON)
        assert r.status_code == 200
        return r.json()["images"]

    assert images("Stacks-v0") == [{"leaf": "obs", "shape": [4, 24, 32], "dtype": "uint8", "stack": 4,
                                    "height": 24, "width": 32, "channels": 1}]
    assert images("Rgb-v0") == [{"leaf": "obs.pixels", "shape": [16, 20, 3], "dtype": "uint8", "stack": None,
                                 "height": 16, "width": 20, "channels": 3}]
    assert images("Vector-v0") == []


def test_bad_parameters_are_named(client: TestClient, pixels: trajstore.Store) -> None:
    ep = first_episode(pixels, "Stacks-v0")
    url = f"/episodes/{ep['episode_id']}/frames"
    n = ep["episode_length"]
    cases = [({"step": n}, 404, "step", f"has {n} step(s), 0 to {n - 1}"), ({"step": -1}, 422, "step", ""),
             ({}, 422, "step", "required"), ({"step": 0, "size": 0}, 422, "size", ""),
             ({"step": 0, "leaf": "obs.nope"}, 404, "leaf", "its image leaves: obs"), ({"step": "x"}, 422, "step", "")]
    for params, status, name, words in cases:
        r = client.get(url, params=params)
        assert r.status_code == status, (params, r.text)
        detail = r.json()["detail"]
        assert name in detail and words in detail, (params, detail)


def test_unknown_episodes_and_vector_observations_have_no_frames(client: TestClient,
                                                                 pixels: trajstore.Store) -> None:
    r = client.get("/episodes/12345/frames", params={"step": 0})
    assert r.status_code == 404 and "episode_id 12345" in r.json()["detail"]
    vector = first_episode(pixels, "Vector-v0")
    r = client.get(f"/episodes/{vector['episode_id']}/frames", params={"step": 0})
    assert r.status_code == 404 and "hold no image" in r.json()["detail"]
    assert r.headers["content-type"].startswith("application/problem+json")
