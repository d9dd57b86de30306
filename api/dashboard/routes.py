"""Routes of the dashboard: the page, its assets, and ``/curves`` (learning-curve data as columns)."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse

from trajstore.store import Store

router = APIRouter()
HERE = Path(__file__).resolve().parent
ASSETS = {"dashboard.js": "text/javascript", "dashboard.css": "text/css"}


@lru_cache(maxsize=1)
def plotly_js() -> Path:
    """Plotly.js as shipped inside the installed ``plotly`` Python package (nothing fetched from a CDN)."""
    path = Path(str(resources.files("plotly") / "package_data" / "plotly.min.js"))
    if not path.is_file():
        raise HTTPException(status_code=500, detail="plotly.min.js is missing from the installed plotly package")
    return path


@router.get("/", include_in_schema=False)
def root() -> RedirectResponse:
    return RedirectResponse("/dashboard")


@router.get("/dashboard", response_class=HTMLResponse, tags=["dashboard"], summary="The dashboard page")
def dashboard() -> HTMLResponse:
    return HTMLResponse((HERE / "page.html").read_text())


@router.get("/dashboard/assets/{name}", include_in_schema=False)
def asset(name: str) -> FileResponse:
    if name == "plotly.min.js":
        return FileResponse(plotly_js(), media_type="text/javascript",
                            headers={"Cache-Control": "public, max-age=86400"})
    if name not in ASSETS:
        raise HTTPException(status_code=404, detail=f"no dashboard asset {name!r}")
    return FileResponse(HERE / name, media_type=ASSETS[name])


def curves_payload(store: Store, *, run_id: list[str] | None, env_id: list[str] | None,
                   gamma: float | None) -> dict[str, Any]:
    """Complete episodes of each (run, env) in the order they ended, as JSON-ready columns."""
    eps = store.episodes(run_id=run_id, env_id=env_id, complete=True, gamma=gamma, order_by="ended_at")
    series = []
    if eps.num_rows:
        keys = pc.binary_join_element_wise(eps["run_id"], eps["env_id"], "\x00")
        for key in pc.unique(keys).to_pylist():
            series.append(_series(eps.filter(pc.equal(keys, key)), gamma is not None))
    return {"gamma": gamma, "series": series}


def _series(t: pa.Table, discounted: bool) -> dict[str, Any]:
    lengths = t["episode_length"].to_numpy()
    ended = t["ended_at"].cast(pa.int64()).to_numpy() / 1e6
    out: dict[str, Any] = {
        "run_id": t["run_id"][0].as_py(), "env_id": t["env_id"][0].as_py(),
        "episode_id": [str(i) for i in t["episode_id"].to_pylist()],
        "env_steps": np.cumsum(lengths).tolist(),
        "wall_time": np.round(ended, 3).tolist(),
        "episode_return": t["episode_return"].to_pylist(),
        "episode_length": lengths.tolist(),
        "terminated": t["terminated"].to_pylist(),
    }
    if "policy_version" in t.column_names:
        out["policy_version"] = t["policy_version"].to_pylist()
    if discounted:
        out["discounted_return"] = t["discounted_return"].to_pylist()
    return out


def _store(request: Request) -> Store:
    store = getattr(request.app.state, "store", None)
    if store is None:
        raise HTTPException(status_code=503, detail="the service has no store open")
    return store


@router.get("/curves", tags=["dashboard"], summary="Learning curves: complete episodes per run in end order")
def curves(request: Request,
           run_id: Annotated[list[str], Query(description="runs to include (all by default)")] = [],  # noqa: B006
           env_id: Annotated[list[str], Query(description="envs to include (all by default)")] = [],  # noqa: B006
           gamma: Annotated[float | None, Query(ge=0, le=1, description="adds discounted_return")] = None,
           ) -> dict[str, Any]:
    return curves_payload(_store(request), run_id=run_id or None, env_id=env_id or None, gamma=gamma)


