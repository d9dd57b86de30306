"""The ``trajstore`` subcommands: each takes the parsed arguments, does its work through the library and
prints its result (see :mod:`trajstore.cli.parser` for their options). Errors are raised, never printed here:
:mod:`trajstore.cli.main` says them in one line, with the flags in place of the library's argument names."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from trajstore.durations import text
from trajstore.errors import InputError, StoreNotFoundError

EXIT_PROBLEMS = 1
EXIT_INTERRUPTED = 130


def _open(path: str, create: bool = False, version: int | None = None) -> Any:
    import trajstore

    try:
        return trajstore.open(path, create=create, version=version)
    except StoreNotFoundError:
        raise StoreNotFoundError(f"no trajstore store at {path}: check --store (default: $TRAJSTORE_STORE); "
                                 f"`trajstore rollout --store {path} …` writes one, `trajstore serve --create` "
                                 "serves a new empty one") from None


def plumbing(store: Any) -> Any:
    """What a command needs of a store beyond the researcher's methods (:func:`trajstore.store.plumbing`)."""
    from trajstore.store import plumbing as of

    return of(store)


def _progress(args: argparse.Namespace) -> bool:
    """A progress bar only on a terminal (never redrawn into a log file or a pipe), and not with --no-progress."""
    return not args.no_progress and sys.stderr.isatty()


def _emit(args: argparse.Namespace, table: Any, *, keys: tuple[str, ...] = (), brief: list[str] | None = None,
          hoist: tuple[str, ...] = ()) -> None:
    """Print ``table`` as ``--format`` asks: only ``--columns`` where given; a table shows the ``brief`` columns
    (None: all) unless ``--wide``, those of ``hoist`` that hold one value in every row said once above it, and
    fits the terminal's width in blocks each repeating ``keys``."""
    from trajstore.cli import formats

    note, caption = "", ""
    if args.columns:
        table = _columns(table, _split(args.columns) or [])
    elif brief is not None and args.format == "table" and not args.wide:
        shown = [c for c in table.column_names if c in brief]
        if len(shown) < table.num_columns:
            note = f"{table.num_columns - len(shown)} more columns: --wide, or --columns NAME,..."
        same = [c for c in hoist if c in shown and table.num_rows > 1 and table[c].null_count == 0
                and len(table[c].unique()) == 1]
        if same:
            caption = "every row: " + ", ".join(f"{c} {table[c][0].as_py()}" for c in same)
        table = table.select([c for c in shown if c not in same])
    width = None if args.wide or args.output else formats.terminal_width(sys.stdout)
    formats.write(table, args.format, sys.stdout, output=args.output, width=width, keys=keys, note=note,
                  caption=caption)


def _columns(table: Any, names: list[str]) -> Any:
    """``table``'s columns ``names``, in that order, or an error naming the missing ones and the table's columns."""
    missing = [n for n in names if n not in table.column_names]
    if missing:
        raise InputError(f"--columns: no column {', '.join(map(repr, missing))} in the result; its columns: "
                         f"{', '.join(table.column_names)}")
    return table.select(names)


def cmd_rollout(args: argparse.Namespace) -> int:
    _check_rollout(args)
    description = _run_description(args)  # a bad --config-file is said before any store is made
    policy = _policy(args)  # so is a bad --policy
    run = _rollout_of(args.backend)  # and a missing extra
    if args.url:
        from trajstore.extras import needed

        with needed("client", "trajstore rollout --url"):
            from trajstore.remote.writer import RemoteStore
        store: Any = RemoteStore(args.url, api_key=args.api_key)
    else:
        store = _open(args.store, create=True)
    from trajstore.rollout.target import check_run

    check_run(store, args.run, mode=args.mode, append=args.append, hint="--append")
    from trajstore.write.writer import process_worker_id

    options: dict[str, Any] = {"policy_version": args.policy_version} if args.policy_version is not None else {}
    options.update(description)
    options.update({"info_keys": _split(args.info_key)} if args.info_key else {})
    options.update(run_id=args.run, num_envs=args.num_envs, episodes=args.episodes, steps=args.steps,
                   seed=args.seed, mode=args.mode, append=True, policy=policy, progress=_progress(args),
                   worker_id=process_worker_id())  # what an interrupted rollout counts its episodes by
    try:
        result = _roll_out(args, run, store, options)
    except KeyboardInterrupt:  # what the writer committed on its way out: said, with how to go on
        from trajstore.cli import interrupted

        found = interrupted.kept(store, args.run, options["worker_id"])
        print(interrupted.report(args, args.argv, found, store.root, options["worker_id"]), file=sys.stderr)
        return EXIT_INTERRUPTED
    print(f"stored {result.steps} steps, {result.episodes} complete episodes of {result.env_id} "
          f"as run {result.run_id!r} ({args.mode}) in {store.root} ({result.steps_per_second:,.0f} steps/s)")
    return 0


def _rollout_of(backend: str) -> Any:
    """``jax_rollout`` or ``gym_rollout``, imported (a :class:`~trajstore.errors.MissingExtraError` naming the
    ``jax`` or ``gym`` extra where it is not installed)."""
    from trajstore.extras import needed

    with needed(backend, f"trajstore rollout --backend {backend}"):
        if backend == "jax":
            from trajstore.rollout import jax_rollout

            return jax_rollout
        from trajstore.rollout import gym_rollout

        return gym_rollout


def _roll_out(args: argparse.Namespace, run: Any, store: Any, options: dict[str, Any]) -> Any:
    """The rollout ``args`` ask for (``run``: ``jax_rollout`` or ``gym_rollout``) with the rollout's ``options``: its
    :class:`RolloutResult`."""
    if args.backend == "jax":
        return run(store, args.env, rollout_length=args.rollout_length, **options)
    wrappers, env_kwargs = _gym_wrappers(args)
    return run(store, args.env, autoreset=args.autoreset, wrappers=wrappers, env_kwargs=env_kwargs, **options)


def _check_rollout(args: argparse.Namespace) -> None:
    """The rollout's flags that do not go together, each said before anything runs."""
    if args.mode == "eval" and (args.episodes is None or args.steps is not None):
        raise InputError("--mode eval runs exactly --episodes N complete episodes: give --episodes N "
                         "(and no --steps)")
    if args.episodes is None and args.steps is None:
        raise InputError("rollout: give --episodes N or --steps N (or both)")
    if args.frame_stack is not None and (args.backend != "gym" or args.frame_stack < 2):
        raise InputError("rollout: --frame-stack K stacks the last K >= 2 observations of a --backend gym env, "
                         f"got K={args.frame_stack} with --backend {args.backend}")
    if args.atari:
        from trajstore.rollout.atari import is_atari

        if args.backend != "gym" or not is_atari(args.env):
            raise InputError(f"--atari: preprocesses an Atari game of --backend gym, ALE/... (e.g. "
                             f"ALE/Breakout-v5), got --env {args.env} with --backend {args.backend}")


def _policy(args: argparse.Namespace) -> Any:
    """``--policy``: the policy it names (deterministic in evaluation), or None for random actions. A
    ``module:function`` is found in the current directory too, as ``python -m`` would find it."""
    if args.policy is None:
        return None
    import os

    from trajstore.rollout.policies import load_policy

    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    return load_policy(args.policy, backend=args.backend, deterministic=args.mode == "eval")


def _gym_wrappers(args: argparse.Namespace) -> tuple[list[Any], dict[str, Any]]:
    """``(wrappers, env_kwargs)`` of each gym env: DQN's preprocessing with ``--atari``, a frame stack with
    ``--frame-stack K``."""
    if args.atari:
        from trajstore.rollout.atari import dqn_preprocessing

        return dqn_preprocessing(args.frame_stack or 4)
    return _frame_stacker(args.frame_stack), {}


def _run_description(args: argparse.Namespace) -> dict[str, Any]:
    """``config``, ``tags``, ``notes`` from ``--config-file``, ``--config KEY=VALUE``, ``--tag``, ``--notes``
    (those given)."""
    from pathlib import Path

    out: dict[str, Any] = {}
    config: dict[str, Any] = {}
    if args.config_file:
        from trajstore.cli import config_file

        config.update(config_file.load(Path(args.config_file)))
    for item in args.config or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise InputError(f"--config: expected KEY=VALUE, got {item!r}")
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        *parents, last = key.strip().split(".")
        target = config
        for part in parents:
            inner = target.setdefault(part, {})
            if not isinstance(inner, dict):
                raise InputError(f"--config: {key.strip()} nests under {part}, which holds a value")
            target = inner
        target[last] = value
    if args.config_file or args.config:
        out["config"] = config
    if args.tag:
        out["tags"] = args.tag
    if args.notes is not None:
        out["notes"] = args.notes
    return out


def cmd_runs(args: argparse.Namespace) -> int:
    import pyarrow as pa

    store = _open(args.store, version=args.at_version)
    table = store.runs()
    infos = plumbing(store).run_infos()
    ids = table["run_id"].to_pylist()
    described = [infos.get(r, {}) for r in ids]
    table = table.append_column("tags", pa.array([",".join(d.get("tags") or []) for d in described], pa.string()))
    table = table.append_column("notes", pa.array([d.get("notes") for d in described], pa.string()))
    table = table.append_column("config", pa.array([json.dumps(d.get("config") or {}, sort_keys=True)
                                                    for d in described], pa.string()))
    _emit(args, table, keys=("run_id", "env_id"))
    return 0


def cmd_describe(args: argparse.Namespace) -> int:
    given = _run_description(args)
    if not given:
        raise InputError("describe: give --config KEY=VALUE, --config-file, --tag or --notes")
    store = _open(args.store)
    store.set_run(args.run, **given)
    info = store.run_info(args.run)
    print(f"run {args.run!r}: config {json.dumps(info['config'], sort_keys=True)}, tags "
          f"{', '.join(info['tags']) or '(none)'}, notes {info['notes'] if info['notes'] is not None else '(none)'}")
    return 0


def _frame_stacker(k: int | None) -> list[Any]:
    """``--frame-stack K``: each env wrapped in gymnasium's FrameStackObservation (gym_rollout finds it there
    and stores each frame once)."""
    if k is None:
        return []
    import functools

    import gymnasium as gym

    return [functools.partial(gym.wrappers.FrameStackObservation, stack_size=k)]


def cmd_import(args: argparse.Namespace) -> int:
    from trajstore.extras import needed
    from trajstore.rollout.minari import import_minari

    with needed("minari", "trajstore import"):
        import minari  # noqa: F401 - said before any store is made

    store = _open(args.store, create=True)
    result = import_minari(store, args.dataset, run_id=args.run, env_id=args.env, progress=_progress(args))
    print(f"imported {result.steps} steps, {result.episodes} complete episodes of {args.source} dataset "
          f"{args.dataset!r} as run {result.run_id!r} ({result.env_id}) in {store.root}")
    return 0


def _split(values: list[str] | None) -> list[str] | None:
    """Repeated and comma-separated values as one list (None when there are none: no condition)."""
    found = [v.strip() for item in values or [] for v in item.split(",") if v.strip()]
    return found or None


def _envs(store: Any, values: list[str] | None) -> list[str] | None:
    """``--env`` values (:func:`_split`), each one an environment the store holds, or an error naming it and
    listing them (as ``--run`` does runs)."""
    wanted = _split(values)
    if wanted:
        held = sorted({f.env_id for f in store.maintain.files()})
        missing = [e for e in wanted if e not in held]
        if missing:
            raise InputError(f"--env: no environment {', '.join(map(repr, missing))} in {store.uri}; its "
                             f"environments: {', '.join(held) or 'none yet'}")
    return wanted


def cmd_stats(args: argparse.Namespace) -> int:
    store = _open(args.store, version=args.at_version)
    table = store.stats(by=_split(args.by), gamma=args.gamma, where=args.where, run_id=_split(args.run),
                        env_id=_envs(store, args.env), include_incomplete=args.include_incomplete,
                        metric=args.metric)
    _emit(args, table, keys=tuple(_split(args.by) or ()))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    store = _open(args.store, version=args.at_version)
    normalize = {}
    for item in args.normalize or []:
        task, sep, bounds = item.rpartition("=")
        low, colon, high = bounds.partition(":")
        try:
            if not sep or not colon:
                raise ValueError
            normalize[task] = (float(low), float(high))
        except ValueError:
            raise InputError(f"--normalize: expected TASK=LOW:HIGH, got {item!r}") from None
    table = store.compare(_split(args.by), metric=args.metric, task=args.task, last=args.last, mode=args.mode,
                          normalize=normalize or None, statistics=args.statistic or compare_statistics(),
                          ci=args.ci, reps=args.reps, seed=args.seed, run_id=_split(args.run), where=args.where)
    if args.format == "table":  # at a glance: 12.3 [10.1, 14.0]
        table = _rounded(table)
    _emit(args, table, keys=(*(_split(args.by) or ()), "statistic"))
    return 0


def compare_statistics() -> tuple[str, ...]:
    from trajstore.query.compare import STATISTICS

    return STATISTICS


def _rounded(table: Any) -> Any:
    """A comparison's ``value``, ``ci_low``, ``ci_high`` as one column ``value [95% CI]`` of 4 significant
    digits, for people."""
    import pyarrow as pa

    def show(v: float | None) -> str:
        return "" if v is None else f"{v:.4g}"

    cells = [f"{show(v)} [{show(lo)}, {show(hi)}]" if v is not None else "(needs --normalize)"
             for v, lo, hi in zip(*(table[c].to_pylist() for c in ("value", "ci_low", "ci_high")))]
    at = table.column_names.index("value")
    return table.drop_columns(["value", "ci_low", "ci_high"]).add_column(at, "value [CI]", pa.array(cells))


# what an episode's row shows in a table (the rest with --wide or --columns): which it is and how it went
EPISODE_COLUMNS = ["run_id", "env_id", "episode_id", "episode_length", "episode_return", "terminated", "truncated",
                   "discounted_return"]


def cmd_episodes(args: argparse.Namespace) -> int:
    store = _open(args.store, version=args.at_version)
    table = store.episodes(run_id=_split(args.run), env_id=_envs(store, args.env), complete=args.complete,
                           where=args.where, gamma=args.gamma, order_by=args.order_by, limit=args.limit,
                           offset=args.offset)
    _emit(args, table, keys=("episode_id",), brief=EPISODE_COLUMNS + [args.order_by.lstrip("-")],
          hoist=("run_id", "env_id"))
    return 0


def cmd_sql(args: argparse.Namespace) -> int:
    """One SELECT over the views in the sandbox (no file access, nothing written; every row unless
    ``--limit``), or with ``--unsafe`` any SQL on the trusted path."""
    if args.limit is not None and args.limit < 0:
        raise InputError(f"--limit: must be a number of rows >= 0, got {args.limit}")
    store = _open(args.store, version=args.at_version)
    selection = {"run_id": args.run or None, "env_id": _envs(store, args.env)}
    if args.unsafe:
        table = store.sql(args.query, **selection)
        truncated = args.limit is not None and table.num_rows > args.limit
        table = table.slice(0, args.limit) if truncated else table
    else:
        from trajstore.query.sandbox import Limits

        served = plumbing(store)
        limits = Limits.unbounded(max_rows=args.limit, worker_bytes=served.settings.sql_worker_bytes)
        result = served.sandboxed_sql(args.query, limits, **selection)
        table, truncated = result.table, result.truncated
    if truncated:
        print(f"trajstore: showing the first {args.limit} rows; the query returned more (raise --limit)",
              file=sys.stderr)
    _emit(args, table)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    import dataclasses

    from trajstore.cli.allocators import serving_allocators
    from trajstore.extras import needed

    serving_allocators()

    with needed("serve", "trajstore serve"):
        import uvicorn

        from trajstore.api.app import create_app, server_config
        from trajstore.api.settings import ServiceSettings

    settings = ServiceSettings.from_env()
    overrides = {"store": args.store, "host": args.host, "port": args.port, "api_key": args.api_key,
                 "commit_interval": args.commit_interval}
    settings = dataclasses.replace(settings, **{k: v for k, v in overrides.items() if v is not None})
    try:
        app = create_app(settings, create=args.create)
    except StoreNotFoundError:
        raise StoreNotFoundError(f"no trajstore store at {settings.store}: check --store, or add --create to "
                                 "serve a new empty store there") from None
    sock = _listen(settings.host, settings.port)  # before the banner: a busy port is an error, not a banner
    print(f"trajstore: serving {app.state.store.root} on http://{settings.host}:{settings.port} "
          f"(dashboard at /dashboard, OpenAPI at /openapi.json)", flush=True)
    server = uvicorn.Server(server_config(app))
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn shut down, then raised the Ctrl-C again: how a server stops, so done (0)
        print("trajstore: stopped serving (Ctrl-C)", file=sys.stderr)
    return 0


def _listen(host: str, port: int) -> Any:
    """A socket bound to ``host:port``, or an error that says why it cannot be."""
    import socket

    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except socket.gaierror as exc:
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc} (check --host: an address or a "
                      "name of this machine)") from None
    except OSError as exc:
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc} (is another server running "
                      "there? choose another with --port)") from None
    sock.set_inheritable(True)
    return sock


def cmd_compact(args: argparse.Namespace) -> int:
    from trajstore.store import compact

    report = compact(_open(args.store), run_id=_split(args.run), env_id=_split(args.env),
                     target_bytes=int(args.target_mb * 2**20), progress=_progress(args))
    print(report.format())
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from trajstore.store import check, remove_orphans

    store = _open(args.store)
    report = check(store)
    print(report.format())
    if args.remove_orphans:
        from trajstore.durations import text

        removed = remove_orphans(store, older_than_s=args.older_than)
        kept = len(report.orphans) - len(removed)
        print(f"removed {len(removed)} orphan file(s) older than {text(args.older_than)}"
              + (f"; kept {kept} newer one(s)" if kept > 0 else ""))
    return 0 if report.ok else EXIT_PROBLEMS


def cmd_delete(args: argparse.Namespace) -> int:
    """With --yes, delete in one commit and say what went; else say what would go, ask on a terminal (refuse off
    one), then delete."""
    runs = _split(args.run)
    if not runs and not args.where and not args.steps_where:
        raise InputError("give --run RUN, --where CONDITION (a condition over episodes) and/or --steps-where "
                         "CONDITION (a condition over steps); refusing to delete everything by default")
    store = _open(args.store)
    if not args.yes:
        plan = store.maintain.delete(run_id=runs, where=args.where, steps_where=args.steps_where, dry_run=True)
        print(plan.format())
        if not plan.episodes:
            return 0
        if not sys.stdin.isatty():
            raise InputError("not on a terminal and no --yes given; nothing was deleted")
        if input("delete them? [y/N] ").strip().lower() not in ("y", "yes"):
            print("nothing was deleted")
            return 0
    print(store.maintain.delete(run_id=runs, where=args.where, steps_where=args.steps_where).format())
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    from trajstore.storage.encoding import described

    store = _open(args.store)
    if args.sql:
        print(store.maintain.decoding_sql(dialect=args.dialect), end="")
        return 0
    for column in store.maintain.stored_columns():
        print(f"{column['name']}  {column['type']}")
        declared = column["declared"]
        if declared:
            print(f"    holds {declared['field']}" + "".join(f"; {line}" for line in described(declared)))
    return 0


def cmd_history(args: argparse.Namespace) -> int:
    store = _open(args.store)
    _emit(args, store.history(limit=args.limit), keys=("version",))
    kept = store.maintain.log_retention()
    if kept.oldest:
        print(f"trajstore: the log starts at version {kept.oldest}: it keeps {text(kept.log_s)} of entries, and "
              "older versions can no longer be read (trajstore retention)", file=sys.stderr)
    return 0


def cmd_retention(args: argparse.Namespace) -> int:
    store = _open(args.store)
    if args.log is None:
        if args.checkpoint_interval is not None:
            raise InputError("--checkpoint-interval: give it with --log DURATION (the retention it goes with)")
        print(store.maintain.log_retention().format())
    else:
        print(store.maintain.log_retention(args.log, checkpoint_interval=args.checkpoint_interval).format())
    return 0


def cmd_vacuum(args: argparse.Namespace) -> int:
    print(_open(args.store).maintain.vacuum(older_than=args.older_than, dry_run=args.dry_run).format())
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    store = _open(args.store, version=args.at_version)
    runs = _split(args.run) or None
    progress = _progress(args)
    if args.format == "minari":
        from trajstore.export.minari import export_minari

        result = export_minari(store, args.name, run_id=runs, where=args.where, progress=progress,
                               include_unfinished=args.include_unfinished, agent=args.agent)
    else:
        from trajstore.export.lerobot import export_lerobot

        result = export_lerobot(store, args.name, run_id=runs, where=args.where, fps=args.fps, progress=progress,
                                include_unfinished=args.include_unfinished, agent=args.agent)
    print(result.format())
    return 0
