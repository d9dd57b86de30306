"""Helpers for the dashboard's tests: a store of learning runs, where Chromium is, and a :class:`Dashboard`
page that records every console error, failed request and request to another host."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import trajstore
from tests.api.dashboard.synthetic import write_learning_runs
from trajstore.rollout import gym_rollout

ROOT = Path(__file__).resolve().parents[3]
ARTIFACTS = ROOT / "test-artifacts" / "dashboard"
CHROMIUM = Path(os.environ.get("TRAJSTORE_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"]


def write_demo_store(path: Path) -> trajstore.Store:
    """Three synthetic learning runs (extras, policy versions) and a gymnasium Acrobot run with unfinished episodes."""
    store = trajstore.open(path, create=True)
    write_learning_runs(store, episodes=1200, runs=3, num_envs=16, versions=6)
    gym_rollout(store, "Acrobot-v1", run_id="acrobot-random", num_envs=2, steps=1100, seed=2, progress=False)
    return store


class Dashboard:
    """One page of the dashboard, recording console errors, page errors, failed requests and foreign hosts."""

    def __init__(self, page: Any, url: str) -> None:
        self.page, self.url = page, url
        self.problems: list[str] = []
        page.on("console", lambda m: m.type == "error" and self.problems.append(f"console error: {m.text}"))
        page.on("pageerror", lambda e: self.problems.append(f"page error: {e}"))
        page.on("requestfailed", lambda r: self.problems.append(f"request failed: {r.url} {r.failure}"))
        page.on("response", lambda r: r.status >= 400 and self.problems.append(f"HTTP {r.status}: {r.url}"))
        page.on("request", lambda r: r.url.startswith(("http:", "https:")) and not r.url.startswith(url)
                and self.problems.append(f"request to another host: {r.url}"))

    def open(self, path: str = "/dashboard") -> None:
        self.page.goto(self.url + path)
        self.wait_ready()

    STATE = "trajstoreDashboard"  # the page's state object, a global of its script

    def wait_ready(self) -> None:
        g = self.STATE
        self.page.wait_for_function(f"() => window.{g} && ({g}.ready || {g}.errors.length > 0)")
        assert self.state("errors") == [], self.problems

    def state(self, name: str) -> Any:
        return self.page.evaluate(f"() => window.{self.STATE}.{name}")

    def traces(self, plot: str) -> list[dict[str, Any]]:
        """The traces of one Plotly div: type, name, meta and the x and y arrays."""
        return self.page.evaluate("(id) => document.getElementById(id).data.map((t) => ({type: t.type, name: t.name,"
                                  " meta: t.meta || null, x: Array.from(t.x), y: t.y ? Array.from(t.y) : null}))", plot)

    def episode_points(self) -> dict[str, int]:
        """Number of episode markers in the learning curves, per ``run · env`` series."""
        return {t["meta"]["key"]: len(t["x"]) for t in self.traces("curves")
                if t["meta"] and t["meta"].get("kind") == "episodes"}

    def screenshot(self, name: str, selector: str | None = None, *, full_page: bool = True) -> Path:
        """``test-artifacts/dashboard/<name>.png``: the element ``selector``, or the page from its top."""
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        if selector:
            self.page.locator(selector).screenshot(path=str(path))
        else:
            self.page.evaluate("() => window.scrollTo(0, 0)")
            self.page.screenshot(path=str(path), full_page=full_page)
        return path
