"""``--config-file`` (cli/config_file.py): a YAML alias bomb, an alias that refers to itself and nesting past a config's
depth are refused at once, in one line naming the flag, before any store is made; anchors and aliases within the
bounds are read as YAML says."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

import trajstore
from trajstore.cli.config_file import load
from trajstore.errors import InputError

# 342 bytes that stand for 9**9 (387 million) strings: each line repeats the one before nine times
BOMB = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{y}: &{y} [*{x},*{x},*{x},*{x},*{x},*{x},*{x},*{x},*{x}]\n" for x, y in zip("abcdefgh", "bcdefghi"))


def cli(*argv: str, timeout: float = 600) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "trajstore.cli", *argv], capture_output=True, text=True,
                          timeout=timeout)
    return done, time.perf_counter() - start


def rollout(tmp_path: Path, config: Path, run: str) -> list[str]:
    return ["rollout", "--env", "CartPole-v1", "--num-envs", "2", "--steps", "64", "--store", str(tmp_path / run),
            "--run", run, "--config-file", str(config), "--no-progress"]


@pytest.mark.slow
def test_a_yaml_alias_bomb_is_refused_at_once_before_any_store_is_made(tmp_path: Path) -> None:
    (tmp_path / "bomb.yaml").write_text(BOMB)
    (tmp_path / "plain.yaml").write_text("algo: ppo\nlr: 0.0003\n")
    plain, took = cli(*rollout(tmp_path, tmp_path / "plain.yaml", "plain"))
    assert plain.returncode == 0, plain.stderr
    bomb, refused_in = cli(*rollout(tmp_path, tmp_path / "bomb.yaml", "bomb"), timeout=10 * took + 30)
    assert bomb.returncode == 2 and bomb.stdout == ""
    assert bomb.stderr.startswith("trajstore: error: --config-file: ") and bomb.stderr.count("\n") == 1
    assert "expands to more than" in bomb.stderr and "alias" in bomb.stderr and "Traceback" not in bomb.stderr
    assert refused_in < took  # refused before a rollout that makes an environment, as a plain file's does
    assert not (tmp_path / "bomb").exists()
    assert trajstore.open(tmp_path / "plain").run_info("plain")["config"] == {"algo": "ppo", "lr": 0.0003}


@pytest.mark.parametrize(("text", "message"), [
    (BOMB, r"expands to more than 524288 values"),
    ("a: &a [1, *a]\n", r"an alias refers to the value that holds it"),
    ("a: " + "[" * 40 + "1" + "]" * 40 + "\n", r"nests deeper than a config may \(32 levels\)"),
    ("a: " + "[" * 5000 + "1" + "]" * 5000 + "\n", r"nests deeper than a config may \(32 levels\)"),
])
def test_a_file_past_a_config_s_bounds_is_refused_naming_the_flag(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(InputError, match=rf"--config-file: .*{message}"):
        load(path)


def test_json_nested_past_python_s_limit_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(InputError, match=r"--config-file: .* nests deeper than a config may"):
        load(path)


def test_aliases_within_the_bounds_are_read_as_yaml_says_and_past_them_refused(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("base: &base {lr: 0.001, net: {width: 64}}\nppo:\n  <<: *base\n  lr: 0.0003\n"
                    "layers: &layers [64, 64]\ncritic: *layers\n")
    assert load(path) == {"base": {"lr": 0.001, "net": {"width": 64}}, "ppo": {"lr": 0.0003, "net": {"width": 64}},
                          "layers": [64, 64], "critic": [64, 64]}
    path.write_text("unit: &u [" + ", ".join(["1.0"] * 1000) + "]\n" + "".join(
        f"x{i}: *u\n" for i in range(600)))  # 600,000 values: past what a config's 1 MiB holds
    with pytest.raises(InputError, match=r"--config-file: .* expands to more than 524288 values"):
        load(path)
