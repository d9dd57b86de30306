"""What an interrupted ``trajstore rollout`` kept, and the commands that go on from there or remove it.

A rollout stopped with Ctrl-C commits what it stepped on its way out (its writer flushes when it closes), so its
run holds those episodes: running the same command again is refused (the run exists), and with ``--append`` alone
would step the same seeds through the same episodes again. :func:`kept` counts, from the store, what this process
(its ``worker_id``) stored in the run; :func:`report` says so, with the command that goes on (the steps or episodes
left, new seeds, ``--append``) and the one that removes them (``trajstore delete --run``; only this process's
episodes, by their ``worker_id``, where the run holds others too).
"""

from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass
from typing import Any, Sequence

from trajstore.query import sql


@dataclass(frozen=True)
class Kept:
    """What one process stored in a run: its steps, complete and unfinished episodes, and how many episodes the run
    holds from other writers."""

    steps: int
    complete: int
    unfinished: int
    others: int


def kept(store: Any, run_id: str, worker_id: str) -> Kept:
    """What the writer ``worker_id`` stored in ``run_id`` of ``store`` (a store or a served one), read from it."""
    row = store.sql(sql.worker_kept(run_id, worker_id)).to_pylist()[0]
    return Kept(int(row["steps"]), int(row["complete"]), int(row["unfinished"]), int(row["others"]))


def report(args: argparse.Namespace, argv: Sequence[str], found: Kept, where: Any, worker_id: str) -> str:
    """The lines an interrupted rollout (``args``, given as ``argv``) prints: what run ``args.run`` kept in
    ``where`` of it (``found``), how to go on and how to remove it."""
    run = args.run
    if not found.steps:
        held = f"run {run!r} holds only the episodes it held before" if found.others else \
            f"run {run!r} is not in the store; the same command starts it again"
        return f"trajstore: interrupted before this rollout stored any step; {held}"
    lines = [f"trajstore: interrupted; run {run!r} keeps what this rollout stored in {where} before it stopped: "
             f"{found.steps:,} steps, {found.complete:,} complete episodes"
             + (f" and {found.unfinished:,} unfinished (stored, marked incomplete)" if found.unfinished else ""),
             f"  to go on ({_left(args, found)}, new seeds, so that the envs do not replay the episodes stored):",
             f"    {continue_command(args, argv, found)}"]
    remove = remove_command(args, found, worker_id)
    if remove:
        lines += ["  to remove them:", f"    {remove}"]
    return "\n".join(lines)


def _left(args: argparse.Namespace, found: Kept) -> str:
    """What is left to do, in words: ``the 9,000 steps left``."""
    parts = []
    if args.steps is not None and args.steps > found.steps:
        parts.append(f"{args.steps - found.steps:,} steps")
    if args.episodes is not None and args.episodes > found.complete:
        parts.append(f"{args.episodes - found.complete:,} episodes")
    return "the " + " and ".join(parts) + " left" if parts else "as many again"


def continue_command(args: argparse.Namespace, argv: Sequence[str], found: Kept) -> str:
    """``argv`` again, as a shell command: what is left of ``--steps``/``--episodes``, ``--seed`` past every seed the
    rollout used (env ``i`` started from seed + i) and ``--append``."""
    steps = args.steps - found.steps if args.steps is not None else None
    episodes = args.episodes - found.complete if args.episodes is not None else None
    if (steps is None or steps < 1) and (episodes is None or episodes < 1):  # done but for the last flush: again
        steps, episodes = args.steps, args.episodes
    replaced = {"--steps": steps, "--episodes": episodes, "--seed": args.seed + args.num_envs, "--append": None}
    out = ["trajstore"]
    tokens = list(argv)
    i = 0
    while i < len(tokens):
        name, eq, _ = tokens[i].partition("=")
        flag = _flag(name, replaced)
        if flag is None:
            out.append(tokens[i])
        elif flag != "--append" and not eq:
            i += 1  # its value, the next word
        i += 1
    for flag, value in replaced.items():
        if value is not None and (flag == "--seed" or value > 0):
            out += [flag, str(value)]
    return shlex.join([*out, "--append"])


def _flag(word: str, flags: Any) -> str | None:
    """The flag of ``flags`` that ``word`` names (argparse takes a flag's unambiguous beginning), or None."""
    if not word.startswith("--") or len(word) < 3:
        return None
    named = [f for f in flags if f.startswith(word)]
    return named[0] if len(named) == 1 else None


def remove_command(args: argparse.Namespace, found: Kept, worker_id: str) -> str | None:
    """The command that deletes what the rollout stored: the whole run when it holds nothing else, else this
    process's episodes (by ``worker_id``); None for a served store (``--url``) whose run holds others too."""
    if args.url:  # the service's route, behind its API key (never printed)
        url = shlex.quote(f"{args.url.rstrip('/')}/runs/{_run_path(args.run)}")
        return None if found.others else f'curl -X DELETE -H "Authorization: Bearer $TRAJSTORE_API_KEY" {url}'
    command = shlex.join(["trajstore", "delete", "--store", str(args.store), "--run", args.run])
    if found.others:
        command += " --where " + _quoted(f"worker_id = {sql.literal(worker_id)}")
    return command


def _quoted(text: str) -> str:
    """``text`` as one shell word: in double quotes where that needs no escapes (SQL's quotes stay readable)."""
    return f'"{text}"' if not set(text) & set('"$`\\!') else shlex.quote(text)


def _run_path(run_id: str) -> str:
    """``run_id`` as one segment of a URL path."""
    from urllib.parse import quote

    return quote(run_id, safe="")
