"""What a rollout writes to: a :class:`RolloutTarget` (a store, or a served store), and the checks a rollout makes
of the run it writes to before it writes: a new run unless asked to append, and training and evaluation episodes
in runs of their own."""

from __future__ import annotations

from typing import Any, Literal, Protocol

from trajstore.errors import InputError
from trajstore.query import sql
from trajstore.storage.names import check_id

Mode = Literal["train", "eval"]
MODES = ("train", "eval")


class RolloutTarget(Protocol):
    """What a rollout needs of a store: a writer, the runs it holds (``runs()``, one row per run and environment),
    and SQL to check the run it writes to (a :class:`~trajstore.store.Store` or a
    :class:`~trajstore.remote.writer.RemoteStore`)."""

    @property
    def root(self) -> Any: ...

    def writer(self, *, run_id: str, env_id: str, **options: Any) -> Any: ...

    def runs(self) -> Any: ...

    def sql(self, query: str) -> Any: ...


def check_mode(mode: Any) -> Mode:
    if mode not in MODES:
        raise InputError(f"mode must be 'train' or 'eval', got {mode!r}")
    return mode  # type: ignore[no-any-return]


def check_run(store: RolloutTarget, run_id: str, *, mode: Mode, append: bool, hint: str = "append=True") -> None:
    """Refuse a run id no writer takes (:func:`~trajstore.storage.names.check_id`, before any env is made), to write
    into a run the store already holds unless ``append`` (``hint`` says how to ask for it: ``append=True``, or
    ``--append`` on the CLI), and to mix training and evaluation episodes in one run.

    Only rollouts check: :meth:`Store.writer <trajstore.store.Store.writer>` never refuses, as many writers
    (a rollout's workers, recorders) share one run by design."""
    check_id(run_id, field="run_id")
    if run_id not in store.runs()["run_id"].to_pylist():
        return
    check_run_mode(store, run_id, mode)
    if not append:
        raise InputError(f"run_id: run {run_id!r} already holds steps in {store.root}; add to it with {hint}, or "
                         "store these episodes under a new run id")


def check_run_mode(store: RolloutTarget, run_id: str, mode: Mode) -> None:
    """Refuse to mix training and evaluation episodes in one run, so their statistics never mix."""
    n = store.sql(sql.count_other_mode(run_id, mode)).column("n")[0].as_py()
    if n:
        other = "training (or untagged)" if mode == "eval" else "evaluation"
        raise InputError(f"run {run_id!r} already holds {other} steps; store {mode} episodes under their own "
                         "run_id so training and evaluation statistics never mix")
