"""A log that stays small (issue 49): a new store's tables carry Delta's retention properties, which trajstore,
deltalake and any other engine apply the same way; entries older than the retention go behind a checkpoint, and a
version whose entries went is refused naming the oldest one still readable, which is where ``history`` starts."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

import trajstore
from tests.helpers import make_batch
from trajstore.cli import main
from trajstore.errors import InputError, VersionNotFoundError
from trajstore.storage.retention import oldest_readable

LOG = "delta.logRetentionDuration"
INTERVAL = "delta.checkpointInterval"
KEYS = "delta.setTransactionRetentionDuration"
TOMBSTONES = "delta.deletedFileRetentionDuration"


def properties(path: Path) -> dict[str, str]:
    """The table's properties as deltalake (another engine) reads them."""
    return dict(DeltaTable(str(path)).metadata().configuration)


def write(store: trajstore.Store, commits: int, *, run_id: str = "r", seed: int = 0) -> None:
    with store.writer(run_id=run_id, env_id="E") as w:
        for i in range(commits):
            w.add_batch(make_batch(np.random.default_rng(seed * 1000 + i), 4, 2))
            w.flush()


def entries(path: Path) -> list[int]:
    return sorted(int(p.name[:20]) for p in (path / "_delta_log").glob("*.json"))


def test_a_new_store_gets_trajstores_retention_as_delta_properties(store: trajstore.Store) -> None:
    write(store, 1)
    for table in ("steps", "runs"):
        assert {k: v for k, v in properties(store.root / table).items() if k.startswith("delta.")} == \
            {LOG: "interval 7 days", INTERVAL: "25", KEYS: "interval 7 days", TOMBSTONES: "interval 7 days"}, table
    kept = store.maintain.log_retention()
    assert (kept.log_s, kept.checkpoint_interval, kept.oldest) == (7 * 86400, 25, 0)
    assert "steps: 7d of log entries, a checkpoint every 25 versions; versions 0.." in kept.format()


def test_the_priorities_table_gets_the_stores_rule_and_follows_it(tmp_path: Path) -> None:
    store = trajstore.open(tmp_path / "s", create=True, log_retention="1h")
    write(store, 2)
    with store.replay(priorities="learner", commit_interval=None) as replay:
        replay.update([0, 1], [2.0, 3.0])
        replay.commit()
    assert properties(store.root / "priorities")[LOG] == "interval 1 hours"  # made later, with the store's rule
    store.maintain.log_retention("3h", checkpoint_interval=7)
    assert (properties(store.root / "priorities")[LOG], properties(store.root / "priorities")[INTERVAL]) == \
        ("interval 3 hours", "7")
    assert "priorities: 3h of log entries, a checkpoint every 7 versions" in store.maintain.log_retention().format()


def test_log_retention_is_given_at_creation_and_set_later(tmp_path: Path) -> None:
    store = trajstore.open(tmp_path / "s", create=True, log_retention="1h")
    assert properties(store.root / "steps")[LOG] == "interval 1 hours"  # the table is made with it
    write(store, 1)
    assert properties(store.root / "runs")[LOG] == "interval 1 hours"  # made later, with the store's rule
    report = store.maintain.log_retention(timedelta(hours=2), checkpoint_interval=5)
    for table in ("steps", "runs"):
        assert (properties(store.root / table)[LOG], properties(store.root / table)[INTERVAL]) == \
            ("interval 2 hours", "5")
        assert properties(store.root / table)[KEYS] == properties(store.root / table)[TOMBSTONES] == \
            "interval 2 hours"
    assert [(t.table, t.rule.log_s, t.rule.checkpoint_interval) for t in report.tables] == \
        [("steps", 7200, 5), ("runs", 7200, 5), ("priorities", 7200, 5)]
    before = store.version
    store.maintain.log_retention("2h")  # nothing changes: no commit
    assert store.version == before
    assert trajstore.open(tmp_path / "s", log_retention="2h").version == before


@pytest.mark.parametrize("value, message", [
    ("30s", r"log_retention: must be at least 1m"), ("soon", r"log_retention: expected a duration such as"),
    (-5, r"log_retention: must be a duration >= 0s")])
def test_a_retention_that_cannot_be_kept_is_refused_naming_it(store: trajstore.Store, value: object,
                                                              message: str) -> None:
    with pytest.raises(InputError, match=message):
        store.maintain.log_retention(value)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="checkpoint_interval: must be a whole number of versions >= 1, got 0"):
        store.maintain.log_retention("1h", checkpoint_interval=0)


def aged(store: trajstore.Store, commits: int) -> int:
    """The store after ``commits`` commits under a 1-second retention another engine set (deltalake itself, below the
    minute trajstore takes), then more commits once they are older than that: the oldest version still readable."""
    steps = store.root / "steps"
    write(store, 2)
    DeltaTable(str(steps)).alter.set_table_properties({LOG: "interval 1 seconds", INTERVAL: "5"})
    write(store, commits, seed=1)
    time.sleep(1.5)
    write(store, 6, seed=2)  # a checkpoint comes, and with it the entries older than a second go
    deadline = time.monotonic() + 10
    while entries(steps)[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    oldest = store.maintain.log_retention().oldest
    assert oldest is not None and oldest > 0 and entries(steps)[0] > 0
    return oldest


def test_entries_older_than_the_retention_go_behind_a_checkpoint(store: trajstore.Store) -> None:
    oldest = aged(store, 20)
    steps = store.root / "steps"
    assert len(entries(steps)) < store.version + 1  # bounded by the retention, not by the commits
    assert store.version - oldest < 5 + 6 + 2  # what came since the last checkpoint, and the last second
    assert store.sql("SELECT count(*) AS n FROM steps")["n"][0].as_py() == (2 + 20 + 6) * 8  # every row still read
    assert trajstore.check(store).ok


def test_a_version_older_than_the_retention_is_refused_naming_the_oldest(store: trajstore.Store) -> None:
    first = datetime.now(timezone.utc)
    oldest = aged(store, 12)
    with pytest.raises(VersionNotFoundError, match=rf"version: version 3 can no longer be read \(its log entries "
                                                   rf"were cleaned up\): the log keeps 1s of entries .*the oldest "
                                                   rf"version it can read is {oldest}"):
        trajstore.open(store.uri, version=3)
    assert trajstore.open(store.uri, version=oldest).version == oldest
    with pytest.raises(InputError, match=rf"as_of: .* is before the store's first readable version \({oldest},"):
        trajstore.open(store.uri, as_of=first)
    history = store.history()
    assert history["version"].to_pylist() == list(range(oldest, store.version + 1))  # where it starts
    with pytest.raises(VersionNotFoundError, match=rf"the oldest version it can read is {oldest}"):
        next(store.follow(since=2, timeout=1))


def checkpoint_actions(steps: Path) -> dict[str, int]:
    """The add and remove actions (live files and tombstones) of the table's newest checkpoint."""
    newest = max((steps / "_delta_log").glob("*.checkpoint.parquet"))
    table = pq.read_table(newest, columns=["add", "remove"])
    return {name: len(table) - table[name].null_count for name in ("add", "remove")}


def test_files_a_compaction_removed_leave_the_checkpoint_with_the_log_entries(tmp_path: Path) -> None:
    """Each compaction leaves a tombstone per file it replaced; a store compacted thousands of times would carry them
    all in every checkpoint (and read them at every open) for Delta's default week, not its log's retention."""
    store = trajstore.open(tmp_path / "s", create=True, log_retention="1h")
    assert properties(store.root / "steps")[TOMBSTONES] == "interval 1 hours"  # kept as long as the log
    write(store, 6)
    store.maintain.compact()
    steps = store.root / "steps"
    DeltaTable(str(steps)).create_checkpoint()
    assert checkpoint_actions(steps) == {"add": 1, "remove": 6}  # within the retention: kept, the files too
    assert store.maintain.vacuum(older_than="1h", dry_run=True).files == []
    rows = store.sql("SELECT count(*) AS n FROM steps")["n"][0].as_py()
    # the rule another engine (deltalake) set, as ours but of a second: past it, the next checkpoint drops them
    DeltaTable(str(steps)).alter.set_table_properties({LOG: "interval 1 seconds", TOMBSTONES: "interval 1 seconds",
                                                       INTERVAL: "2"})
    time.sleep(1.5)
    write(store, 2, seed=1)  # the writers' upkeep checkpoints
    assert checkpoint_actions(steps)["remove"] == 0
    assert trajstore.open(store.uri).sql("SELECT count(*) AS n FROM steps")["n"][0].as_py() == rows + 2 * 8
    report = trajstore.check(store)
    assert report.ok and len(report.orphans) == 6  # the replaced files: read by no version, vacuum's to take


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``trajstore *argv`` (the CLI's own entry point, in this process): its exit status, standard output and
    error."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_cli_shows_and_sets_the_retention(store: trajstore.Store, capsys: pytest.CaptureFixture[str]) -> None:
    write(store, 1)
    code, out, err = cli(capsys, "retention", "--store", str(store.root))
    assert code == 0, err
    assert out.startswith("steps: 7d of log entries, a checkpoint every 25 versions; versions 0..")
    assert "\nruns: 7d of log entries" in out
    code, out, err = cli(capsys, "retention", "--store", str(store.root), "--log", "12h", "--checkpoint-interval", "10")
    assert code == 0, err
    assert "steps: 12h of log entries, a checkpoint every 10 versions" in out
    assert properties(store.root / "steps")[LOG] == "interval 12 hours"
    code, out, err = cli(capsys, "retention", "--store", str(store.root), "--log", "10s")
    assert code != 0 and "--log: must be at least 1m" in err


def test_history_on_the_cli_says_where_the_log_starts(store: trajstore.Store,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    oldest = aged(store, 8)
    code, out, err = cli(capsys, "history", "--store", str(store.root))
    assert code == 0, err
    assert f"the log starts at version {oldest}: it keeps 1s of entries" in err


def test_the_oldest_readable_version_is_the_oldest_checkpoint_with_every_entry_after_it() -> None:
    assert oldest_readable([], []) is None
    assert oldest_readable([0, 1, 2], []) == 0
    assert oldest_readable([9, 10, 11], [4, 9]) == 9
    assert oldest_readable([10, 11], [4, 9]) == 9  # the checkpoint stands for version 9, 10 and on follow it
    assert oldest_readable([3, 4, 7, 8, 9], [5, 6]) == 6  # 5 and 6 have checkpoints, entries 7.. follow 6
