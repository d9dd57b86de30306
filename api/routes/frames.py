"""Frames: one step of an episode's image observation as a PNG, drawn on the server at the size asked for.

The dashboard's frame player asks for one frame per step it shows (``GET /episodes/{id}/frames?step=&size=``).
Which observation leaves are pictures, and how one becomes a picture (a frame stack shows its newest frame,
channels first or last), is :mod:`trajstore.query.pictures`; ``GET /schema?env_id=`` lists them (``images``), so a page
learns whether there is anything to draw before asking. A frame is read by a scan of its episode that holds one
bounded batch at a time (``stream_batch_bytes``) and stops at the step, and is drawn at most
``max_frame_size`` pixels on its longer side.
"""

from __future__ import annotations

from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, HTTPException, Path, Query
from fastapi.responses import Response

from trajstore.api.deps import ReadStoreDep, SettingsDep
from trajstore.api.ints import INT64, Int64
from trajstore.api.problems import problem_response
from trajstore.query.filters import EpisodeFilter
from trajstore.query.pictures import ImageLeaf, leaf_values, png
from trajstore.storage.encoding import fixed_numpy
from trajstore.store import Store, plumbing

router = APIRouter(tags=["episodes"])
CACHE = "private, max-age=3600"  # a committed step's frame does not change


@router.get("/episodes/{episode_id}/frames", response_class=Response,
            summary="One step's image observation as a PNG, its longer side scaled to size pixels",
            responses={200: {"content": {"image/png": {}}},
                       404: problem_response(404, "no such episode, step or image leaf (named), or the episode's "
                                                  "observations hold no image"),
                       422: problem_response(422, "a step or size that is no whole number in range (named)")})
def frame(store: ReadStoreDep, settings: SettingsDep, episode_id: Annotated[Int64, Path(**INT64)],
          step: Annotated[int, Query(ge=0, le=2**62, description="the step (0 is the episode's first)")],
          size: Annotated[int | None, Query(ge=1, description="the picture's longer side in pixels, capped at the "
                                                              "server's max_frame_size; default: as stored")] = None,
          leaf: Annotated[str | None, Query(description="which image leaf of a Dict observation (obs.pixels); "
                                                        "default: the first (GET /schema lists them)")] = None,
          ) -> Response:
    env_id, length = _episode(store, episode_id)
    chosen = _leaf(plumbing(store).image_leaves(env_id), leaf, episode_id, env_id)
    if step >= length:
        raise HTTPException(status_code=404, detail=f"step: episode_id {episode_id} has {length} step(s), 0 to "
                                                    f"{length - 1}; got {step}")
    values = _step_obs(store, episode_id, env_id, step, chosen, plumbing(store).settings.stream_batch_bytes)
    if size is not None:
        size = min(size, settings.max_frame_size)
    return Response(png(chosen.picture(values), size), media_type="image/png", headers={"Cache-Control": CACHE})


def _episode(store: Store, episode_id: int) -> tuple[str, int]:
    """The episode's env_id and number of steps, or 404."""
    page, _ = plumbing(store).episode_page(filter=EpisodeFilter(episode_id=[episode_id]), limit=1)
    if page.num_rows == 0:
        raise HTTPException(status_code=404, detail=f"episode_id {episode_id}: no such episode in the store")
    row = page.select(["env_id", "episode_length"]).to_pylist()[0]
    return row["env_id"], int(row["episode_length"])


def _leaf(found: list[ImageLeaf], leaf: str | None, episode_id: int, env_id: str) -> ImageLeaf:
    if not found:
        raise HTTPException(status_code=404, detail=f"episode_id {episode_id}: the observations of env_id "
                                                    f"{env_id!r} hold no image, so it has no frames")
    if leaf is None:
        return found[0]
    for candidate in found:
        if candidate.path == leaf:
            return candidate
    raise HTTPException(status_code=404, detail=f"leaf: {leaf!r} is not an image leaf of env_id {env_id!r}; its "
                                                f"image leaves: {', '.join(c.path for c in found)}")


def _step_obs(store: Store, episode_id: int, env_id: str, step: int, leaf: ImageLeaf, batch_bytes: int) -> Any:
    """One step's values of ``leaf``, read a bounded batch at a time until the step is found."""
    reader = store.scan(["step", "obs"], episode_id=episode_id, env_id=env_id, max_batch_bytes=batch_bytes)
    try:
        for batch in reader:
            at = np.flatnonzero(batch.column(0).to_numpy() == step)
            if len(at):
                row = batch.column(1).slice(int(at[0]), 1)
                return fixed_numpy(leaf_values(row, leaf.path))[0]
    finally:
        reader.close()
    raise HTTPException(status_code=404, detail=f"episode_id {episode_id}: step {step} is not stored")
