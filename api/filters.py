"""Episode filters as query parameters, shared by the routes that select episodes or their steps."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Query

from trajstore.filters import EpisodeFilter


def episode_filter(
    run_id: Annotated[list[str] | None, Query(description="only these runs")] = None,
    env_id: Annotated[list[str] | None, Query(description="only these environments")] = None,
    episode_id: Annotated[list[int] | None, Query(description="only these episodes")] = None,
    complete: Annotated[bool | None, Query(description="complete (true) or unfinished (false) episodes")] = None,
    terminated: Annotated[bool | None, Query()] = None,
    truncated: Annotated[bool | None, Query()] = None,
    min_return: Annotated[float | None, Query(allow_inf_nan=False)] = None,
    max_return: Annotated[float | None, Query(allow_inf_nan=False)] = None,
    min_length: Annotated[int | None, Query(ge=0)] = None,
    max_length: Annotated[int | None, Query(ge=0)] = None,
    policy_version: Annotated[list[int] | None, Query(description="lineage: policy versions")] = None,
    mode: Annotated[list[str] | None, Query(description="lineage: train or eval")] = None,
    worker_id: Annotated[list[str] | None, Query(description="lineage: writer processes")] = None,
    seed: Annotated[list[int] | None, Query(description="lineage: seeds")] = None,
    env_index: Annotated[list[int] | None, Query(description="lineage: index in the vector env")] = None,
) -> EpisodeFilter:
    lineage = {"policy_version": policy_version, "mode": mode, "worker_id": worker_id, "seed": seed,
               "env_index": env_index}
    return EpisodeFilter(run_id=run_id, env_id=env_id, episode_id=episode_id, complete=complete,
                         terminated=terminated, truncated=truncated, min_return=min_return, max_return=max_return,
                         min_length=min_length, max_length=max_length,
                         lineage={k: v for k, v in lineage.items() if v})


FilterDep = Annotated[EpisodeFilter, Depends(episode_filter)]
