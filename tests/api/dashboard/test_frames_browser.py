"""The dashboard's frame player in headless Chromium: an episode of image observations shows its frames beside the
reward curve, the step slider moves them (each picture compared pixel by pixel with the stored frame), and a
CartPole episode shows no player and asks for no frame. Screenshots land in ``test-artifacts/dashboard/``."""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import pytest

import trajstore
from tests.api.dashboard.helpers import Dashboard
from tests.api.helpers import Live, serve
from tests.helpers import write_pixel_store
from trajstore.api.app import create_app
from trajstore.api.settings import ServiceSettings
from trajstore.rollout import gym_rollout

pytestmark = [pytest.mark.browser, pytest.mark.server]  # the tiers: tests/tiers.py

# The picture as the page shows it, read back through a canvas: its size and its pixels (RGBA).
PIXELS = """() => {
  const img = document.getElementById('frame-img'), c = document.createElement('canvas');
  c.width = img.naturalWidth; c.height = img.naturalHeight;
  const ctx = c.getContext('2d'); ctx.drawImage(img, 0, 0);
  return { w: c.width, h: c.height, data: Array.from(ctx.getImageData(0, 0, c.width, c.height).data) };
}"""


@pytest.fixture(scope="module")
def pixel_store(tmp_path_factory: pytest.TempPathFactory) -> trajstore.Store:
    store = write_pixel_store(tmp_path_factory.mktemp("frames-browser") / "store")
    gym_rollout(store, "CartPole-v1", run_id="cartpole", num_envs=2, episodes=4, seed=0, progress=False)
    return store


@pytest.fixture(scope="module")
def pixel_live(pixel_store: trajstore.Store) -> Iterator[Live]:
    yield from serve(create_app(ServiceSettings(store=str(pixel_store.root))))


@pytest.fixture
def page(context: Any, pixel_live: Live) -> Iterator[Dashboard]:
    p = context.new_page()
    yield Dashboard(p, pixel_live.url)
    p.close()


def shown(dashboard: Dashboard) -> np.ndarray:
    """The player's picture as gray values, or RGB for a colour picture (H, W[, 3])."""
    got = dashboard.page.evaluate(PIXELS)
    rgba = np.array(got["data"], np.uint8).reshape(got["h"], got["w"], 4)
    return rgba[..., :3]


def open_episode(dashboard: Dashboard, env: str) -> str:
    """Filter the episodes table to ``env``, open its first episode of 3 steps or more; returns its id."""
    loads = dashboard.state("table.loads")
    dashboard.page.select_option("#f-env", env)
    dashboard.page.wait_for_function(f"() => trajstoreDashboard.table.loads > {loads}")
    rows = dashboard.page.locator("#episodes tbody tr")
    row = next(rows.nth(i) for i in range(rows.count())
               if int(rows.nth(i).locator("td:nth-child(5)").inner_text().replace(",", "")) >= 3)
    episode_id = row.get_attribute("data-episode-id")
    row.click()
    dashboard.page.wait_for_function(f"() => trajstoreDashboard.episode && trajstoreDashboard.episode.id === "
                                     f"'{episode_id}'")
    return episode_id


def wait_frame(dashboard: Dashboard, step: int, leaf: str = "obs") -> None:
    dashboard.page.wait_for_function(f"() => trajstoreDashboard.frame && trajstoreDashboard.frame.shown && "
                                     f"trajstoreDashboard.frame.shown.step === {step} && "
                                     f"trajstoreDashboard.frame.shown.leaf === '{leaf}'")


def test_frames_play_beside_the_reward_curve(page: Dashboard, pixel_store: trajstore.Store) -> None:
    frame_requests: list[str] = []
    page.page.on("request", lambda r: "/frames" in r.url and frame_requests.append(r.url))
    page.open()
    episode_id = open_episode(page, "Stacks-v0")
    stored = pixel_store.scan(["step", "obs"], episode_id=int(episode_id)).read_all().sort_by("step")
    newest = [np.array(o, np.uint8)[-1] for o in stored["obs"].to_pylist()]  # each step's newest frame (24, 32)
    wait_frame(page, 0)
    assert page.page.locator("#ep-frames").is_visible() and page.page.locator("#ep-reward").is_visible()
    assert not page.page.locator("#ep-obs").is_visible()  # pixels are not plotted as 768 lines
    box, reward = page.page.locator("#ep-frames").bounding_box(), page.page.locator("#ep-reward").bounding_box()
    assert box["x"] > reward["x"] + reward["width"] - 1 and abs(box["y"] - reward["y"]) < 40  # beside it

    def check(step: int) -> None:
        picture = shown(page)
        assert picture.shape[:2] == (240, 320)  # 24x32 drawn 10 times larger by the service
        for channel in range(3):  # gray: R = G = B = the stored frame, each pixel a 10x10 block
            np.testing.assert_array_equal(picture[::10, ::10, channel], newest[step])

    check(0)
    page.page.focus("#frame-step")
    page.page.keyboard.press("ArrowRight")
    wait_frame(page, 1)
    check(1)
    last = len(newest) - 1
    page.page.keyboard.press("End")
    wait_frame(page, last)
    check(last)
    assert page.page.locator("#frame-label").inner_text() == f"{last} of {last}"
    shapes = page.page.evaluate("() => document.getElementById('ep-reward').layout.shapes")
    assert [s["x0"] for s in shapes] == [last]  # the step is marked on the reward curve
    assert page.state("frame.requests") == len(frame_requests) == 3
    page.screenshot("frames", "#episode")
    assert page.problems == []


def test_a_dict_observation_shows_its_picture_leaf(page: Dashboard, pixel_store: trajstore.Store) -> None:
    page.open()
    episode_id = open_episode(page, "Rgb-v0")
    wait_frame(page, 0, "obs.pixels")
    stored = pixel_store.scan(["step", "obs"], episode_id=int(episode_id)).read_all().sort_by("step")
    rgb = np.array(stored["obs"][0].as_py()["pixels"], np.uint8)  # (16, 20, 3)
    picture = shown(page)
    assert picture.shape == (256, 320, 3)  # 16x20 drawn 16 times larger
    np.testing.assert_array_equal(picture[::16, ::16], rgb)
    assert page.page.locator("#frame-leaf-label").is_hidden()  # one picture leaf: nothing to choose
    assert page.problems == []


def test_cartpole_has_no_frame_player_and_asks_for_no_frame(page: Dashboard) -> None:
    asked: list[str] = []
    page.page.on("request", lambda r: "/frames" in r.url and asked.append(r.url))
    page.open()
    open_episode(page, "CartPole-v1")
    page.page.wait_for_function("() => trajstoreDashboard.timings.episode_ms > 0")
    assert page.page.locator("#ep-frames").is_hidden()
    assert page.page.locator("#ep-obs").is_visible()
    assert len(page.traces("ep-obs")) == 4  # CartPole's four observation dimensions, plotted as before
    assert page.state("frame") is None and asked == []
    assert page.problems == []
