"""The ``trajstore`` command line: every subcommand and its options (the commands are in
:mod:`trajstore.cli.commands`)."""

from __future__ import annotations

import argparse
from typing import Any

from trajstore.__about__ import __version__
from trajstore.cli import commands


def build_parser() -> argparse.ArgumentParser:
    from trajstore.settings import Settings

    settings = Settings.from_env()
    default_store = settings.store
    parser = argparse.ArgumentParser(prog="trajstore", description="Store RL trajectories and query them.")
    parser.add_argument("--version", action="version", version=f"trajstore {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    store_opt: dict[str, Any] = {"default": default_store,
                                 "help": f"store directory (default: $TRAJSTORE_STORE or {default_store})"}

    p = sub.add_parser("rollout", help="run a policy in an environment and store every transition")
    p.add_argument("--backend", choices=["gym", "jax"], default="gym",
                   help="gym: a gymnasium vector env; jax: a pure-JAX env under lax.scan + vmap")
    p.add_argument("--env", required=True, help="environment id, e.g. CartPole-v1 (gym) or cartpole (jax)")
    p.add_argument("--num-envs", type=int, default=8)
    p.add_argument("--episodes", type=int, help="stop after at least this many complete episodes")
    p.add_argument("--steps", type=int, help="stop after at least this many stored steps")
    p.add_argument("--store", **store_opt)
    p.add_argument("--url", help="send the episodes to the trajstore service at this URL instead of a store "
                                 "directory (a remote worker)")
    p.add_argument("--api-key", default=settings.api_key,
                   help="with --url: the service's API key (default: $TRAJSTORE_API_KEY)")
    p.add_argument("--run", required=True, help="run_id to store the episodes under")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--autoreset", choices=["next-step", "same-step", "disabled"], default="next-step",
                   help="gymnasium vector-env autoreset mode (default: next-step, gymnasium's default)")
    p.add_argument("--rollout-length", type=int, default=128,
                   help="jax: steps per lax.scan, each scan one (T, B) batch (default: 128)")
    p.add_argument("--frame-stack", type=int, metavar="K",
                   help="gym: stack each env's last K observations (gymnasium's FrameStackObservation); each "
                        "frame is stored once")
    p.add_argument("--policy-version", type=int, help="stored in the policy_version column")
    p.add_argument("--no-progress", action="store_true", help="do not show the progress bar")
    p.set_defaults(func=commands.cmd_rollout)

    p = sub.add_parser("import", help="store every episode of an existing dataset (Minari)")
    p.add_argument("source", choices=["minari"], help="the dataset format")
    p.add_argument("dataset", help="a local Minari dataset id, e.g. cartpole/random-v0 ($MINARI_DATASETS_PATH)")
    p.add_argument("--store", **store_opt)
    p.add_argument("--run", help="run_id to store the episodes under (default: the dataset id, / as -)")
    p.add_argument("--env", help="env_id (default: the environment the dataset was collected in)")
    p.add_argument("--no-progress", action="store_true", help="do not show the progress bar")
    p.set_defaults(func=commands.cmd_import)

    p = sub.add_parser("stats", help="episode statistics (n_traj, return_*, len_*), optionally grouped")
    p.add_argument("--store", **store_opt)
    p.add_argument("--by", action="append", default=[], help="group by this column (repeat or comma-separate)")
    p.add_argument("--gamma", type=float, help="also discounted_return_* for this discount factor")
    _filter_options(p)
    p.add_argument("--include-incomplete", action="store_true", help="also count unfinished episodes")
    _output_options(p)
    p.set_defaults(func=commands.cmd_stats)

    p = sub.add_parser("episodes", help="one row per episode")
    p.add_argument("--store", **store_opt)
    _filter_options(p)
    done = p.add_mutually_exclusive_group()
    done.add_argument("--complete", dest="complete", action="store_const", const=True, default=None)
    done.add_argument("--incomplete", dest="complete", action="store_const", const=False)
    p.add_argument("--gamma", type=float, help="add discounted_return for this discount factor")
    p.add_argument("--order-by", default="episode_id", help="column, prefixed with - for descending")
    p.add_argument("--limit", type=int, default=100)
    p.add_argument("--offset", type=int, default=0)
    _output_options(p)
    p.set_defaults(func=commands.cmd_episodes)

    p = sub.add_parser("sql", help="run one read-only SELECT over the steps and episodes views (sandboxed)",
                       description="Run one SELECT over the steps and episodes views, in the same sandbox as the "
                                   "service's POST /sql: a single SELECT, no file access (only the two views), "
                                   "nothing written, in a worker process of at most TRAJSTORE_SQL_WORKER_BYTES of "
                                   "memory. Every row is printed unless --limit is given. --unsafe "
                                   "lifts the sandbox for your own queries: any statement (COPY ... TO, CREATE), "
                                   "any file this user may read or write.")
    p.add_argument("query", help='e.g. "SELECT run_id, count(*) FROM steps GROUP BY run_id"')
    p.add_argument("--store", **store_opt)
    p.add_argument("--limit", type=int, help="print at most this many rows (default: all); says so on stderr "
                                             "when the query returned more")
    p.add_argument("--unsafe", action="store_true",
                   help="no sandbox: run any SQL with this user's file access (read_csv of any file, COPY ... TO, "
                        "CREATE); only for queries you wrote yourself")
    p.add_argument("--run", action="append", help="the views hold only this run_id's steps (repeatable)")
    p.add_argument("--env", action="append",
                   help="the views hold only this env_id's steps (repeatable): every column in its own type "
                        "(over environments whose columns differ in type, such a column is a VARIANT)")
    _output_options(p)
    p.set_defaults(func=commands.cmd_sql)

    p = sub.add_parser("serve", help="serve the REST API and dashboard over a store (uvicorn)")
    p.add_argument("--store", **store_opt)
    p.add_argument("--host", help="address to listen on (default: $TRAJSTORE_HOST or 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default: $TRAJSTORE_PORT or 8321)")
    p.add_argument("--api-key", help="enable authenticated ingest with this key (default: $TRAJSTORE_API_KEY)")
    p.add_argument("--create", action="store_true", help="make an empty store at --store if there is none")
    p.set_defaults(func=commands.cmd_serve)

    p = sub.add_parser("compact", help="rewrite partitions of many small files as a few large ones")
    p.add_argument("--store", **store_opt)
    p.add_argument("--run", action="append", default=[], help="only this run (repeatable, or comma-separated)")
    p.add_argument("--env", action="append", default=[], help="only this env (repeatable, or comma-separated)")
    p.add_argument("--target-mb", type=float, default=128.0, help="size of the new files (default: %(default)s)")
    p.add_argument("--no-progress", action="store_true", help="do not show the progress bar")
    p.set_defaults(func=commands.cmd_compact)

    p = sub.add_parser("check", help="verify committed files and episodes; exit 1 if anything is wrong")
    p.add_argument("--store", **store_opt)
    p.add_argument("--remove-orphans", action="store_true",
                   help="then delete the files no commit lists (left by killed writers) that are old enough")
    p.add_argument("--older-than", type=float, default=60.0, metavar="MINUTES",
                   help="with --remove-orphans: only files last modified this long ago (default: %(default)s)")
    p.set_defaults(func=commands.cmd_check)

    p = sub.add_parser("delete", help="delete whole episodes (a run, or those a condition selects) in one commit")
    p.add_argument("--store", **store_opt)
    p.add_argument("--run", action="append", default=[], help="delete this run (repeatable, or comma-separated)")
    p.add_argument("--where", help="delete the episodes whose every step this SQL condition over steps selects, "
                                   "e.g. \"policy_version < 3\"; refused if it selects part of an episode")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation (needed when not on a "
                                                              "terminal)")
    p.set_defaults(func=commands.cmd_delete)

    p = sub.add_parser("history", help="the store's versions: each commit, its rows added/removed and runs")
    p.add_argument("--store", **store_opt)
    p.add_argument("--limit", type=int, help="only the last N versions")
    _output_options(p)
    p.set_defaults(func=commands.cmd_history)

    p = sub.add_parser("vacuum", help="delete files no version of the retention period needs (deleted, compacted)")
    p.add_argument("--store", **store_opt)
    p.add_argument("--older-than", default="7d", help="retention period: keep every version committed within "
                                                      "it (e.g. 7d, 12h, 30m; default: %(default)s)")
    p.add_argument("--dry-run", action="store_true", help="list the files, delete nothing")
    p.set_defaults(func=commands.cmd_vacuum)

    p = sub.add_parser("export", help="write a run's episodes as a dataset of another format")
    p.add_argument("format", choices=["minari", "lerobot"],
                   help="minari: a Minari dataset ($MINARI_DATASETS_PATH); lerobot: LeRobot's chunked Parquet "
                        "layout (meta/*.json, data/chunk-*/episode_*.parquet) in a new folder")
    p.add_argument("name", help="minari: the dataset id (e.g. cartpole/trajstore-v0); lerobot: the folder")
    p.add_argument("--store", **store_opt)
    p.add_argument("--run", action="append", default=[], help="only this run (repeatable, or comma-separated)")
    p.add_argument("--where", help="only the episodes this condition over the episodes view selects")
    p.add_argument("--version", dest="at_version", type=int, metavar="N", help="export the store as of version N")
    p.set_defaults(func=commands.cmd_export)
    for name in ("stats", "episodes", "sql"):
        sub.choices[name].add_argument("--version", dest="at_version", type=int, metavar="N",
                                       help="read the store as it was at version N (see trajstore history)")
    return parser


def _filter_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run", action="append", help="only this run_id (repeatable)")
    p.add_argument("--env", action="append", help="only this env_id (repeatable)")
    p.add_argument("--where", help="an SQL condition over the episodes view, e.g. \"episode_return > 100\"")


def _output_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", choices=["table", "csv", "json", "parquet"], default="table")
    p.add_argument("--output", "-o", help="write to this file instead of standard output")
