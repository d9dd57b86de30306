"""Runs and the store's columns."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, PlainSerializer, StrictBool, WithJsonSchema

from trajstore.api.arrow import ARROW_CONTENT, arrow_response, wants_arrow
from trajstore.api.deps import ReadStoreDep, StoreDep, require_api_key
from trajstore.api.problems import problem_response
from trajstore.remote.wire import json_exact
from trajstore.store import Store, plumbing

router = APIRouter(tags=["runs"])

# A run's config in a response: its JSON values, any integer beyond ±(2**53 - 1) a decimal string (trajstore.api.ints)
Config = Annotated[dict[str, Any], PlainSerializer(json_exact, when_used="json"), WithJsonSchema({
    "type": "object", "description": "the run's config (hyperparameters, algorithm…): its JSON values, any integer "
                                     "beyond ±(2**53 - 1) a decimal string (exact in every JSON reader)"})]


class Latest(BaseModel):
    """Statistics of a series' latest complete episodes (``?last=N``), computed by the service at any size."""

    n_traj: int = Field(description="complete episodes summarised: the last N to end, or all if fewer")
    return_mean: float
    return_std: float = Field(description="population std, as numpy.std")
    return_min: float
    return_max: float
    len_mean: float
    len_std: float
    len_min: float
    len_max: float
    discounted_return_mean: float | None = Field(None, description="with gamma")
    discounted_return_std: float | None = None
    discounted_return_min: float | None = None
    discounted_return_max: float | None = None


class RunEnv(BaseModel):
    env_id: str
    episodes: int
    complete_episodes: int
    steps: int
    last_write: datetime | None
    latest: Latest | None = Field(None, description="with ?last=N: statistics of its last N complete episodes "
                                                    "(null when it has none)")


class Run(BaseModel):
    run_id: str
    episodes: int
    complete_episodes: int
    steps: int
    last_write: datetime | None
    envs: list[RunEnv]
    config: Config = Field(default_factory=dict, description="the run's config (hyperparameters, algorithm…), as "
                                                             "its writer or set_run gave it")
    tags: list[str] = Field(default_factory=list)
    notes: str | None = None
    created: datetime | None = Field(None, description="when the run was first described (null: never)")
    trajstore_version: str | None = Field(None, description="of the program that first described the run")
    git_commit: str | None = Field(None, description="of that program's git repository (+dirty: with changes)")
    host: str | None = None
    problem: str | None = Field(None, description="what of the run's stored description cannot be used (left out "
                                                  "above) and how to repair it; null: nothing")


@router.get("/runs", summary="Every run with its environments, episode and step counts and last write time (and "
                           "with ?last=N the statistics of each one's latest episodes); as Arrow (Accept: "
                           "application/vnd.apache.arrow.stream), Store.runs' table: one row per run and environment",
            response_model=list[Run], responses={200: {"content": ARROW_CONTENT}})
def runs(request: Request, store: ReadStoreDep,
         last: Annotated[int | None, Query(ge=1, le=1_000_000, description=(
             "add each environment's statistics of its last N complete episodes to end (return, length; "
             "discounted return with gamma)"))] = None,
         gamma: Annotated[float | None, Query(ge=0, le=1, description="with last: also the discounted return")] = None,
         ) -> Any:
    if wants_arrow(request):
        return arrow_response(store.runs(last=last, gamma=gamma))
    found = _runs(store)
    if last is not None:
        _add_latest(store, found, last, gamma)
    return found


@router.get("/runs/{run_id}", summary="One run with its environments, episode and step counts and last write time",
            responses={404: {"description": "no such run in the store"}})
def run(store: ReadStoreDep, run_id: Annotated[str, Path(min_length=1, max_length=200)]) -> Run:
    plumbing(store).check_runs(run_id)  # 404 naming the runs the store holds
    return next(r for r in _runs(store) if r.run_id == run_id)


class Provenance(BaseModel):
    """The program describing a run, as it reports itself (a remote writer): recorded when the run is first
    described."""

    trajstore_version: str | None = Field(None, max_length=200)
    git_commit: str | None = Field(None, max_length=200)
    host: str | None = Field(None, max_length=200)


class RunDescription(BaseModel):
    """What describes a run; a field left out (or null) is left as stored."""

    config: dict[str, Any] | None = Field(None, description="hyperparameters, algorithm… (JSON values: finite "
                                                            "numbers, integers within 64 bits, nested at most 32 "
                                                            "levels, at most 1 MiB as JSON text)")
    tags: list[str] | None = Field(None, description="at most 100, each of at most 200 characters")
    notes: str | None = Field(None, description="at most 1 MiB")
    replace: StrictBool = Field(True, description="true: each field given replaces the stored one (store.set_run); "
                                                  "false: as a writer opening the run (tags added, stored notes "
                                                  "kept, a config other than the stored one refused: 422); a JSON "
                                                  "boolean, not 0 or 1")
    provenance: Provenance | None = Field(None, description="with replace=false: the writing program, recorded if "
                                                            "the run was never described (else the service's own)")


class Described(BaseModel):
    """What describes a run after a change."""

    config: Config
    tags: list[str]
    notes: str | None
    replace: bool


@router.patch("/runs/{run_id}", dependencies=[Depends(require_api_key)],
              summary="Describe a run: its config, tags and notes (one row of the store's runs table; the store read "
                      "at an earlier version keeps the old ones)",
              responses={404: problem_response(404, "no such run in the store (neither steps nor a description)"),
                         422: problem_response(422, "a value that is not plain JSON or is past its bounds, named by "
                                                    "its path (config.a.b: …)")})
def describe_run(store: StoreDep, run_id: Annotated[str, Path(min_length=1, max_length=200)],
                 body: RunDescription) -> Described:
    given: dict[str, Any] = {"config": body.config, "tags": body.tags, "notes": body.notes}
    store.run_info(run_id)  # a run the store holds (404 before anything is changed)
    if body.replace:
        store.set_run(run_id, **given)
    else:
        provenance = None if body.provenance is None else body.provenance.model_dump()
        plumbing(store).describe_run(run_id, **given, provenance=provenance)
    info = store.run_info(run_id)
    return Described(config=info["config"], tags=info["tags"], notes=info["notes"], replace=body.replace)


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
    report = store.maintain.delete(run_id=run_id)
    return Deleted(run_id=run_id, episodes=report.episodes, steps=report.steps, files_removed=report.files_removed,
                   files_rewritten=report.files_rewritten, version=report.version)


def _runs(store: Store) -> list[Run]:
    out: dict[str, Run] = {}
    described = plumbing(store).run_infos()
    for row in store.runs().to_pylist():
        env = RunEnv(**{k: v for k, v in row.items() if k != "run_id"})
        run = out.setdefault(row["run_id"], Run(run_id=row["run_id"], episodes=0, complete_episodes=0, steps=0,
                                                 last_write=None, envs=[], **described.get(row["run_id"], {})))
        run.envs.append(env)
        run.episodes += env.episodes
        run.complete_episodes += env.complete_episodes
        run.steps += env.steps
        if env.last_write is not None and (run.last_write is None or env.last_write > run.last_write):
            run.last_write = env.last_write
    return list(out.values())


def _add_latest(store: Store, found: list[Run], last: int, gamma: float | None) -> None:
    rows = {(r["run_id"], r["env_id"]): r for r in plumbing(store).latest_stats(last, gamma=gamma).to_pylist()}
    for run in found:
        for env in run.envs:
            row = rows.get((run.run_id, env.env_id))
            env.latest = None if row is None else Latest(**{k: v for k, v in row.items() if k in Latest.model_fields})


class Column(BaseModel):
    name: str
    type: str = Field(description="the Arrow type, as pyarrow writes it (e.g. fixed_size_list<item: float>[4])")
    nullable: bool


class Image(BaseModel):
    """An observation leaf that is a picture (see trajstore.query.pictures): GET /episodes/{id}/frames draws it."""

    leaf: str = Field(description="obs, or the path of a Dict observation's leaf (obs.pixels)")
    shape: list[int] = Field(description="one step's shape as stored")
    dtype: str
    stack: int | None = Field(description="frames stacked along the first axis (the newest last is drawn)")
    height: int
    width: int
    channels: int


class Schema(BaseModel):
    columns: list[Column]
    images: list[Image] = Field(default_factory=list, description="the observation leaves that are pictures "
                                                                  "(empty when there is none)")


@router.get("/schema", summary="The columns of the steps table: an empty Arrow IPC stream, or JSON for "
                               "Accept: application/json",
            response_class=Response, responses={200: {"content": {**ARROW_CONTENT, "application/json": {
                "schema": Schema.model_json_schema()}}}})
def schema(request: Request, store: ReadStoreDep,
           env_id: Annotated[str | None, Query(description="the types of this environment's files")] = None,
           ) -> Response:
    found = store.schema(env_id)
    if _wants_json(request):
        columns = [Column(name=f.name, type=str(f.type), nullable=f.nullable) for f in found]
        images = [Image(**leaf.describe()) for leaf in plumbing(store).image_leaves(env_id)]  # type: ignore[arg-type]
        return JSONResponse(jsonable_encoder(Schema(columns=columns, images=images)))
    return arrow_response(found.empty_table())


def _wants_json(request: Request) -> bool:
    """Whether the client asked for JSON rather than Arrow (``Accept: application/json``, Arrow not named)."""
    accept = request.headers.get("accept", "")
    return "application/json" in accept and not wants_arrow(request)
