"""Episode statistics and discounted returns."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request

from trajstore.api.arrow import ROWS_CONTENT, table_response
from trajstore.api.budgets import compute_budget
from trajstore.api.deps import ReadStoreDep
from trajstore.api.params import ByDep, FilterDep, WhereDep
from trajstore.errors import InputError

router = APIRouter(tags=["stats"])
MAX_RETURN_ROWS = 100_000


@router.get("/stats", summary="n_traj, return_{min,mean,std,max}, len_* (and discounted_return_* with gamma, "
                              "metric_* with metric)",
            responses={200: {"content": ROWS_CONTENT}})
def stats(request: Request, store: ReadStoreDep, flt: FilterDep, where: WhereDep,
          by: ByDep,
          gamma: Annotated[float | None, Query(ge=0, le=1)] = None,
          include_incomplete: Annotated[bool, Query(description="also count unfinished episodes")] = False,
          metric: Annotated[str | None, Query(max_length=200, description=(
              "also metric_n and metric_{min,mean,std,max} of this: a column of episodes or agg(column) of a step "
              "column with agg one of last, first, sum, mean, min, max (last(is_success))"))] = None,
          ) -> Any:
    table = store.stats(by=by, gamma=gamma, filter=flt, where=where, include_incomplete=include_incomplete,
                        metric=metric)
    return table_response(request, table)


@router.get("/returns", summary="Discounted return per episode, or return-to-go per step",
            responses={200: {"content": ROWS_CONTENT}})
def returns(request: Request, store: ReadStoreDep, flt: FilterDep, where: WhereDep,
            gamma: Annotated[float, Query(ge=0, le=1)],
            per: Annotated[Literal["episode", "step"], Query()] = "episode",
            limit: Annotated[int, Query(ge=1, le=MAX_RETURN_ROWS)] = 10_000,
            ) -> Any:
    table = store.returns(gamma=gamma, per=per, filter=flt, where=where, limit=limit)
    return table_response(request, table)


# --- comparisons (trajstore.query.compare): each takes a place, a time limit and a memory bound (api/budgets.py) ---

COMPUTED = [Depends(compute_budget)]
MAX_THRESHOLDS = 1_000

Metric = Annotated[str, Query(max_length=200, description=(
    "what each episode is measured by: a column of episodes (episode_return, episode_length, …) or agg(column) of a "
    "step column with agg one of last, first, sum, mean, min, max (last(is_success))"))]
Task = Annotated[str, Query(max_length=200, description="the column of episodes that names a task (env_id)")]
Last = Annotated[int, Query(ge=1, le=1_000_000, description="a run's score on a task: the mean metric of its last "
                                                            "N complete episodes there")]
Mode = Annotated[Literal["train", "eval"] | None, Query(description="eval: evaluation episodes only")]
Normalize = Annotated[str | None, Query(max_length=100_000, description=(
    "a JSON object {task: [low, high]}: scores mapped to (x - low) / (high - low)"))]
Ci = Annotated[float, Query(gt=0, lt=1, description="the confidence of the intervals")]
Reps = Annotated[int, Query(ge=1, le=100_000, description="stratified bootstrap replications")]
RunIds = Annotated[list[str] | None, Query(description="only these runs (repeat the parameter)")]


def _normalize(text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise InputError(f"normalize: expected a JSON object {{task: [low, high]}}: {exc}") from None
    if not isinstance(value, dict):
        raise InputError(f"normalize: expected a JSON object {{task: [low, high]}}, got {type(value).__name__}")
    return value


@router.get("/compare", summary="rliable's IQM, median, mean and optimality gap of each group of runs, with "
                                "stratified bootstrap confidence intervals",
            responses={200: {"content": ROWS_CONTENT}}, dependencies=COMPUTED)
def compare(request: Request, store: ReadStoreDep, by: ByDep, where: WhereDep, metric: Metric = "episode_return",
            task: Task = "env_id", last: Last = 100, mode: Mode = None, normalize: Normalize = None,
            statistic: Annotated[list[Literal["iqm", "median", "mean", "optimality_gap"]] | None,
                                 Query(description="the statistics (repeat; default: all four)")] = None,
            ci: Ci = 0.95, reps: Reps = 2000, seed: Annotated[int, Query(ge=0)] = 0, run_id: RunIds = None) -> Any:
    table = store.compare(by, metric=metric, task=task, last=last, mode=mode, normalize=_normalize(normalize),
                          statistics=statistic or ("iqm", "median", "mean", "optimality_gap"), ci=ci, reps=reps,
                          seed=seed, run_id=run_id, where=where)
    return table_response(request, table)


@router.get("/compare/scores", summary="What /compare compares: each run's score on each task, per group",
            responses={200: {"content": ROWS_CONTENT}}, dependencies=COMPUTED)
def scores(request: Request, store: ReadStoreDep, by: ByDep, where: WhereDep, metric: Metric = "episode_return",
           task: Task = "env_id", last: Last = 100, mode: Mode = None, normalize: Normalize = None,
           run_id: RunIds = None) -> Any:
    table = store.scores(by, metric=metric, task=task, last=last, mode=mode, normalize=_normalize(normalize),
                         run_id=run_id, where=where)
    return table_response(request, table)


@router.get("/compare/improvement", summary="The probability that a run of group x beats one of group y on a task, "
                                            "with its confidence interval",
            dependencies=COMPUTED)
def probability_of_improvement(store: ReadStoreDep, by: ByDep, where: WhereDep,
                               x: Annotated[str, Query(max_length=1000)],
                               y: Annotated[str, Query(max_length=1000)], metric: Metric = "episode_return",
                               task: Task = "env_id", last: Last = 100, mode: Mode = None,
                               normalize: Normalize = None, ci: Ci = 0.95, reps: Reps = 2000,
                               seed: Annotated[int, Query(ge=0)] = 0, run_id: RunIds = None) -> dict[str, Any]:
    return store.probability_of_improvement(x, y, by=by, metric=metric, task=task, last=last, mode=mode,
                                            normalize=_normalize(normalize), ci=ci, reps=reps, seed=seed,
                                            run_id=run_id, where=where)


@router.get("/compare/profile", summary="Each group's performance profile: the fraction of runs above each "
                                        "threshold, with confidence intervals",
            responses={200: {"content": ROWS_CONTENT}}, dependencies=COMPUTED)
def performance_profile(request: Request, store: ReadStoreDep, by: ByDep, where: WhereDep,
                        threshold: Annotated[list[float], Query(max_length=MAX_THRESHOLDS,
                                                               description="the scores (repeat; at most 1,000)")],
                        metric: Metric = "episode_return", task: Task = "env_id", last: Last = 100,
                        mode: Mode = None, normalize: Normalize = None, ci: Ci = 0.95, reps: Reps = 2000,
                        seed: Annotated[int, Query(ge=0)] = 0, run_id: RunIds = None) -> Any:
    table = store.performance_profile(by, thresholds=threshold, metric=metric, task=task, last=last, mode=mode,
                                      normalize=_normalize(normalize), ci=ci, reps=reps, seed=seed, run_id=run_id,
                                      where=where)
    return table_response(request, table)


@router.get("/curves/groups", summary="Learning curves across seeds: each group of runs on each task per env_steps "
                                      "bin, its IQM or mean with a bootstrap band",
            responses={200: {"content": ROWS_CONTENT}}, dependencies=COMPUTED)
def group_curves(request: Request, store: ReadStoreDep, by: ByDep, where: WhereDep, metric: Metric = "episode_return",
                 task: Task = "env_id", bins: Annotated[int, Query(ge=1, le=10_000)] = 50,
                 aggregate: Annotated[Literal["iqm", "mean"], Query()] = "iqm", ci: Ci = 0.95, reps: Reps = 1000,
                 seed: Annotated[int, Query(ge=0)] = 0, mode: Mode = None, run_id: RunIds = None) -> Any:
    table = store.curves(by=by, metric=metric, task=task, bins=bins, aggregate=aggregate, ci=ci, reps=reps,
                               seed=seed, mode=mode, run_id=run_id, where=where)
    return table_response(request, table)
