"""The ``trajstore`` command: rollouts, statistics, episodes, SQL and checks from a shell.

Errors are printed as one line (``trajstore: error: …``) with exit status 2; ``check`` exits 1
when the store has problems. Set ``TRAJSTORE_DEBUG=1`` to see a traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any, Sequence

from trajstore.errors import InputError, TrajstoreError

log = logging.getLogger(__name__)

EXIT_PROBLEMS, EXIT_ERROR = 1, 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(_attach_negative_values(list(sys.argv[1:] if argv is None else argv)))
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("trajstore: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # noqa: BLE001 - the one place that turns errors into a message and an exit code
        if os.environ.get("TRAJSTORE_DEBUG"):
            raise
        print(f"trajstore: error: {_message(exc)}", file=sys.stderr)
        return EXIT_ERROR


def _attach_negative_values(argv: list[str]) -> list[str]:
    """``--order-by -episode_return`` means descending order, not an unknown option."""
    out: list[str] = []
    for arg in argv:
        if out and out[-1] == "--order-by" and arg.startswith("-"):
            out[-1] = f"--order-by={arg}"
        else:
            out.append(arg)
    return out


def _message(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, (TrajstoreError, OSError)):
        return text
    return f"{type(exc).__name__}: {text} (set TRAJSTORE_DEBUG=1 for a traceback)"


# --- parser ----------------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    from trajstore.settings import Settings

    default_store = Settings.from_env().store
    parser = argparse.ArgumentParser(prog="trajstore", description="Store RL trajectories and query them.")
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
    p.add_argument("--api-key", default=os.environ.get("TRAJSTORE_API_KEY"),
                   help="with --url: the service's API key (default: $TRAJSTORE_API_KEY)")
    p.add_argument("--run", required=True, help="run_id to store the episodes under")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--autoreset", choices=["next-step", "same-step", "disabled"], default="next-step",
                   help="gymnasium vector-env autoreset mode (default: next-step, gymnasium's default)")
    p.add_argument("--rollout-length", type=int, default=128,
                   help="jax: steps per lax.scan, each scan one (T, B) batch (default: 128)")
    p.add_argument("--policy-version", type=int, help="stored in the policy_version column")
    p.add_argument("--no-progress", action="store_true", help="do not show the progress bar")
    p.set_defaults(func=cmd_rollout)

    p = sub.add_parser("import", help="store every episode of an existing dataset (Minari)")
    p.add_argument("source", choices=["minari"], help="the dataset format")
    p.add_argument("dataset", help="a local Minari dataset id, e.g. cartpole/random-v0 ($MINARI_DATASETS_PATH)")
    p.add_argument("--store", **store_opt)
    p.add_argument("--run", help="run_id to store the episodes under (default: the dataset id, / as -)")
    p.add_argument("--env", help="env_id (default: the environment the dataset was collected in)")
    p.add_argument("--no-progress", action="store_true", help="do not show the progress bar")
    p.set_defaults(func=cmd_import)

    p = sub.add_parser("stats", help="episode statistics (n_traj, return_*, len_*), optionally grouped")
    p.add_argument("--store", **store_opt)
    p.add_argument("--by", action="append", default=[], help="group by this column (repeat or comma-separate)")
    p.add_argument("--gamma", type=float, help="also discounted_return_* for this discount factor")
    _filter_options(p)
    p.add_argument("--include-incomplete", action="store_true", help="also count unfinished episodes")
    _output_options(p)
    p.set_defaults(func=cmd_stats)

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
    p.set_defaults(func=cmd_episodes)

    p = sub.add_parser("sql", help="run a SQL query over the steps and episodes views")
    p.add_argument("query", help='e.g. "SELECT run_id, count(*) FROM steps GROUP BY run_id"')
    p.add_argument("--store", **store_opt)
    _output_options(p)
    p.set_defaults(func=cmd_sql)

    p = sub.add_parser("serve", help="serve the REST API and dashboard over a store (uvicorn)")
    p.add_argument("--store", **store_opt)
    p.add_argument("--host", help="address to listen on (default: $TRAJSTORE_HOST or 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default: $TRAJSTORE_PORT or 8321)")
    p.add_argument("--api-key", help="enable authenticated ingest with this key (default: $TRAJSTORE_API_KEY)")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("compact", help="rewrite partitions of many small files as a few large ones")
    p.add_argument("--store", **store_opt)
    p.add_argument("--run", action="append", default=[], help="only this run (repeatable, or comma-separated)")
    p.add_argument("--env", action="append", default=[], help="only this env (repeatable, or comma-separated)")
    p.add_argument("--target-mb", type=float, default=128.0, help="size of the new files (default: %(default)s)")
    p.add_argument("--no-progress", action="store_true", help="do not show the progress bar")
    p.set_defaults(func=cmd_compact)

    p = sub.add_parser("check", help="verify committed files and episodes; exit 1 if anything is wrong")
    p.add_argument("--store", **store_opt)
    p.add_argument("--remove-orphans", action="store_true",
                   help="then delete the files no commit lists (left by killed writers) that are old enough")
    p.add_argument("--older-than", type=float, default=60.0, metavar="MINUTES",
                   help="with --remove-orphans: only files last modified this long ago (default: %(default)s)")
    p.set_defaults(func=cmd_check)
    return parser


def _filter_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run", action="append", help="only this run_id (repeatable)")
    p.add_argument("--env", action="append", help="only this env_id (repeatable)")
    p.add_argument("--where", help="an SQL condition over the episodes view, e.g. \"episode_return > 100\"")


def _output_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", choices=["table", "csv", "json", "parquet"], default="table")
    p.add_argument("--output", "-o", help="write to this file instead of standard output")


# --- commands ----------------------------------------------------------------------------------------------

def _open(path: str, create: bool = False) -> Any:
    import trajstore

    return trajstore.open(path, create=create)


def _emit(args: argparse.Namespace, table: Any) -> None:
    from trajstore import formats

    formats.write(table, args.format, sys.stdout, output=args.output)


def cmd_rollout(args: argparse.Namespace) -> int:
    if args.episodes is None and args.steps is None:
        raise InputError("rollout: give --episodes N or --steps N (or both)")
    if args.url:
        from trajstore.remote import RemoteStore

        store: Any = RemoteStore(args.url, api_key=args.api_key)
    else:
        store = _open(args.store, create=True)
    lineage = {"policy_version": args.policy_version} if args.policy_version is not None else {}
    if args.backend == "jax":
        from trajstore.rollout import jax_rollout

        result = jax_rollout(store, args.env, run_id=args.run, num_envs=args.num_envs,
                             rollout_length=args.rollout_length, episodes=args.episodes, steps=args.steps,
                             seed=args.seed, progress=not args.no_progress, **lineage)
    else:
        from trajstore.rollout import gym_rollout

        result = gym_rollout(store, args.env, run_id=args.run, num_envs=args.num_envs, episodes=args.episodes,
                             steps=args.steps, seed=args.seed, autoreset=args.autoreset,
                             progress=not args.no_progress, **lineage)
    print(f"stored {result.steps} steps, {result.episodes} complete episodes of {result.env_id} "
          f"as run {result.run_id!r} in {store.root} ({result.steps_per_second:,.0f} steps/s)")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from trajstore.minari_import import import_minari

    store = _open(args.store, create=True)
    result = import_minari(store, args.dataset, run_id=args.run, env_id=args.env, progress=not args.no_progress)
    print(f"imported {result.steps} steps, {result.episodes} complete episodes of {args.source} dataset "
          f"{args.dataset!r} as run {result.run_id!r} ({result.env_id}) in {store.root}")
    return 0


def _split(values: list[str]) -> list[str]:
    return [v.strip() for item in values for v in item.split(",") if v.strip()]


def cmd_stats(args: argparse.Namespace) -> int:
    store = _open(args.store)
    table = store.stats(by=_split(args.by), gamma=args.gamma, where=args.where, run_id=args.run,
                        env_id=args.env, include_incomplete=args.include_incomplete)
    _emit(args, table)
    return 0


def cmd_episodes(args: argparse.Namespace) -> int:
    store = _open(args.store)
    table = store.episodes(run_id=args.run, env_id=args.env, complete=args.complete, where=args.where,
                           gamma=args.gamma, order_by=args.order_by, limit=args.limit, offset=args.offset)
    _emit(args, table)
    return 0


def cmd_sql(args: argparse.Namespace) -> int:
    _emit(args, _open(args.store).sql(args.query))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    import dataclasses

    import uvicorn

    from api.app import create_app
    from trajstore.settings import Settings

    settings = Settings.from_env()
    overrides = {"store": args.store, "host": args.host, "port": args.port, "api_key": args.api_key}
    settings = dataclasses.replace(settings, **{k: v for k, v in overrides.items() if v is not None})
    app = create_app(settings)
    print(f"trajstore: serving {app.state.store.root} on http://{settings.host}:{settings.port} "
          f"(dashboard at /dashboard, OpenAPI at /openapi.json)", flush=True)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level="warning")
    return 0


def cmd_compact(args: argparse.Namespace) -> int:
    from trajstore.compact import compact

    report = compact(_open(args.store), run_id=_split(args.run) or None, env_id=_split(args.env) or None,
                     target_bytes=int(args.target_mb * 2**20), progress=not args.no_progress)
    print(report.format())
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from trajstore.check import check

    store = _open(args.store)
    report = check(store)
    print(report.format())
    if args.remove_orphans:
        from trajstore.check import remove_orphans

        removed = remove_orphans(store, older_than_s=args.older_than * 60)
        kept = len(report.orphans) - len(removed)
        print(f"removed {len(removed)} orphan file(s) older than {args.older_than:g} minutes"
              + (f"; kept {kept} newer one(s)" if kept > 0 else ""))
    return 0 if report.ok else EXIT_PROBLEMS


if __name__ == "__main__":
    sys.exit(main())
