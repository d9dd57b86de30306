"""The ``trajstore`` command line: every subcommand and its options (the commands are in
:mod:`trajstore.cli.commands`).

Every command has a description and every option a help text (``tests/cli/test_parser.py`` walks the tree);
durations are one format everywhere (``7d``, ``12h``, ``30m``, ``90s``); each subparser records which flag sets
each Python argument (``flags``), so that an error naming ``run_id`` names ``--run`` here."""

from __future__ import annotations

import argparse
import re
from typing import Any, Callable, NoReturn

from trajstore.__about__ import __version__
from trajstore.cli import commands

# Python argument names of the library whose flag has another name (the rest: --name-with-dashes).
ALIASES = {"run_id": "run", "env_id": "env", "version": "at_version", "older_than_s": "older_than",
           "target_bytes": "target_mb", "dataset_id": "name", "folder": "name", "log_retention": "log"}


class Parser(argparse.ArgumentParser):
    """An argument parser whose every error is one line naming the flag (``trajstore: error: --port: …``), no
    usage dump (``--help`` has it); its subcommands' parsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        message = re.sub(r"^argument ([^:]+?)(/-\S+)?: ", r"\1: ", message)
        self.exit(2, f"trajstore: error: {message}\n")


class _Help(argparse.HelpFormatter):
    """The root help, its column past the longest command's name (argparse measures the names without their indent,
    so a command of nine letters had its summary pushed to the next line)."""

    def add_argument(self, action: argparse.Action) -> None:
        super().add_argument(action)
        for sub in getattr(action, "_get_subactions", list)():
            self._action_max_length = max(self._action_max_length,
                                          len(sub.metavar or sub.dest) + self._current_indent + self._indent_increment)


def whole(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: a whole number from ``low`` (to ``high``)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low or (high is not None and value > high):
            wanted = f">= {low}" if high is None else f"from {low} to {high}"
            raise argparse.ArgumentTypeError(f"must be a whole number {wanted}, got {text}")
        return value
    return parse


def positive(text: str) -> float:
    """An argparse type: a finite number above 0."""
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number above 0, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    from trajstore.settings import Settings

    settings = Settings.from_env()
    parser = Parser(
        prog="trajstore", formatter_class=_Help,
        description="Store RL trajectories and query them: rollouts into a store, statistics, "
                    "SQL, a REST service and dashboard, and the store's lifecycle.",
        epilog="Exit status: 0 done, 1 `check` found problems, 2 an error (said in one line on stderr), "
               "130 interrupted (but `serve`, which Ctrl-C stops: 0). TRAJSTORE_DEBUG=1 shows a traceback.")
    parser.add_argument("--version", action="version", version=f"trajstore {__version__}",
                        help="print which trajstore this is and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                help="what to do; `trajstore COMMAND --help` describes each one")
    store_opt: dict[str, Any] = {
        "default": settings.store,
        "help": f"the store: a directory or s3://bucket/prefix (default: $TRAJSTORE_STORE or {settings.store})"}

    def command(name: str, summary: str, details: str = "") -> argparse.ArgumentParser:
        # the summary is the root help's line for the command, which argparse %-formats ("95%" must stay text)
        return sub.add_parser(name, help=summary.replace("%", "%%"), description=summary[0].upper() + summary[1:] +
                              "." + (f" {details}" if details else ""))

    p = command("rollout", "run a policy in an environment and store every transition",
                "A gymnasium vector env (--backend gym) or a pure-JAX env under lax.scan + vmap (--backend jax); "
                "random actions, or --policy. Every row stores mode (train, or eval with --mode eval) and the "
                "--seed given (env i of a gym vector env starts from seed + i; env_index tells the envs apart). "
                "A --run the store already holds is refused unless --append. Ctrl-C stops it: what it stepped is "
                "kept, and it says how much and the commands that go on (--append) or remove it. With --url, the "
                "episodes go to a trajstore service instead (a remote worker).")
    p.add_argument("--backend", choices=["gym", "jax"], default="gym",
                   help="gym: a gymnasium vector env; jax: a pure-JAX env under lax.scan + vmap (default: gym)")
    p.add_argument("--env", required=True, help="environment id, e.g. CartPole-v1 or ALE/Breakout-v5 (gym; Atari "
                                                "needs the atari extra) or cartpole (jax)")
    p.add_argument("--policy", metavar="SPEC",
                   help="module:function, called with the (num-envs, ...) observations of the vector env and "
                        "returning their actions (--backend jax: jax_rollout's policy(params, obs, key), params "
                        "None), imported from the current directory too; or sb3:ALGO:path.zip, a "
                        "Stable-Baselines3 checkpoint (ALGO one of A2C, DDPG, DQN, PPO, SAC, TD3; extra sb3; "
                        "deterministic with --mode eval), which is a pickle: loading it runs any code its author "
                        "put in it, so load only checkpoints from sources you trust (a warning says so on stderr). "
                        "Default: random actions")
    p.add_argument("--mode", choices=["train", "eval"], default="train",
                   help="eval: exactly --episodes complete episodes, unbiased (each env plays a share fixed up "
                        "front, so short episodes are not over-represented), stored with mode eval (default: train)")
    p.add_argument("--append", action="store_true",
                   help="add to a --run the store already holds (without it, such a run is refused)")
    p.add_argument("--num-envs", type=whole(1), default=8, help="environments stepped together (default: %(default)s)")
    p.add_argument("--episodes", type=whole(1), help="stop after at least this many complete episodes (--mode "
                                                     "eval: exactly this many)")
    p.add_argument("--steps", type=whole(1), help="stop after at least this many stored steps")
    p.add_argument("--store", **store_opt)
    p.add_argument("--url", help="send the episodes to the trajstore service at this URL instead of a store "
                                 "(a remote worker)")
    p.add_argument("--api-key", default=settings.api_key,
                   help="with --url: the service's API key (default: $TRAJSTORE_API_KEY)")
    p.add_argument("--run", required=True, help="run_id to store the episodes under")
    p.add_argument("--seed", type=int, default=0, help="seed of the environments and the policy (default: 0)")
    p.add_argument("--autoreset", choices=["next-step", "same-step", "disabled"], default="next-step",
                   help="gymnasium vector-env autoreset mode (default: next-step, gymnasium's default)")
    p.add_argument("--rollout-length", type=whole(1), default=128,
                   help="jax: steps per lax.scan, each scan one (T, B) batch (default: 128)")
    p.add_argument("--frame-stack", type=whole(1), metavar="K",
                   help="gym: stack each env's last K observations (gymnasium's FrameStackObservation); each "
                        "frame is stored once")
    p.add_argument("--atari", action="store_true",
                   help="gym, an ALE/... game as DQN sees it: made with frameskip=1, then AtariPreprocessing "
                        "(frame skip 4, 84x84 gray) and a stack of the last 4 frames (or --frame-stack K), each "
                        "frame stored once: obs (4, 84, 84) uint8")
    p.add_argument("--policy-version", type=int, help="stored in the policy_version column")
    p.add_argument("--info-key", action="append", metavar="KEY",
                   help="store this key of each step's info as a step column, null where a step lacks it "
                        "(repeatable or comma-separated), e.g. --info-key is_success")
    _run_description_options(p)
    _progress_option(p)
    p.set_defaults(func=commands.cmd_rollout)

    p = command("runs", "every run with its episode and step counts, config, tags and notes",
                "One row per run and environment; config as JSON. Change a run's description with "
                "trajstore describe.")
    p.add_argument("--store", **store_opt)
    _version_option(p, "read the store as it was at version N (see trajstore history)")
    _output_options(p)
    p.set_defaults(func=commands.cmd_runs)

    p = command("describe", "change what describes a run: its config, tags, notes",
                "Each option given replaces the stored one (--config values are merged into --config-file's); "
                "one commit, earlier versions keep the old description.")
    p.add_argument("run", help="the run_id")
    p.add_argument("--store", **store_opt)
    _run_description_options(p)
    p.set_defaults(func=commands.cmd_describe)

    p = command("import", "store every episode of an existing dataset (Minari)",
                "The dataset is read from Minari's local datasets ($MINARI_DATASETS_PATH, default "
                "~/.minari/datasets).")
    p.add_argument("source", choices=["minari"], help="the dataset format")
    p.add_argument("dataset", help="a local Minari dataset id, e.g. cartpole/random-v0 ($MINARI_DATASETS_PATH)")
    p.add_argument("--store", **store_opt)
    p.add_argument("--run", help="run_id to store the episodes under (default: the dataset id, / as -)")
    p.add_argument("--env", help="env_id (default: the environment the dataset was collected in)")
    _progress_option(p)
    p.set_defaults(func=commands.cmd_import)

    p = command("stats", "episode statistics (n_traj, return_*, len_*), optionally grouped",
                "Complete episodes only unless --include-incomplete; one row, or one per group of --by.")
    p.add_argument("--store", **store_opt)
    p.add_argument("--by", action="append", default=[], help="group by this column (repeat or comma-separate)")
    p.add_argument("--gamma", type=float, help="also discounted_return_* for this discount factor")
    p.add_argument("--metric", help="also metric_n, metric_{min,mean,std,max} of this: a column of episodes or "
                                    "agg(column) of a step column, agg one of last, first, sum, mean, min, max "
                                    "(--metric 'last(is_success)': metric_mean is the success rate)")
    _filter_options(p)
    p.add_argument("--include-incomplete", action="store_true", help="also count unfinished episodes")
    _version_option(p, "read the store as it was at version N (see trajstore history)")
    _output_options(p)
    p.set_defaults(func=commands.cmd_stats)

    p = command("compare", "which group of runs is better, and how sure: IQM, median, mean with 95% intervals",
                "rliable's statistics (Agarwal et al., 2021) over each group's runs x tasks scores, a run's score on "
                "a task being the mean --metric of its --last complete episodes there; stratified bootstrap "
                "confidence intervals. Groups by --by (a column of episodes, or config.<key> of each run's "
                "config).")
    p.add_argument("--store", **store_opt)
    p.add_argument("--by", action="append", required=True,
                   help="what the groups differ in: config.algo, a column (repeat or comma-separate)")
    p.add_argument("--metric", default="episode_return",
                   help="a column of episodes, or agg(step column) with agg in last, first, sum, mean, min, max, "
                        "e.g. last(is_success) (default: %(default)s)")
    p.add_argument("--task", default="env_id", help="the column that names a task (default: %(default)s)")
    p.add_argument("--last", type=whole(1), default=100,
                   help="a run's score: the mean metric of its last N complete episodes per task (default: 100)")
    p.add_argument("--mode", choices=["train", "eval"], help="only episodes of this mode")
    p.add_argument("--normalize", action="append", metavar="TASK=LOW:HIGH",
                   help="map TASK's scores to (x - LOW) / (HIGH - LOW) (repeat for every task); adds the "
                        "optimality gap")
    p.add_argument("--statistic", action="append", choices=["iqm", "median", "mean", "optimality_gap"],
                   help="the statistics to show (repeat; default: all)")
    p.add_argument("--ci", type=float, default=0.95, help="the intervals' confidence (default: %(default)s)")
    p.add_argument("--reps", type=whole(1), default=2000, help="bootstrap replications (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="the bootstrap's seed (default: 0)")
    p.add_argument("--run", action="append", help="only this run_id (repeatable, or comma-separated)")
    p.add_argument("--where", help="an SQL condition over the episodes view")
    _version_option(p, "read the store as it was at version N (see trajstore history)")
    _output_options(p)
    p.set_defaults(func=commands.cmd_compare)

    p = command("episodes", "one row per episode, filtered, sorted and paged")
    p.add_argument("--store", **store_opt)
    _filter_options(p)
    done = p.add_mutually_exclusive_group()
    done.add_argument("--complete", dest="complete", action="store_const", const=True, default=None,
                      help="only complete episodes (ended by terminated or truncated)")
    done.add_argument("--incomplete", dest="complete", action="store_const", const=False,
                      help="only unfinished episodes")
    p.add_argument("--gamma", type=float, help="add discounted_return for this discount factor")
    p.add_argument("--order-by", default="episode_id", help="column to sort by, prefixed with - for descending "
                                                            "(default: %(default)s)")
    p.add_argument("--limit", type=whole(0), default=100, help="at most this many rows (default: %(default)s)")
    p.add_argument("--offset", type=whole(0), default=0, help="skip this many rows first (default: 0)")
    _version_option(p, "read the store as it was at version N (see trajstore history)")
    _output_options(p)
    p.set_defaults(func=commands.cmd_episodes)

    p = command("sql", "run one read-only SELECT over the steps, episodes and runs views (sandboxed)",
                "It runs in the same sandbox as the service's POST /sql: a single SELECT, no file access (only "
                "the three views), nothing written, in a worker process of at most TRAJSTORE_SQL_WORKER_BYTES of "
                "memory. Every row is printed unless --limit is given. --unsafe lifts "
                "the sandbox for your own queries: any statement (COPY ... TO, CREATE), any file this user may "
                "read or write.")
    p.add_argument("query", help='e.g. "SELECT run_id, count(*) FROM steps GROUP BY run_id"')
    p.add_argument("--store", **store_opt)
    p.add_argument("--limit", type=whole(0), help="print at most this many rows (default: all); says so on stderr "
                                             "when the query returned more")
    p.add_argument("--unsafe", action="store_true",
                   help="no sandbox: run any SQL with this user's file access (read_csv of any file, COPY ... TO, "
                        "CREATE); only for queries you wrote yourself")
    p.add_argument("--run", action="append", help="the views hold only this run_id's steps (repeatable)")
    p.add_argument("--env", action="append",
                   help="the views hold only this env_id's steps (repeatable): every column in its own type "
                        "(over environments whose columns differ in type, such a column is a VARIANT)")
    _version_option(p, "read the store as it was at version N (see trajstore history)")
    _output_options(p)
    p.set_defaults(func=commands.cmd_sql)

    p = command("serve", "serve the REST API and dashboard over a store (uvicorn)",
                "OpenAPI at /openapi.json, the dashboard at /dashboard. Ctrl-C stops it (exit status 0).")
    p.add_argument("--store", **store_opt)
    p.add_argument("--host", help="address to listen on (default: $TRAJSTORE_HOST or 127.0.0.1)")
    p.add_argument("--port", type=whole(1, 65535), help="port (default: $TRAJSTORE_PORT or 8321)")
    p.add_argument("--api-key", help="enable authenticated ingest with this key (default: $TRAJSTORE_API_KEY)")
    p.add_argument("--create", action="store_true", help="make an empty store at --store if there is none")
    p.add_argument("--commit-interval", type=duration, metavar="DURATION",
                   help="commit ingest requests in groups, at most one commit per DURATION, e.g. 500ms (default: "
                        "$TRAJSTORE_COMMIT_INTERVAL or 250ms)")
    p.set_defaults(func=commands.cmd_serve)

    p = command("compact", "rewrite partitions of many small files as a few large ones",
                "One commit per partition; readers that started before it keep their files until they are "
                "removed (check --remove-orphans, vacuum).")
    p.add_argument("--store", **store_opt)
    p.add_argument("--run", action="append", default=[], help="only this run (repeatable, or comma-separated)")
    p.add_argument("--env", action="append", default=[], help="only this env (repeatable, or comma-separated)")
    p.add_argument("--target-mb", type=positive, default=128.0, help="size of the new files in MiB "
                                                                  "(default: %(default)s)")
    _progress_option(p)
    p.set_defaults(func=commands.cmd_compact)

    p = command("check", "verify committed files and episodes; exit 1 if anything is wrong",
                "Every committed file is read; episodes must be contiguous and their ids unique.")
    p.add_argument("--store", **store_opt)
    p.add_argument("--remove-orphans", action="store_true",
                   help="then delete the files no commit lists (left by killed writers) that are old enough")
    p.add_argument("--older-than", type=duration, default="1h", metavar="DURATION",
                   help="with --remove-orphans: only files last modified this long ago, e.g. 30m, 12h, 7d "
                        "(default: %(default)s)")
    p.set_defaults(func=commands.cmd_check)

    p = command("delete", "delete whole episodes (a run, or those a condition selects) in one commit",
                "Says what it would delete and asks first on a terminal (off one, it needs --yes). Older "
                "versions keep reading the deleted episodes until a vacuum removes their files.")
    p.add_argument("--store", **store_opt)
    p.add_argument("--run", action="append", default=[], help="delete this run (repeatable, or comma-separated)")
    p.add_argument("--where", help="delete the episodes this SQL condition over the episodes view selects, e.g. "
                                   "\"episode_return < 0\" (as --where of every other command)")
    p.add_argument("--steps-where", help="delete the episodes whose every step this SQL condition over the steps "
                                         "view selects, e.g. \"policy_version < 3\"; refused if it selects part of "
                                         "an episode")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation (needed when not on a "
                                                              "terminal)")
    p.set_defaults(func=commands.cmd_delete)

    p = command("schema", "the table's stored columns and what each holds, or the SQL that decodes them",
                "Each column another engine sees, its Delta type and, where it is not simply its field's values, "
                "what it holds (declared in the Delta schema's field metadata). With --sql: SQL that another "
                "DuckDB (or, with --dialect spark, Spark SQL) runs unchanged to read the steps as trajstore does, "
                "over a relation stored_steps you define (e.g. CREATE VIEW stored_steps AS SELECT * FROM "
                "delta_scan('STORE/steps'); in Spark, the Delta table or its committed files read with "
                "basePath STORE/steps, as a temporary view).")
    p.add_argument("--store", **store_opt)
    p.add_argument("--sql", action="store_true", help="print the SQL that decodes the stored columns")
    p.add_argument("--dialect", choices=["duckdb", "spark"], default="duckdb",
                   help="the SQL dialect of --sql (default: duckdb)")
    p.set_defaults(func=commands.cmd_schema)

    p = command("history", "the store's versions: each commit, its rows added/removed and runs")
    p.add_argument("--store", **store_opt)
    p.add_argument("--limit", type=whole(1), help="only the last N versions")
    _output_options(p)
    p.set_defaults(func=commands.cmd_history)

    p = command("retention", "show or set how long the store's log keeps each version",
                "The Delta table properties delta.logRetentionDuration and delta.checkpointInterval of every table "
                "of the store (other engines honour them too): each checkpoint lets the log entries older than the "
                "retention go, and a version older than that can no longer be read. Without --log, shows them.")
    p.add_argument("--store", **store_opt)
    p.add_argument("--log", type=duration, metavar="DURATION",
                   help="keep each version's log entries this long, e.g. 7d, 12h, 1h (at least 1m)")
    p.add_argument("--checkpoint-interval", type=whole(1), metavar="N",
                   help="with --log: a checkpoint every N versions (default: as the table says)")
    p.set_defaults(func=commands.cmd_retention)

    p = command("vacuum", "delete files no version of the retention period needs (deleted, compacted)",
                "Every version committed within --older-than keeps all its files; so do files a writer may be "
                "about to commit.")
    p.add_argument("--store", **store_opt)
    p.add_argument("--older-than", type=duration, default="7d", metavar="DURATION",
                   help="retention period: keep every version committed within it, e.g. 7d, 12h, 30m "
                        "(default: %(default)s)")
    p.add_argument("--dry-run", action="store_true", help="list the files, delete nothing")
    p.set_defaults(func=commands.cmd_vacuum)

    p = command("export", "write a run's episodes as a dataset of another format")
    p.add_argument("format", choices=["minari", "lerobot"],
                   help="minari: a Minari dataset ($MINARI_DATASETS_PATH); lerobot: a LeRobot v3.0 dataset "
                        "(meta/, data/chunk-*/file-*.parquet) in a new folder")
    p.add_argument("name", help="minari: the dataset id, (namespace/)name-vN (e.g. cartpole/trajstore-v0); "
                                "lerobot: the folder (new or empty)")
    p.add_argument("--store", **store_opt)
    p.add_argument("--run", action="append", default=[], help="only this run (repeatable, or comma-separated)")
    p.add_argument("--where", help="only the episodes this condition over the episodes view selects")
    p.add_argument("--include-unfinished", action="store_true",
                   help="export unfinished episodes too (a worker stopped mid-episode); by default only complete ones")
    p.add_argument("--agent", metavar="AGENT_ID", help="multi-agent runs: export this agent's own trajectory of each "
                                                       "episode (complete when its last row ended it)")
    _version_option(p, "export the store as of version N")
    p.add_argument("--fps", type=whole(1), default=30, help="lerobot: frames per second of the steps (timestamps are "
                                                       "frame_index / fps; default: %(default)s)")
    _progress_option(p)
    p.set_defaults(func=commands.cmd_export)

    for p in sub.choices.values():
        p.set_defaults(flags=_flags(p))
    return parser


def duration(text: str) -> float:
    """Seconds of a duration flag (``7d``, ``12h``, ``30m``, ``90s``; :mod:`trajstore.durations`): one grammar in
    every command, setting and option."""
    from trajstore.durations import EXAMPLES, seconds
    from trajstore.errors import InputError

    try:
        return seconds(text)
    except InputError:
        raise argparse.ArgumentTypeError(f"expected a duration such as {EXAMPLES}, got {text!r}") from None


def _flags(p: argparse.ArgumentParser) -> dict[str, str]:
    """Which flag of ``p`` sets each name: its ``dest``, and the library's argument name for it."""
    actions = p._actions
    found = {a.dest: next(o for o in a.option_strings if o.startswith("--"))
             for a in actions if any(o.startswith("--") for o in a.option_strings)}
    found.update({a.dest: str(a.metavar or a.dest) for a in actions  # positionals by their name in the usage
                  if not a.option_strings and a.dest not in ("help", "command", "func")})
    found.update({python: found[dest] for python, dest in ALIASES.items() if dest in found})
    return found


def _filter_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run", action="append", help="only this run_id (repeatable, or comma-separated)")
    p.add_argument("--env", action="append", help="only this env_id (repeatable, or comma-separated)")
    p.add_argument("--where", help="an SQL condition over the episodes view, e.g. \"episode_return > 100\"")


def _run_description_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", action="append", metavar="KEY=VALUE",
                   help="a config value of the run (repeatable; VALUE read as JSON where it is, else as text; "
                        "KEY a.b nests), e.g. --config algo=ppo --config lr=3e-4")
    p.add_argument("--config-file", metavar="PATH", help="the run's config from a JSON or YAML file")
    p.add_argument("--tag", action="append", help="a tag of the run (repeatable)")
    p.add_argument("--notes", help="notes on the run")


def _output_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", choices=["table", "csv", "json", "parquet"], default="table",
                   help="table (aligned columns), csv, json (one object per line) or parquet (needs --output); "
                        "default: table")
    p.add_argument("--output", "-o", help="write to this file instead of standard output")
    p.add_argument("--columns", action="append", metavar="NAME,...",
                   help="only these columns, in this order, in any --format (repeatable or comma-separated)")
    p.add_argument("--wide", action="store_true",
                   help="table: every column, on lines as long as they need (by default a table fits the "
                        "terminal, $COLUMNS or else 100 characters wide, its columns wrapped into blocks that fit)")


def _progress_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (there is one only when standard error is a terminal)")


def _version_option(p: argparse.ArgumentParser, text: str) -> None:
    p.add_argument("--version", dest="at_version", type=whole(0), metavar="N", help=text)
