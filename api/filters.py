"""Episode filters as query parameters, shared by the routes that select episodes or their steps."""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Literal

from fastapi import Depends, HTTPException, Query

from trajstore import schema as sch
from trajstore.filters import EpisodeFilter
from trajstore.query import Snapshot, quote_ident

INT32 = {"ge": -(2**31), "le": 2**31 - 1}
INT64 = {"ge": -(2**63), "le": 2**63 - 1}


def episode_column_names() -> list[str]:
    """Columns of the ``episodes`` view, from ``episode.v1.json`` and the lineage of ``step.v1.json``."""
    lineage = [c["name"] for c in sch.load(sch.STEP_SCHEMA_FILE)["lineage"] if c.get("in_episodes")]
    return [c["name"] for c in sch.episode_columns()] + lineage


EpisodeColumn = Enum("EpisodeColumn", {n: n for n in episode_column_names()}, type=str)  # type: ignore[misc]
EpisodeOrder = Enum("EpisodeOrder", {f"{d}{n}": f"{d}{n}" for n in episode_column_names()
                                     for d in ("", "-")}, type=str)  # type: ignore[misc]


def episode_filter(
    run_id: Annotated[list[str], Query(description="only these runs")] = [],  # noqa: B006 - FastAPI copies it
    env_id: Annotated[list[str], Query(description="only these environments")] = [],  # noqa: B006
    episode_id: Annotated[list[Annotated[int, Query(**INT64)]], Query(description="only these episodes")] = [],  # noqa: B006
    complete: Annotated[bool | None, Query(description="complete (true) or unfinished (false) episodes")] = None,
    terminated: Annotated[bool | None, Query()] = None,
    truncated: Annotated[bool | None, Query()] = None,
    min_return: Annotated[float | None, Query(allow_inf_nan=False)] = None,
    max_return: Annotated[float | None, Query(allow_inf_nan=False)] = None,
    min_length: Annotated[int | None, Query(ge=0, le=2**62)] = None,
    max_length: Annotated[int | None, Query(ge=0, le=2**62)] = None,
    policy_version: Annotated[list[Annotated[int, Query(**INT64)]], Query(description="lineage: policy versions")] = [],  # noqa: B006,E501
    mode: Annotated[list[Literal["train", "eval"]], Query(description="lineage: train or eval")] = [],  # noqa: B006
    worker_id: Annotated[list[str], Query(description="lineage: writer processes")] = [],  # noqa: B006
    seed: Annotated[list[Annotated[int, Query(**INT64)]], Query(description="lineage: seeds")] = [],  # noqa: B006
    env_index: Annotated[list[Annotated[int, Query(**INT32)]], Query(description="lineage: index in the vector env")] = [],  # noqa: B006,E501
) -> EpisodeFilter:
    lineage = {"policy_version": policy_version, "mode": mode, "worker_id": worker_id, "seed": seed,
               "env_index": env_index}
    return EpisodeFilter(run_id=run_id, env_id=env_id, episode_id=episode_id, complete=complete,
                         terminated=terminated, truncated=truncated, min_return=min_return, max_return=max_return,
                         min_length=min_length, max_length=max_length,
                         lineage={k: v for k, v in lineage.items() if v})


FilterDep = Annotated[EpisodeFilter, Depends(episode_filter)]


def step_columns(
    columns: Annotated[list[Annotated[str, Query(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]],
                       Query(description="columns of steps (all by default)")] = [],  # noqa: B006
) -> list[str]:
    return columns


ColumnsDep = Annotated[list[str], Depends(step_columns)]


def select_list(snap: Snapshot, columns: list[str]) -> str:
    """The SELECT list for ``columns`` of ``steps`` (``*`` when empty); 404 for a column the store lacks."""
    if not columns:
        return "*"
    unknown = [c for c in columns if c not in snap.step_columns]
    if unknown:
        raise HTTPException(status_code=404, detail=f"columns: {unknown} not in this store's steps; it has "
                                                    f"{snap.step_columns}")
    return ", ".join(quote_ident(c) for c in dict.fromkeys(columns))
