"""What a rollout writes to: a :class:`RolloutTarget` (a store, or a served store), and the check that keeps
training and evaluation episodes in runs of their own."""

from __future__ import annotations

from typing import Any, Literal, Protocol

from trajstore.errors import InputError
from trajstore.query import sql

Mode = Literal["train", "eval"]


class RolloutTarget(Protocol):
    """What a rollout needs of a store: a writer, and SQL to check the run it writes to
    (a :class:`~trajstore.store.Store` or a :class:`~trajstore.remote.writer.RemoteStore`)."""

    root: Any

    def writer(self, *, run_id: str, env_id: str, **options: Any) -> Any: ...

    def sql(self, query: str) -> Any: ...


def check_run_mode(store: RolloutTarget, run_id: str, mode: Mode) -> None:
    """Refuse to mix training and evaluation episodes in one run, so their statistics never mix."""
    n = store.sql(sql.count_other_mode(run_id, mode)).column("n")[0].as_py()
    if n:
        other = "training (or untagged)" if mode == "eval" else "evaluation"
        raise InputError(f"run {run_id!r} already holds {other} steps; store {mode} episodes under their own "
                         "run_id so training and evaluation statistics never mix")
