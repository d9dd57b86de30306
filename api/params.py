"""Query parameters shared by the routes: episode filters (as a typed
:class:`~trajstore.query.filters.EpisodeFilter`, never SQL text) and column lists."""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Any, Literal

from fastapi import Depends, HTTPException, Query, Request
from fastapi.openapi.utils import get_openapi

from trajstore import schema as sch
from trajstore.api.ints import INT64, Int64
from trajstore.query.condition import Condition, parse
from trajstore.query.filters import EpisodeFilter

INT32 = {"ge": -(2**31), "le": 2**31 - 1}


NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
NAMES = r"^[A-Za-z_][A-Za-z0-9_]*(,[A-Za-z_][A-Za-z0-9_]*)*$"
_GROUP = r"(config(\.[A-Za-z0-9_-]+)+|[A-Za-z_][A-Za-z0-9_]*)"
GROUPS = rf"^{_GROUP}(,{_GROUP})*$"  # columns, or values of the runs' configs (config.algo, config.net.width)
# Column names are checked by the Store against the store's own columns (extras included), so every
# unknown column gets one status (422) and one message, on every endpoint.
EPISODE_COLUMNS = ", ".join(sch.episode_column_names())


def episode_filter(
    run_id: Annotated[list[str], Query(description="only these runs")] = [],  # noqa: B006 - FastAPI copies it
    env_id: Annotated[list[str], Query(description="only these environments")] = [],  # noqa: B006
    episode_id: Annotated[list[Annotated[Int64, Query(**INT64)]], Query(description="only these episodes")] = [],  # noqa: B006
    complete: Annotated[bool | None, Query(description="complete (true) or unfinished (false) episodes")] = None,
    terminated: Annotated[bool | None, Query()] = None,
    truncated: Annotated[bool | None, Query()] = None,
    min_return: Annotated[float | None, Query(allow_inf_nan=False)] = None,
    max_return: Annotated[float | None, Query(allow_inf_nan=False)] = None,
    min_length: Annotated[int | None, Query(ge=0, le=2**62)] = None,
    max_length: Annotated[int | None, Query(ge=0, le=2**62)] = None,
    policy_version: Annotated[list[Annotated[Int64, Query(**INT64)]], Query(description="lineage: policy versions")] = [],  # noqa: B006,E501
    mode: Annotated[list[Literal["train", "eval"]], Query(description="lineage: train or eval")] = [],  # noqa: B006
    worker_id: Annotated[list[str], Query(description="lineage: writer processes")] = [],  # noqa: B006
    seed: Annotated[list[Annotated[Int64, Query(**INT64)]], Query(description="lineage: seeds")] = [],  # noqa: B006
    env_index: Annotated[list[Annotated[int, Query(**INT32)]], Query(description="lineage: index in the vector env")] = [],  # noqa: B006,E501
) -> EpisodeFilter:
    lineage: dict[str, list[Any]]
    lineage = {"policy_version": policy_version, "mode": mode, "worker_id": worker_id, "seed": seed,
               "env_index": env_index}
    return EpisodeFilter(run_id=run_id, env_id=env_id, episode_id=episode_id, complete=complete,
                         terminated=terminated, truncated=truncated, min_return=min_return, max_return=max_return,
                         min_length=min_length, max_length=max_length,
                         lineage={k: v for k, v in lineage.items() if v})


FilterDep = Annotated[EpisodeFilter, Depends(episode_filter)]


def episode_condition(
    where: Annotated[str | None, Query(max_length=10_000, description=(
        "a condition over the columns of episodes, e.g. episode_return > 100 and env_id = 'CartPole-v1': "
        "comparisons, and/or/not, [not] in a list of values, between, is [not] null, [i]like, arithmetic and a few "
        "pure functions (abs, round, lower, starts_with, …); parsed, never run as SQL text"))] = None,
) -> Condition | None:
    """``where=`` parsed into a condition trajstore renders itself (:mod:`trajstore.query.condition`): text that is
    not such a condition is a 422 naming ``where`` and the character where it stops being one."""
    return None if where is None else parse(where)


WhereDep = Annotated[Condition | None, Depends(episode_condition)]


def step_columns(
    columns: Annotated[list[Annotated[str, Query(pattern=NAMES)]],
                       Query(description="columns of steps (all by default); repeat the parameter or "
                                         "comma-separate names")] = [],  # noqa: B006
) -> list[str]:
    return [name for item in columns for name in item.split(",")]


ColumnsDep = Annotated[list[str], Depends(step_columns)]


def group_columns(
    by: Annotated[list[Annotated[str, Query(pattern=GROUPS)]],
                  Query(description=f"group by these columns of episodes ({EPISODE_COLUMNS}), or by a value of each "
                                    "run's config (config.algo, config.net.width); repeat the parameter or "
                                    "comma-separate names")] = [],  # noqa: B006
) -> list[str]:
    return [name for item in by for name in item.split(",")]


ByDep = Annotated[list[str], Depends(group_columns)]


async def single_valued(request: Request) -> None:
    """Refuse a query parameter given more than once where the route takes one value (``complete=true&
    complete=false``), with 422 naming it, instead of silently keeping the last one."""
    params = _query_parameters(request)
    counts = Counter(k for k, _ in request.query_params.multi_items())
    repeated = sorted(k for k, n in counts.items() if n > 1 and k in params and not params[k])
    if repeated:
        raise HTTPException(status_code=422, detail=f"{repeated[0]}: given {counts[repeated[0]]} times; this "
                                                    "parameter takes one value")


# Why a route that reads no version of the store refuses ?version= (the others: it has no version to read).
NO_VERSION = {
    "/events": "it streams the commits made from now on; to catch up from version N, read GET /commits/{version} "
               "for N+1, N+2, ... (Client.follow(since=N) does)",
    "/ready": "it checks the latest version, the one the service serves",
    "/health": "it says whether the process answers",
}


async def version_refused(request: Request) -> None:
    """Refuse ``?version=`` (whatever its value) with 422 on a route that reads no version of the store
    (``/health``, ``/ready``, ``/events``, ingest, deletes, the dashboard's page), instead of silently
    answering for the latest version; the read routes declare ``version`` themselves (``get_read_store``)."""
    if "version" not in request.query_params:
        return
    path = _route_path(request)
    if "version" in _query_parameters(request):
        return
    writes = request.method in ("POST", "PUT", "PATCH", "DELETE")
    why = NO_VERSION.get(path, "it changes the store, whose latest version alone takes changes" if writes else
                         "it reads no version of the store")
    raise HTTPException(status_code=422, detail=f"version: has no meaning on {request.method} {path}: {why}; "
                                                "?version= is taken by the routes that read data (see GET /history)")


def _route_path(request: Request) -> str:
    return getattr(request.scope.get("route"), "path", "")


def _query_parameters(request: Request) -> dict[str, bool]:
    """The query parameters of the request's route and method, as the app's OpenAPI document describes them, each
    with whether its schema is an array (the parameter may repeat). Described from the route alone, once: the
    whole document takes ~1.5 s to build, which a service's first request should not wait for."""
    app, route, method = request.app, request.scope.get("route"), request.method
    cache = app.state.__dict__.setdefault("query_parameters", {})
    key = (getattr(route, "path", ""), method)
    if key not in cache:
        document = app.openapi_schema or (get_openapi(title=app.title, version=app.version, routes=[route])
                                          if route is not None else {})
        operation = document.get("paths", {}).get(key[0], {}).get(method.lower(), {})
        cache[key] = {p["name"]: _is_array(p.get("schema", {}))
                      for p in operation.get("parameters", []) if p.get("in") == "query"}
    return cache[key]


def _is_array(schema: dict[str, Any]) -> bool:
    return schema.get("type") == "array" or any(_is_array(s) for s in schema.get("anyOf", []))
