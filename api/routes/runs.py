"""Runs and the store's columns."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Response
from pydantic import BaseModel

from trajstore.api.arrow import ARROW_CONTENT, arrow_response
from trajstore.api.deps import ReadStoreDep, StoreDep, require_api_key
from trajstore.api.problems import problem_response
from trajstore.store import Store

router = APIRouter(tags=["runs"])


class RunEnv(BaseModel):
    env_id: str
    episodes: int
    complete_episodes: int
    steps: int
    last_write: datetime | None


class Run(BaseModel):
    run_id: str
    episodes: int
    complete_episodes: int
    steps: int
    last_write: datetime | None
    envs: list[RunEnv]


@router.get("/runs", summary="Every run with its environments, episode and step counts and last write time")
def runs(store: ReadStoreDep) -> list[Run]:
    return _runs(store)


@router.get("/runs/{run_id}", summary="One run with its environments, episode and step counts and last write time",
            responses={404: {"description": "no such run in the store"}})
def run(store: ReadStoreDep, run_id: Annotated[str, Path(min_length=1, max_length=200)]) -> Run:
    found = [r for r in _runs(store) if r.run_id == run_id]
    if not found:
        raise HTTPException(status_code=404, detail=f"run_id: no run {run_id!r} in this store; its runs: "
                                                    f"{store.run_ids()}")
    return found[0]


class Deleted(BaseModel):
    run_id: str
    episodes: int
    steps: int
    files_removed: int
    files_rewritten: int
    version: int | None


@router.delete("/runs/{run_id}", dependencies=[Depends(require_api_key)],
               summary="Delete every episode of a run, in one commit (older versions keep reading it until vacuumed)",
               responses={404: problem_response(404, "no such run in the store")})
def delete_run(store: StoreDep, run_id: Annotated[str, Path(min_length=1, max_length=200)]) -> Deleted:
    report = store.delete(run_id=run_id)
    return Deleted(run_id=run_id, episodes=report.episodes, steps=report.steps, files_removed=report.files_removed,
                   files_rewritten=report.files_rewritten, version=report.version)


def _runs(store: Store) -> list[Run]:
    out: dict[str, Run] = {}
    for row in store.runs().to_pylist():
        env = RunEnv(**{k: v for k, v in row.items() if k != "run_id"})
        run = out.setdefault(row["run_id"], Run(run_id=row["run_id"], episodes=0, complete_episodes=0, steps=0,
                                                 last_write=None, envs=[]))
        run.envs.append(env)
        run.episodes += env.episodes
        run.complete_episodes += env.complete_episodes
        run.steps += env.steps
        if env.last_write is not None and (run.last_write is None or env.last_write > run.last_write):
            run.last_write = env.last_write
    return list(out.values())


@router.get("/schema", summary="The columns of the steps table, as an empty Arrow IPC stream",
            response_class=Response, responses={200: {"content": ARROW_CONTENT}})
def schema(store: ReadStoreDep,
           env_id: Annotated[str | None, Query(description="the types of this environment's files")] = None,
           ) -> Response:
    return arrow_response(store.schema(env_id).empty_table())
