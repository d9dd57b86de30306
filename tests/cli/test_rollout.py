"""``trajstore rollout`` as a researcher uses it: a policy of their own (a module's function, an SB3 checkpoint),
an evaluation of exactly N episodes, Atari by name with DQN's preprocessing, and a run that is never added to by
accident; every mistake one line naming its flag."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

import trajstore
from trajstore.cli import interrupted, main
from trajstore.cli.parser import build_parser
from trajstore.storage.encoding import FileEncoding

GYM_POLICY = '''
import numpy as np

def lean(obs):
    return (obs[:, 2] > 0).astype(np.int64)
'''
JAX_POLICY = '''
import jax.numpy as jnp

def right(params, obs, key):
    return jnp.ones(obs.shape[0], jnp.int32)
'''


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def fails(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The one error line of a command that must fail (exit 2, nothing on stdout)."""
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == "" and err.startswith("trajstore: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``tmp_path`` as the working directory, holding the policy modules; ``sys.path`` restored afterwards."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".")])
    (tmp_path / "cli_gym_policy.py").write_text(GYM_POLICY)
    (tmp_path / "cli_jax_policy.py").write_text(JAX_POLICY)
    for name in ("cli_gym_policy", "cli_jax_policy"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return tmp_path


def test_the_help_lists_the_new_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["rollout", "--help"])
    out = capsys.readouterr().out
    for flag in ("--policy SPEC", "--mode {train,eval}", "--append", "--atari", "sb3:ALGO:path.zip"):
        assert flag in out


@pytest.mark.slow
def test_a_policy_of_the_current_directory(in_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "rollout", "--env", "CartPole-v1", "--num-envs", "2", "--episodes", "4", "--store",
                       "store", "--run", "lean", "--policy", "cli_gym_policy:lean", "--no-progress")
    assert code == 0 and "as run 'lean' (train)" in out
    rows = trajstore.open(in_tmp / "store").sql("SELECT obs, action FROM steps").to_pydict()
    np.testing.assert_array_equal(rows["action"], (np.array(rows["obs"])[:, 2] > 0).astype(int))
    code, _, _ = run(capsys, "rollout", "--backend", "jax", "--env", "cartpole", "--num-envs", "4", "--steps", "64",
                     "--rollout-length", "16", "--store", "store", "--run", "jax", "--policy", "cli_jax_policy:right",
                     "--no-progress")
    assert code == 0
    actions = trajstore.open(in_tmp / "store").sql("SELECT DISTINCT action FROM steps WHERE run_id = 'jax'")
    assert actions.column(0).to_pylist() == [1]


@pytest.mark.slow
def test_an_sb3_checkpoint_evaluated(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("stable_baselines3", reason="the [sb3] extra is not installed")
    from stable_baselines3 import PPO

    from tests.rollout.test_policies import sb3_checkpoint

    path = sb3_checkpoint(tmp_path)
    store = tmp_path / "store"
    code, out, _ = run(capsys, "rollout", "--env", "CartPole-v1", "--mode", "eval", "--episodes", "5", "--num-envs",
                       "2", "--policy", f"sb3:PPO:{path}", "--store", str(store), "--run", "ppo-eval", "--no-progress")
    assert code == 0 and "5 complete episodes" in out and "(eval)" in out
    rows = trajstore.open(store).sql("SELECT obs, action FROM steps ORDER BY episode_id, step").to_pydict()
    predicted, _ = PPO.load(path, device="cpu").predict(np.array(rows["obs"], np.float32), deterministic=True)
    np.testing.assert_array_equal(rows["action"], predicted)
    err = fails(capsys, "rollout", "--backend", "jax", "--env", "cartpole", "--steps", "10", "--policy",
                f"sb3:PPO:{path}", "--store", str(store), "--run", "x")
    assert "--policy: sb3:PPO:" in err and "use it with --backend gym" in err


@pytest.mark.parametrize("backend, env", [("gym", "CartPole-v1"), ("jax", "cartpole")])
def test_mode_eval_stores_exactly_n_complete_episodes(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      backend: str, env: str) -> None:
    code, out, _ = run(capsys, "rollout", "--backend", backend, "--env", env, "--mode", "eval", "--episodes", "7",
                       "--num-envs", "3", "--seed", "4", "--store", str(tmp_path), "--run", "ev", "--no-progress")
    assert code == 0 and "7 complete episodes" in out
    episodes = trajstore.open(tmp_path).episodes()
    assert episodes.num_rows == 7 and all(episodes["complete"].to_pylist())
    assert set(episodes["mode"].to_pylist()) == {"eval"} and set(episodes["seed"].to_pylist()) == {4}


def test_a_held_run_needs_append(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["rollout", "--env", "CartPole-v1", "--num-envs", "2", "--episodes", "3", "--store", str(tmp_path),
            "--run", "r", "--no-progress"]
    assert run(capsys, *args)[0] == 0
    store = trajstore.open(tmp_path)
    version, steps = store.version, store.sql("SELECT count(*) AS n FROM steps")["n"][0].as_py()
    err = fails(capsys, *args, "--seed", "1")
    assert re.search(rf"^trajstore: error: --run: run 'r' already holds steps in {re.escape(str(tmp_path))}; add to "
                     r"it with --append, or store these episodes under a new run id$", err)
    assert store.version == version
    code, out, _ = run(capsys, *args, "--seed", "1", "--append")
    assert code == 0 and trajstore.open(tmp_path).sql("SELECT count(*) AS n FROM steps")["n"][0].as_py() > steps
    err = fails(capsys, *args, "--mode", "eval", "--append")
    assert "run 'r' already holds training (or untagged) steps" in err


@pytest.mark.parametrize("argv, message", [
    (["--mode", "eval", "--steps", "10"], r"--mode eval runs exactly --episodes N complete episodes: give "
                                          r"--episodes N \(and no --steps\)$"),
    (["--mode", "eval", "--episodes", "3", "--steps", "10"], r"--mode eval runs exactly --episodes N"),
    (["--episodes", "3", "--policy", "nocolon"], r"error: --policy: expected module:function or sb3:ALGO:path.zip, "
                                                 r"got 'nocolon'$"),
    (["--episodes", "3", "--policy", "no_such_module_q:act"], r"error: --policy: cannot import module "
                                                             r"'no_such_module_q'"),
    (["--episodes", "3", "--policy", "sb3:XYZ:m.zip"], r"error: --policy: expected sb3:ALGO:path.zip"),
    (["--episodes", "3", "--atari"], r"error: --atari: preprocesses an Atari game of --backend gym, ALE/\.\.\. "
                                     r"\(e\.g\. ALE/Breakout-v5\), got --env CartPole-v1 with --backend gym$"),
    (["--episodes", "3", "--mode", "test"], r"error: --mode: invalid choice: 'test'"),
])
def test_mistakes_are_one_line_naming_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
                                               message: str) -> None:
    err = fails(capsys, "rollout", "--env", "CartPole-v1", "--store", str(tmp_path / "store"), "--run", "x", *argv)
    assert re.search(message, err), err
    assert not (tmp_path / "store").exists()  # said before any store is made


def test_atari_by_name_as_dqn_sees_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    as_numpy = pytest.importorskip("tests.rollout.test_atari", reason="the [atari] extra is not installed").as_numpy
    code, out, _ = run(capsys, "rollout", "--env", "ALE/Breakout-v5", "--atari", "--num-envs", "2", "--steps", "300",
                       "--store", str(tmp_path / "four"), "--run", "breakout", "--no-progress")
    assert code == 0 and "of ALE/Breakout-v5 as run 'breakout'" in out
    store = trajstore.open(tmp_path / "four")
    assert {f.env_id for f in store.maintain.files()} == {"ALE/Breakout-v5"}
    files = store.maintain.files()
    assert all(FileEncoding.of(pq.ParquetFile(f.path).schema_arrow.metadata).stacks == {"obs": 4} for f in files)
    obs = as_numpy(store.scan(["obs"]).read_all()["obs"])
    assert obs.dtype == np.uint8 and obs.shape[1:] == (4, 84, 84)
    assert 300 <= len(obs) <= 301  # 301: a reset step of one env, not stored, left the other one's
    code, out, _ = run(capsys, "rollout", "--env", "ALE/Breakout-v5", "--atari", "--frame-stack", "2", "--num-envs",
                       "1", "--steps", "8", "--store", str(tmp_path / "two"), "--run", "two", "--no-progress")
    two = trajstore.open(tmp_path / "two").scan(["obs"]).read_all()["obs"]  # another store: an env keeps its types
    assert code == 0 and as_numpy(two).shape == (8, 2, 84, 84)


def test_an_ale_id_without_preprocessing_is_the_raw_screen(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("ale_py", reason="the [atari] extra (ale-py) is not installed")
    code, _, _ = run(capsys, "rollout", "--env", "ALE/Pong-v5", "--num-envs", "1", "--steps", "4", "--store",
                     str(tmp_path), "--run", "raw", "--no-progress")
    store = trajstore.open(tmp_path)
    got = store.sql("SELECT env_id, obs FROM steps LIMIT 1").to_pylist()[0]
    assert code == 0 and got["env_id"] == "ALE/Pong-v5" and np.array(got["obs"]).shape == (210, 160, 3)
    err = fails(capsys, "rollout", "--backend", "jax", "--env", "ALE/Pong-v5", "--atari", "--steps", "4", "--store",
                str(tmp_path), "--run", "x")
    assert "--atari: preprocesses an Atari game of --backend gym" in err


@pytest.mark.slow
def test_an_sb3_checkpoint_is_loaded_with_a_warning_that_it_is_a_pickle(tmp_path: Path) -> None:
    """A shell's ``trajstore rollout --policy sb3:…`` says on stderr, before loading it, that a checkpoint is a pickle
    to load only from trusted sources."""
    pytest.importorskip("stable_baselines3", reason="the [sb3] extra is not installed")
    from tests.rollout.test_policies import sb3_checkpoint

    path = sb3_checkpoint(tmp_path)
    done = subprocess.run([sys.executable, "-m", "trajstore.cli", "rollout", "--env", "CartPole-v1", "--episodes",
                           "2", "--num-envs", "1", "--policy", f"sb3:PPO:{path}", "--store", str(tmp_path / "store"),
                           "--run", "ppo", "--no-progress"], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TRAJSTORE_DEBUG": ""})
    assert done.returncode == 0, done.stderr
    assert f"policy: {path} is a Stable-Baselines3 checkpoint, which is a pickle: loading it runs any code its " \
           "author put in it. Load checkpoints only from sources you trust." in " ".join(done.stderr.split())


def test_the_help_says_an_sb3_checkpoint_is_a_pickle(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["rollout", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "which is a pickle: loading it runs any code its author put in it, so load only checkpoints from " \
           "sources you trust" in out


@pytest.mark.slow
def test_a_rollout_records_the_commit_of_the_user_s_repository(tmp_path: Path) -> None:
    """Started in the user's own git repository, a rollout's run records that repository's commit, not trajstore's;
    started anywhere else, none."""
    repo, elsewhere = tmp_path / "experiments", tmp_path / "elsewhere"
    repo.mkdir()
    elsewhere.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    try:
        subprocess.run([*git, "init", "-q"], check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("git is not installed")
    (repo / "train.yaml").write_text("algo: ppo\n")
    subprocess.run([*git, "add", "train.yaml"], check=True)
    subprocess.run([*git, "commit", "-qm", "c"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    store = tmp_path / "store"
    for cwd, run in ((repo, "mine"), (elsewhere, "nowhere")):
        done = subprocess.run([sys.executable, "-m", "trajstore.cli", "rollout", "--env", "CartPole-v1", "--steps",
                               "32", "--store", str(store), "--run", run, "--no-progress"], cwd=cwd,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
    assert trajstore.open(store).run_info("mine")["git_commit"] == head
    assert trajstore.open(store).run_info("nowhere")["git_commit"] is None


def interrupted_rollout(argv: list[str], store: trajstore.Store) -> str:
    """``argv`` (a ``trajstore ...`` command) run in a process of its own, sent SIGINT (Ctrl-C) once the store has a
    new commit of its run; its standard error. Its writer commits every few thousand steps
    (``TRAJSTORE_FLUSH_BYTES``), as a long rollout commits every 128 MiB."""
    import signal

    since = store.version
    env = {**os.environ, "TRAJSTORE_FLUSH_BYTES": "200000", "TRAJSTORE_DEBUG": ""}
    proc = subprocess.Popen([sys.executable, "-m", "trajstore.cli", *argv[1:]], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        first = next(iter(store.follow(since=since, run_id="r", timeout=300)), None)
        assert first is not None and first.rows.num_rows > 0, proc.stderr.read() if proc.poll() is not None else ""
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130 and out == "", err
    return err


def commands_said(err: str) -> tuple[list[str], list[str]]:
    """The commands an interrupted rollout says to run: the one that goes on, and the one that removes."""
    lines = err.splitlines()
    go_on = lines[lines.index(next(line for line in lines if line.startswith("  to go on"))) + 1]
    remove = lines[lines.index("  to remove them:") + 1]
    return shlex.split(go_on), shlex.split(remove)


def test_what_an_interrupted_rollout_says_follows_from_its_arguments_and_what_it_kept() -> None:
    """The lines of an interrupted rollout, from its command and what it kept (the test below sees them after a real
    Ctrl-C): what is left, seeds past every env's, ``--append``; the whole run removed, or this worker's episodes."""
    argv = ["rollout", "--env", "CartPole-v1", "--num-envs", "4", "--steps=1000", "--seed", "7", "--store", "s",
            "--run", "r"]  # as given after `trajstore`
    args = build_parser().parse_args(argv)
    alone = interrupted.Kept(steps=600, complete=20, unfinished=4, others=0)
    lines = interrupted.report(args, argv, alone, "s", "w-1").splitlines()
    assert lines[0] == ("trajstore: interrupted; run 'r' keeps what this rollout stored in s before it stopped: "
                        "600 steps, 20 complete episodes and 4 unfinished (stored, marked incomplete)")
    assert "the 400 steps left" in lines[1]
    assert shlex.split(lines[2]) == ["trajstore", "rollout", "--env", "CartPole-v1", "--num-envs", "4", "--store",
                                     "s", "--run", "r", "--steps", "400", "--seed", "11", "--append"]
    assert shlex.split(lines[4]) == ["trajstore", "delete", "--store", "s", "--run", "r"]
    shared = interrupted.Kept(steps=600, complete=20, unfinished=0, others=3)
    assert shlex.split(interrupted.remove_command(args, shared, "w-1") or "")[-2:] == ["--where", "worker_id = 'w-1'"]
    assert interrupted.report(args, argv, interrupted.Kept(0, 0, 0, 0), "s", "w-1") == \
        "trajstore: interrupted before this rollout stored any step; run 'r' is not in the store; " \
        "the same command starts it again"


def test_an_interrupted_rollout_says_what_it_kept_and_how_to_go_on_or_remove_it(tmp_path: Path) -> None:
    path = tmp_path / "store"
    store = trajstore.open(path, create=True)
    err = interrupted_rollout(["trajstore", "rollout", "--env", "CartPole-v1", "--num-envs", "4", "--steps",
                               "100000000", "--store", str(path), "--run", "r", "--no-progress"], store)
    (row,) = trajstore.open(path).runs().to_pylist()
    unfinished = row["episodes"] - row["complete_episodes"]
    assert err.splitlines()[0] == (
        f"trajstore: interrupted; run 'r' keeps what this rollout stored in {path} before it stopped: "
        f"{row['steps']:,} steps, {row['complete_episodes']:,} complete episodes"
        + (f" and {unfinished:,} unfinished (stored, marked incomplete)" if unfinished else ""))
    go_on, remove = commands_said(err)
    assert go_on == ["trajstore", "rollout", "--env", "CartPole-v1", "--num-envs", "4", "--store", str(path), "--run",
                     "r", "--no-progress", "--steps", str(100_000_000 - row["steps"]), "--seed", "4", "--append"]
    assert remove == ["trajstore", "delete", "--store", str(path), "--run", "r"]

    err = interrupted_rollout(go_on, store)  # taken as said: the run grows, from new seeds
    seeds = trajstore.open(path).sql("SELECT seed, list(obs) AS first FROM steps WHERE step = 0 GROUP BY seed")
    first = {s: {tuple(o) for o in obs} for s, obs in zip(*seeds.to_pydict().values())}
    assert set(first) == {0, 4} and not first[0] & first[4]  # no episode started again as one stored had
    mine = trajstore.open(path).sql("SELECT sum(episode_length) AS steps FROM episodes WHERE seed = 4")
    assert f"stored in {path} before it stopped: {mine['steps'][0].as_py():,} steps" in err
    again, remove_mine = commands_said(err)
    assert again[again.index("--seed") + 1] == "8"
    worker = remove_mine[remove_mine.index("--where") + 1]
    assert remove_mine[:6] == ["trajstore", "delete", "--store", str(path), "--run", "r"]

    def run_said(command: list[str]) -> None:  # as typed after `trajstore` (the CLI's entry point, in this process)
        assert main([*command[1:], "--yes"]) == 0

    run_said(remove_mine)  # this rollout's episodes alone
    assert trajstore.open(path).runs()["steps"].to_pylist() == [row["steps"]]
    assert re.fullmatch(r"worker_id = '[^']+'", worker)
    run_said(remove)
    assert trajstore.open(path).run_ids() == []
