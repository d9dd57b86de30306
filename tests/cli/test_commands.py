"""The ``trajstore`` command, as a user runs it: rollout, stats, episodes, sql in every format, check, errors."""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import trajstore
from tests.helpers import INSIDE_ESCAPES, PATH_REVEALING, fingerprint, write_planted_store
from trajstore.cli import main


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "store"
    code = main(["rollout", "--backend", "gym", "--env", "CartPole-v1", "--num-envs", "4", "--episodes", "50",
                 "--store", str(path), "--run", "demo", "--seed", "0", "--no-progress"])
    assert code == 0
    return path


@pytest.fixture
def own_demo(demo: Path, tmp_path: Path) -> Path:
    """A copy of ``demo``, for a test that adds a run to it (the module's store stays as made)."""
    return Path(shutil.copytree(demo, tmp_path / "store"))


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_rollout_stores_what_it_reports(own_demo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    demo = own_demo
    store = trajstore.open(demo)
    n_traj = store.stats().column("n_traj")[0].as_py()
    assert n_traj >= 50
    code, out, _ = run(capsys, "rollout", "--env", "CartPole-v1", "--steps", "300", "--store", str(demo),
                       "--run", "more", "--no-progress")
    assert code == 0 and "stored 30" in out and "'more'" in out
    assert store.sql("SELECT count(*) n FROM steps WHERE run_id = 'more'").column("n")[0].as_py() >= 300


def test_stats_json_matches_python(demo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "stats", "--store", str(demo), "--by", "run_id", "--gamma", "0.99",
                       "--run", "demo", "--format", "json")
    assert code == 0
    (row,) = [json.loads(line) for line in out.splitlines()]
    expected = trajstore.open(demo).stats(by="run_id", gamma=0.99, run_id="demo").to_pylist()[0]
    assert row.keys() == expected.keys()
    for key, value in expected.items():
        assert row[key] == (pytest.approx(value) if isinstance(value, float) else value)


def test_stats_table_is_readable(demo: Path, capsys: pytest.CaptureFixture[str],
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)  # the default width (pytest-xdist's workers set 80)
    code, out, _ = run(capsys, "stats", "--store", str(demo), "--run", "demo")
    header, rule, row, footer = out.splitlines()
    assert header.split()[:3] == ["n_traj", "return_min", "return_mean"]
    assert set(rule) <= {"-", " "} and footer == "(1 row)"
    assert int(row.split()[0]) == trajstore.open(demo).stats(run_id="demo").column("n_traj")[0].as_py()


def test_episodes_order_and_limit(demo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "episodes", "--store", str(demo), "--run", "demo", "--complete",
                       "--order-by", "-episode_return", "--limit", "5", "--format", "csv")
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    returns = [float(r["episode_return"]) for r in rows]
    assert len(rows) == 5 and returns == sorted(returns, reverse=True)
    best = trajstore.open(demo).episodes(run_id="demo", complete=True).column("episode_return").to_numpy()
    assert returns[0] == best.max()


def test_sql_formats(demo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    query = "SELECT episode_id, step, obs, reward FROM steps WHERE run_id = 'demo' ORDER BY episode_id, step LIMIT 7"
    code, out, _ = run(capsys, "sql", "--store", str(demo), query, "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert code == 0 and len(rows) == 7 and len(json.loads(rows[0]["obs"])) == 4
    code, out, _ = run(capsys, "sql", "--store", str(demo), query, "--format", "json")
    assert [json.loads(line)["step"] for line in out.splitlines()] == [int(r["step"]) for r in rows]
    target = tmp_path / "out.parquet"
    code, out, _ = run(capsys, "sql", "--store", str(demo), query, "--format", "parquet", "-o", str(target))
    table = pq.read_table(target)
    assert code == 0 and table.num_rows == 7
    np.testing.assert_allclose(np.stack(table.column("obs").to_numpy(zero_copy_only=False))[0],
                               json.loads(rows[0]["obs"]), rtol=1e-6)


def test_check_passes_on_a_healthy_store(demo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "check", "--store", str(demo))
    assert code == 0, out


def test_rollout_stores_info_keys_and_stats_take_a_metric(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(tmp_path / "store")
    # one env: a gymnasium vector env types each info key by the first env's value of the step, so one env's
    # reset (prob 1, an int) would turn another's 1/3 into 0 in what the vector env reports
    assert main(["rollout", "--env", "FrozenLake-v1", "--num-envs", "1", "--steps", "300", "--store", path,
                 "--run", "lake", "--info-key", "prob", "--no-progress"]) == 0
    capsys.readouterr()
    probs = trajstore.open(path).sql("SELECT min(prob) AS lo, max(prob) AS hi, count(prob) AS n FROM steps")
    assert probs.to_pylist() == [{"lo": pytest.approx(1 / 3), "hi": pytest.approx(1 / 3), "n": 300}]  # every
    # move of the slippery lake (the reset's prob 1 is no step's)
    code, out, _ = run(capsys, "stats", "--store", path, "--metric", "mean(prob)", "--format", "json")
    assert code == 0 and json.loads(out)["metric_mean"] == pytest.approx(1 / 3)
    code, out, err = run(capsys, "stats", "--store", path, "--metric", "median(prob)")
    assert code != 0 and "metric: unknown aggregate 'median'" in out + err


def test_check_fails_on_a_corrupt_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "store"
    assert main(["rollout", "--env", "CartPole-v1", "--episodes", "5", "--store", str(path), "--run", "r",
                 "--no-progress"]) == 0
    capsys.readouterr()
    victim = trajstore.open(path).maintain.files()[0].path
    Path(victim).write_bytes(Path(victim).read_bytes()[:100])
    code, out, _ = run(capsys, "check", "--store", str(path))
    assert code == 1 and os.path.basename(victim) in out


# one wrong input (or more) of every command, each answered in one line that names what to change
MISTAKES = [
    (["stats", "--store", "{missing}"], "no trajstore store at"),
    (["sql", "--store", "{demo}", "SELECT * FROM nope"], "Table with name nope does not exist"),
    (["stats", "--store", "{demo}", "--gamma", "1.5"], r"error: --gamma must be in \[0, 1\], got 1.5"),
    (["stats", "--store", "{demo}", "--by", "colour"], "error: --by: unknown column"),
    (["episodes", "--store", "{demo}", "--order-by", "height"], r"--order-by: unknown column\(s\) \['height'\]"),
    (["sql", "--store", "{demo}", "SELECT 1", "--format", "parquet"], "give --output PATH"),
    (["rollout", "--env", "CartPole-v1", "--store", "{demo}", "--run", "x"], "give --episodes N or --steps N"),
    (["episodes", "--store", "{demo}", "--limit", "-1"], r"error: --limit: must be a whole number >= 0, got -1"),
    (["stats", "--store", "{demo}", "--where", "nope > 1"], r"error: --where: Binder Error: .*\"nope\" not found"),
    (["serve", "--store", "{missing}"], r"no trajstore store at .*nothing: check --store, or add --create to serve"),
    (["delete", "--store", "{demo}"], r"error: give --run RUN, --where CONDITION \(a condition over episodes\) "
                                      r"and/or --steps-where CONDITION \(a condition over steps\)"),
    (["delete", "--store", "{demo}", "--where", "step = 0", "--yes"],
     r"error: --where: .*\"step\".*--where is a condition over the episodes view \(for a condition over steps "
     r"give --steps-where\)"),
    (["serve", "--store", "{demo}", "--port", "99999"], r"error: --port: must be a whole number from 1 to 65535, "
                                                         "got 99999$"),
    (["rollout", "--env", "CartPole-v1", "--store", "{demo}", "--run", "x", "--episodes", "0"],
     r"error: --episodes: must be a whole number >= 1, got 0$"),
    (["rollout", "--env", "CartPole-v1", "--store", "{demo}", "--run", "x", "--num-envs", "two"],
     r"error: --num-envs: must be a whole number >= 1, got two$"),
    (["stats", "--store", "{demo}", "--env", "nope"], r"error: --env: no environment 'nope' in .*; its environments: "
                                                       "CartPole-v1"),
    (["sql", "--store", "{demo}", "--env", "nope", "SELECT 1"], r"error: --env: no environment 'nope'"),
    (["stats", "--store", "{demo}", "--output", "{missing}/x.csv", "--format", "csv"],
     r"error: --output: cannot write .*nothing/x.csv: no such file or directory$"),
    (["stats", "--store", "{demo}", "--output", "{missing}/x.parquet", "--format", "parquet"],
     r"error: --output: cannot write .*nothing/x.parquet: "),
    (["rollout", "--env", "CartPole-v1", "--run", "x", "--steps", "10", "--url", "http://127.0.0.1:9"],
     r"error: Connection failed: cannot reach http://127.0.0.1:9/.*; check the service's URL \(--url\) and that "
     "`trajstore serve` is running there$"),
    (["stats", "--store", "{demo}", "--bogus"], r"^trajstore: error: unrecognized arguments: --bogus$"),
    (["stats", "--store", "{demo}", "--version", "-1"], r"error: --version: must be a whole number >= 0, got -1$"),
    (["history", "--store", "{demo}", "--limit", "0"], r"error: --limit: must be a whole number >= 1, got 0$"),
    (["compare", "--store", "{demo}", "--by", "run_id", "--reps", "0"],
     r"error: --reps: must be a whole number >= 1, got 0$"),
    (["compare", "--store", "{demo}", "--by", "run_id", "--normalize", "CartPole-v1"],
     r"error: --normalize: expected TASK=LOW:HIGH, got 'CartPole-v1'$"),
    (["runs", "--store", "{missing}"], "no trajstore store at"),
    (["describe", "nosuchrun", "--store", "{demo}", "--tag", "x"], r"error: run: no run 'nosuchrun' in .*; its runs: "),
    (["describe", "demo", "--store", "{demo}", "--config", "lr"], r"error: --config: expected KEY=VALUE, got 'lr'$"),
    (["import", "minari", "nosuch/data-v0", "--store", "{demo}"], r"error: dataset: no local Minari dataset "
                                                                   "'nosuch/data-v0'"),
    (["import", "hdf5", "x", "--store", "{demo}"], r"error: source: invalid choice: 'hdf5' \(choose from 'minari'\)$"),
    (["compact", "--store", "{demo}", "--target-mb", "-1"], r"error: --target-mb: must be a number above 0, got -1$"),
    (["check", "--store", "{demo}", "--remove-orphans", "--older-than", "soon"],
     r"error: --older-than: expected a duration such as 7d, .*got 'soon'$"),
    (["schema", "--store", "{demo}", "--dialect", "oracle"], r"error: --dialect: invalid choice: 'oracle'"),
    (["vacuum", "--store", "{demo}", "--older-than", "5parsecs"], r"error: --older-than: expected a duration"),
    (["retention", "--store", "{demo}", "--log", "10s"], r"error: --log: must be at least 1m"),
    (["retention", "--store", "{demo}", "--checkpoint-interval", "5"], r"error: --checkpoint-interval: give it with"),
    (["export", "minari", "bad_name", "--store", "{demo}"], r"error: name: 'bad_name' is not a Minari dataset id"),
    (["export", "lerobot", "{tmp}/out", "--store", "{demo}", "--fps", "0"],
     r"error: --fps: must be a whole number >= 1, got 0$"),
    (["serve", "--store", "{demo}", "--host", "999.1.1.1", "--port", "8999"],
     r"error: cannot listen on 999.1.1.1:8999: .*\(check --host: an address or a name of this machine\)$"),
]


def test_every_command_has_its_mistakes_walked() -> None:
    from trajstore.cli.parser import build_parser

    (commands,) = [a.choices for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    assert set(commands) == {argv[0] for argv, _ in MISTAKES}


@pytest.mark.parametrize("argv, message", MISTAKES)
def test_errors_are_one_line(demo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                             argv: list[str], message: str) -> None:
    argv = [a.format(demo=demo, missing=tmp_path / "nothing", tmp=tmp_path) for a in argv]
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.startswith("trajstore: error: ") and err.count("\n") == 1
    assert re.search(message, err)


@pytest.mark.slow
def test_installed_command_prints_no_traceback(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "trajstore.cli", "stats", "--store", str(tmp_path / "none")],
                          capture_output=True, text=True, env={**os.environ, "TRAJSTORE_DEBUG": ""})
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and proc.stderr.startswith("trajstore: error: no trajstore store")


@pytest.mark.parametrize("argv", [
    ["stats"], ["episodes"], ["compact", "--no-progress"], ["delete", "--yes"], ["export", "minari", "xx/y-v0"],
    ["export", "lerobot", "{tmp}/out"]])
def test_a_run_the_store_lacks_is_one_error_and_one_exit_code(demo: Path, tmp_path: Path, argv: list[str],
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    argv = [a.format(tmp=tmp_path) for a in argv]
    code, out, err = run(capsys, *argv, "--store", str(demo), "--run", "demo", "--run", "nosuchrun")
    assert code == 2 and out == ""
    assert err.startswith(f"trajstore: error: --run: no run 'nosuchrun' in {demo}; its runs: demo")
    assert err.count("\n") == 1
    with pytest.raises(trajstore.RunNotFoundError) as raised:  # the same message as Python's, flag for argument
        trajstore.open(demo).stats(run_id=["demo", "nosuchrun"])
    assert err.removeprefix("trajstore: error: --run") == str(raised.value).removeprefix("run_id") + "\n"


def test_the_version_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out == f"trajstore {trajstore.__version__}\n"


@pytest.mark.server
def test_serve_on_a_busy_port_is_one_error_line_and_no_banner(demo: Path) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "trajstore.cli", "serve", "--store", str(demo), "--port",
                               str(port)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith(f"trajstore: error: cannot listen on 127.0.0.1:{port}: ")
    assert "in use" in proc.stderr and proc.stderr.count("\n") == 1


@pytest.mark.server
def test_serve_creates_a_store_only_when_asked(tmp_path: Path) -> None:
    import signal
    import time

    import httpx

    from tests.api.helpers import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "trajstore.cli", "serve", "--store", str(tmp_path / "new"),
                             "--create", "--port", str(port)], stdout=subprocess.PIPE, text=True)
    try:
        assert "serving" in (proc.stdout.readline() if proc.stdout else "")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                assert httpx.get(f"http://127.0.0.1:{port}/ready").json()["files"] == 0
                break
            except httpx.TransportError:
                time.sleep(0.1)
        assert (tmp_path / "new" / "trajstore.json").is_file()
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)


@pytest.mark.server
def test_ctrl_c_stops_the_server_with_exit_status_0(demo: Path) -> None:
    """Ctrl-C is how a server is stopped: `make demo`, whose last step serves, then ends without `Error 130`."""
    import signal

    import httpx

    from tests.api.helpers import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "trajstore.cli", "serve", "--store", str(demo), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert "serving" in (proc.stdout.readline() if proc.stdout else "")  # bound; listening once uvicorn runs
        with httpx.Client(transport=httpx.HTTPTransport(retries=8)) as client:  # connects retried with back-off
            assert client.get(f"http://127.0.0.1:{port}/health", timeout=30).status_code == 200
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0 and err.rstrip().endswith("trajstore: stopped serving (Ctrl-C)"), err


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small store with a Parquet file under ``steps/`` that no commit lists."""
    return write_planted_store(tmp_path_factory.mktemp("cli-sql") / "store")


OUTSIDE = ["SELECT * FROM read_csv('/etc/passwd')", "SELECT * FROM read_text('/etc/hostname')",
           "SELECT * FROM glob('/etc/*')"]
REFUSED = [("COPY (SELECT * FROM steps) TO '{root}/steps/stolen.csv'", "only SELECT statements are allowed, got COPY"),
           ("COPY (SELECT 1) TO '{tmp}/escape.csv'", "only SELECT statements are allowed, got COPY"),
           ("DROP VIEW steps", "only SELECT statements are allowed, got DROP"),
           ("CREATE TABLE t AS SELECT 1", "only SELECT statements are allowed, got CREATE"),
           ("SELECT 1; SELECT 2", "exactly one SELECT statement"),
           *[(q, "outside the store") for q in OUTSIDE + INSIDE_ESCAPES]]


@pytest.mark.parametrize("query, message", REFUSED)
def test_sql_is_sandboxed(planted: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], query: str,
                          message: str) -> None:
    before = fingerprint(planted)
    code, out, err = run(capsys, "sql", "--store", str(planted), query.format(root=planted, tmp=tmp_path))
    assert code == 2 and out == "" and message in err and err.count("\n") == 1
    assert fingerprint(planted) == before and not (tmp_path / "escape.csv").exists()


@pytest.mark.parametrize("query", PATH_REVEALING)
def test_sql_settings_and_views_name_no_path_of_the_store(planted: Path, capsys: pytest.CaptureFixture[str],
                                                          query: str) -> None:
    code, out, _ = run(capsys, "sql", "--store", str(planted), query, "--format", "json")
    assert code == 0 and out and str(planted) not in out and str(planted.resolve()) not in out


def test_sql_prints_every_row_unless_limited_and_says_when_it_cut(planted: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    n = trajstore.open(planted).sql("SELECT count(*) AS n FROM steps")["n"][0].as_py()
    code, out, err = run(capsys, "sql", "--store", str(planted), "SELECT step FROM steps", "--format", "csv")
    assert code == 0 and len(out.splitlines()) == n + 1 and err == ""
    code, out, err = run(capsys, "sql", "--store", str(planted), "SELECT step FROM steps", "--format", "csv",
                         "--limit", "7")
    assert code == 0 and len(out.splitlines()) == 8
    assert err == "trajstore: showing the first 7 rows; the query returned more (raise --limit)\n"
    code, out, err = run(capsys, "sql", "--store", str(planted), "SELECT 1 AS x", "--limit", "7")
    assert code == 0 and err == ""


def test_sql_unsafe_lifts_the_sandbox(planted: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "episodes.csv"
    code, _, err = run(capsys, "sql", "--store", str(planted), "--unsafe",
                       f"COPY (SELECT episode_id FROM episodes) TO '{target}'")
    assert code == 0 and target.read_text().startswith("episode_id"), err
    code, out, err = run(capsys, "sql", "--store", str(planted), "--unsafe", "--format", "csv", "--limit", "2",
                         f"SELECT * FROM read_csv('{target}')")
    assert code == 0 and len(out.splitlines()) == 3 and "showing the first 2 rows" in err


def test_sql_help_describes_the_sandbox_and_the_opt_out(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["sql", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "same sandbox as the service's POST /sql" in out and "--unsafe" in out and "--limit" in out


def test_sql_takes_the_environments_and_runs_its_views_hold(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Over environments whose actions differ in kind, action is a VARIANT; --env gives it its own type."""
    store = trajstore.open(tmp_path / "mixed", create=True)
    rng = np.random.default_rng(0)
    from tests.helpers import make_batch

    box = make_batch(rng, 6, 2)
    box["action"] = rng.normal(size=(6, 2, 1)).astype(np.float32)
    for env, batch in (("Int-v0", make_batch(rng, 6, 2)), ("Box-v0", box)):
        with store.writer(run_id=env.lower(), env_id=env) as w:
            w.add_batch(batch)
    query = "SELECT DISTINCT typeof(action) AS t FROM steps"
    code, out, _ = run(capsys, "sql", "--store", str(tmp_path / "mixed"), query, "--format", "json")
    assert code == 0 and [json.loads(line)["t"] for line in out.splitlines()] == ["VARIANT"]
    for flags, kind in ((["--env", "Box-v0"], "FLOAT[]"), (["--run", "int-v0"], "BIGINT"),
                        (["--env", "Box-v0", "--unsafe"], "FLOAT[]")):
        code, out, _ = run(capsys, "sql", "--store", str(tmp_path / "mixed"), query, "--format", "json", *flags)
        assert code == 0 and [json.loads(line)["t"] for line in out.splitlines()] == [kind], flags


def test_rollout_frame_stack(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "stacked"
    code, out, _ = run(capsys, "rollout", "--env", "CartPole-v1", "--frame-stack", "4", "--steps", "200",
                       "--num-envs", "2", "--store", str(path), "--run", "fs", "--no-progress")
    assert code == 0 and "stored 20" in out
    store = trajstore.open(path)
    files = store.maintain.files()
    assert all(pq.ParquetFile(f.path).schema_arrow.metadata[b"trajstore"].find(b'"frame_stack":{"obs":4}') > 0
               for f in files)
    table = store.sql("SELECT episode_id, step, obs, next_obs FROM steps ORDER BY episode_id, step")
    assert table.schema.field("obs").type.value_type.value_type == pa.float32()
    rows = table.to_pydict()
    obs, nxt = np.array(rows["obs"]), np.array(rows["next_obs"])
    assert obs.shape == (len(obs), 4, 4) and len(obs) >= 200
    same = np.array(rows["episode_id"][1:]) == np.array(rows["episode_id"][:-1])
    np.testing.assert_array_equal(obs[1:][same][:, :-1], obs[:-1][same][:, 1:])  # stacks of the env's frames
    np.testing.assert_array_equal(nxt[:-1][same], obs[1:][same])
    code, _, err = run(capsys, "rollout", "--backend", "jax", "--env", "cartpole", "--frame-stack", "4",
                       "--steps", "10", "--store", str(path), "--run", "x")
    assert code == 2 and "--frame-stack" in err and "--backend gym" in err


def test_a_hint_names_flags_as_typed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A library message's ``run_id=…`` and ``where="…"`` become the flags a shell user types, apart from their
    values."""
    from trajstore.rollout import gym_rollout

    store = trajstore.open(tmp_path / "mixed", create=True)
    gym_rollout(store, "CartPole-v1", run_id="a", num_envs=1, steps=50, progress=False)
    gym_rollout(store, "Pendulum-v1", run_id="b", num_envs=1, steps=220, progress=False)  # one whole episode
    code, _, err = run(capsys, "export", "lerobot", str(tmp_path / "out"), "--store", str(tmp_path / "mixed"))
    assert code == 2 and err.count("\n") == 1
    assert "export one environment at a time (--run … or --where \"env_id = '…'\")" in err, err
