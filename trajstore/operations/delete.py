"""Delete whole episodes (a run, or the episodes a condition selects) in one commit of the log.

Files that hold only deleted episodes are removed; files that mix kept and deleted episodes are rewritten with
the kept rows (same Parquet settings, same stored types) and swapped in, in the same commit
(:meth:`Log.swap <trajstore.storage.log.Log.swap>`). Readers see the store before or after, never between.
The commit removes exactly the files it read: appends committed meanwhile stay (the log rebases the commit
onto them); if another change removed one of those files first (a compaction, a second delete), the delete is
planned again on the newer version. The files stay on disk for readers of older versions until
:func:`~trajstore.operations.vacuum.vacuum` removes them. The replays' priorities of the deleted episodes are removed
from the ``priorities`` table right after (:mod:`~trajstore.storage.priorities_log`).

``where`` is a condition over the ``episodes`` view, as for every reader (``episode_return < 0``, ``mode =
'eval'``); ``steps_where`` a condition over the ``steps`` view (``policy_version < 3``, ``worker_id = 'w1'``): an
episode goes when every one of its steps matches. Only whole episodes are deleted: a condition over steps that
selects some steps of an episode but not all of them is refused.

Close a run's writers before deleting it: a delete does not reach into a writer that is still appending, so
that writer's next steps of an episode it had open would be stored without the episode's start (``check``
names such episodes; deleting them again removes them).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from trajstore.errors import CommitError, InputError, QueryError, caller_sql_error
from trajstore.query import sql
from trajstore.query.filters import check_runs
from trajstore.query.sql import Where
from trajstore.retry import tries
from trajstore.storage.log import DataFile, TableState, WrittenFile, files_holding

if TYPE_CHECKING:
    from trajstore.query.engine import Engine
    from trajstore.query.snapshot import Snapshot

log = logging.getLogger(__name__)

ATTEMPTS = 10
MAX_NAMED = 3  # partial episodes named in the refusal


@dataclass
class DeleteReport:
    """What :func:`delete` removed (or, with ``dry_run``, would remove): episodes, steps, the runs they belong
    to, the files removed whole and rewritten, and the version the commit made (None when nothing was)."""

    episodes: int = 0
    steps: int = 0
    runs: list[str] = field(default_factory=list)
    files_removed: int = 0
    files_rewritten: int = 0
    version: int | None = None
    dry_run: bool = False

    def format(self) -> str:
        verb = "would delete" if self.dry_run else "deleted"
        if not self.episodes:
            return "nothing to delete"
        line = (f"{verb} {self.episodes} episode(s), {self.steps} step(s) of run(s) {', '.join(self.runs)} "
                f"({self.files_removed} file(s) removed, {self.files_rewritten} rewritten)")
        return line + (f" in version {self.version}" if self.version is not None else "")

    __str__ = format


@dataclass
class _Plan:
    report: DeleteReport
    whole: list[DataFile]  # files removed whole
    partial: dict[str, tuple[DataFile, np.ndarray]]  # path -> (file, the sorted episode ids to drop from it)
    episodes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # every episode deleted


def delete(engine: Engine, *, run_id: str | Sequence[str] | None = None, where: Where | None = None,
           steps_where: str | None = None, dry_run: bool = False) -> DeleteReport:
    """Delete the episodes of ``run_id`` (one or several) and/or those ``where`` (over ``episodes``) selects and/or
    those whose every step ``steps_where`` (over ``steps``) selects."""
    runs = [run_id] if isinstance(run_id, str) else list(run_id or [])
    if not runs and not where and not steps_where:
        raise InputError("delete: give run_id= (the run to delete), where= (a condition over episodes) and/or "
                         "steps_where= (a condition over steps); refusing to delete everything by default")
    engine.table.log.writable("delete")
    last: CommitError | None = None
    for _ in tries(ATTEMPTS):
        state = engine.table.log.read()
        files = [] if state is None else state.files
        check_runs([runs], (f.run_id for f in files), engine.uri)
        plan = _plan(engine, [f for f in files if not runs or f.run_id in runs], where, steps_where)
        plan.report.dry_run = dry_run
        if dry_run or not plan.report.episodes:
            return plan.report
        try:
            plan.report.version = _apply(engine, state, plan)  # type: ignore[arg-type]
        except CommitError as exc:  # another change removed files we read: plan again on the newer version
            log.info("delete conflicted with another commit, planning again: %s", exc)
            last = exc
            continue
        _forget_priorities(engine, plan.episodes)
        return plan.report
    raise CommitError(f"delete could not commit after {ATTEMPTS} attempts: {last}")


def _plan(engine: Engine, files: list[DataFile], where: Where | None, steps_where: str | None) -> _Plan:
    """Which episodes go, checked whole, and what happens to each file holding them."""
    if not files:
        return _Plan(DeleteReport(), [], {})
    condition = sql.chosen_steps(where, steps_where)
    with engine.snapshot(files) as snap:
        check_episodes_condition(snap, where)
        try:
            rows = snap.arrow(sql.delete_matches(condition))
        except QueryError as exc:
            raise condition_error(exc, where, steps_where) from None
    _refuse_partial(rows, steps_where)
    report = DeleteReport(episodes=rows.num_rows, steps=int(pc.sum(rows["steps"]).as_py() or 0),
                          runs=sorted(set(rows["run_id"].to_pylist())))
    episodes = rows["episode_id"].to_numpy().astype(np.int64)
    if not condition:
        report.files_removed = len(files)
        return _Plan(report, files, {}, episodes)
    whole, partial = [], {}
    for (run, env), ids in _ids_per_partition(rows).items():
        for f in files_holding([f for f in files if (f.run_id, f.env_id) == (run, env)], ids):
            held = pq.ParquetFile(f.path, filesystem=f.fs).read(columns=["episode_id"])["episode_id"]
            hit = pc.is_in(held, pa.array(ids))
            n_hit = int(pc.sum(hit).as_py() or 0)
            if n_hit == len(held):
                whole.append(f)
            elif n_hit:
                partial[f.path] = (f, ids)
    report.files_removed, report.files_rewritten = len(whole), len(partial)
    return _Plan(report, whole, partial, episodes)


def _forget_priorities(engine: Engine, episodes: np.ndarray) -> None:
    """Remove the deleted ``episodes``' rows from the ``priorities`` table (one commit of its own, after the steps'):
    a failure is logged, not raised, since the steps are deleted and no replay gives a priority to an item it does not
    hold (the rows stay in the table until a later delete of those episodes removes them)."""
    try:
        engine.priorities.delete_episodes(episodes)
    except Exception as exc:  # noqa: BLE001 - see above: the delete itself is done
        log.warning("%s: the replays' priorities of the %d deleted episode(s) were not removed: %s", engine.uri,
                    len(episodes), exc)


def check_episodes_condition(snap: Snapshot, where: Where | None) -> None:
    """An :class:`InputError` naming ``where`` when it is no condition over ``episodes`` (``step = 0``: a condition
    over steps, which is ``steps_where``)."""
    if where:
        try:
            snap.arrow(sql.episodes_probe(where))
        except QueryError as exc:
            raise condition_error(exc, where, None) from None


def condition_error(exc: QueryError, where: Where | None, steps_where: str | None) -> InputError:
    """The caller's error for a condition that failed: named ``where`` (a condition over ``episodes``, which a
    condition over steps given there is not) or ``steps_where`` (over ``steps``)."""
    if where and not steps_where:
        return caller_sql_error(exc, "where", f"in {where!r}; where= is a condition over the episodes view (for a "
                                              "condition over steps give steps_where=)")
    if steps_where and not where:
        return caller_sql_error(exc, "steps_where", f"in {steps_where!r}; a condition over the steps view")
    return caller_sql_error(exc, "where/steps_where", f"in where={where!r} (over episodes), steps_where="
                                                      f"{steps_where!r} (over steps)")


def _refuse_partial(rows: pa.Table, where: str | None) -> None:
    cut = rows.filter(pc.less(rows["matched"], rows["steps"])).to_pylist()
    if cut:
        named = "; ".join(f"episode {r['episode_id']} (run_id={r['run_id']!r}): {r['matched']} of its "
                          f"{r['steps']} steps" for r in cut[:MAX_NAMED])
        more = f"; and {len(cut) - MAX_NAMED} more episodes" if len(cut) > MAX_NAMED else ""
        raise InputError(f"steps_where: {where!r} selects part of {len(cut)} episode(s), and only whole episodes "
                         f"are deleted: {named}{more}")


def _ids_per_partition(rows: pa.Table) -> dict[tuple[str, str], np.ndarray]:
    out: dict[tuple[str, str], list[int]] = {}
    for run, env, ep in zip(*(rows[c].to_pylist() for c in ("run_id", "env_id", "episode_id"))):
        out.setdefault((run, env), []).append(ep)
    return {k: np.unique(np.asarray(v, np.int64)) for k, v in out.items()}


def _apply(engine: Engine, state: TableState, plan: _Plan) -> int | None:
    """Rewrite the mixed files, then commit every removal and the rewritten files at once; the new version."""
    written: list[WrittenFile] = []
    try:
        for f, ids in plan.partial.values():
            data = pq.ParquetFile(f.path, filesystem=f.fs).read()  # no partition columns from the path
            kept = data.filter(pc.invert(pc.is_in(data["episode_id"], pa.array(ids))))
            written.append(engine.table.write(kept, run_id=f.run_id, env_id=f.env_id))
        removed = plan.whole + [f for f, _ in plan.partial.values()]
        r = plan.report
        return engine.table.log.swap(state, removed, written, metadata={
            "operation": "delete", "episodes": r.episodes, "rows_removed": r.steps, "run_ids": r.runs})
    except BaseException as exc:
        engine.table.discard([w.path for w in written], exc)
        raise
