"""The Delta protocol trajstore reads: a version whose protocol needs a reader feature trajstore does not implement,
or whose files carry deletion vectors (rows another engine deleted), is refused by every read with an
``UnsupportedTableError`` naming the feature and the version; never read as rows the table no longer holds. Versions
from before stay readable, and so does the table once its files are rewritten without deletion vectors."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pytest
from deltalake import DeltaTable
from deltalake.exceptions import DeltaProtocolError

import trajstore
from tests import delta_protocol
from tests.helpers import make_batch
from trajstore.errors import StoreDamagedError, UnsupportedTableError
from trajstore.store import plumbing

READERS: dict[str, Callable[[trajstore.Store], Any]] = {
    "episodes": lambda s: s.episodes(),
    "stats": lambda s: s.stats(),
    "sql": lambda s: s.sql("SELECT count(*) AS n FROM steps"),
    "returns": lambda s: s.returns(gamma=0.9),
    "sequences": lambda s: list(s.sequences(4, batch_size=8)),
    "iter_batches": lambda s: list(s.iter_batches(batch_size=8)),
    "transitions": lambda s: list(s.transitions(1, gamma=0.9, batch_size=8)),
}


def episodes(store: trajstore.Store) -> list[dict[str, Any]]:
    return store.episodes().sort_by("episode_id").to_pylist()


@pytest.fixture
def written(store: trajstore.Store) -> trajstore.Store:
    """Two commits of one run: episodes ending in both."""
    for seed in (0, 1):
        with store.writer(run_id="a", env_id="E") as w:
            w.add_batch(make_batch(np.random.default_rng(seed), 16, 2, p_terminated=0.3))
    return store


def table(store: trajstore.Store) -> Path:
    return Path(store.root) / "steps"


def victim(store: trajstore.Store) -> int:
    """A complete episode of the store (the one another engine deletes)."""
    done = store.episodes().filter(pa.compute.field("complete")).sort_by("episode_id")
    return int(done["episode_id"][0].as_py())


def test_rows_deleted_through_a_deletion_vector_are_refused_never_served(written: trajstore.Store) -> None:
    """Another engine turns deletion vectors on (deltalake itself, which upgrades the protocol) and deletes an
    episode through one: deltalake's own reader leaves its rows out, its pyarrow reader refuses the table, and every
    trajstore read refuses it too — the Store read before as well as a new one — naming the feature and the version.
    The versions before still read as they were, and once the file is rewritten without its deletion vector (Spark's
    REORG … APPLY (PURGE)), the table reads again, without the episode."""
    before, gone = episodes(written), victim(written)
    enabled = delta_protocol.enable_deletion_vectors(table(written))
    assert episodes(written) == before  # the feature alone: no file carries a deletion vector yet
    deleted = delta_protocol.delete_episode(table(written), gone)
    assert delta_protocol.deltalake_episodes(table(written)) == {e["episode_id"] for e in before} - {gone}
    with pytest.raises(DeltaProtocolError, match="deletionVectors"):
        DeltaTable(str(table(written))).to_pyarrow_dataset()
    for store in (written, trajstore.open(written.root)):
        for name, read in READERS.items():
            with pytest.raises(UnsupportedTableError, match=f"at version {deleted}: rows of it were deleted through "
                                                            "deletion vectors.*REORG TABLE") as raised:
                read(store)
            assert raised.value.features == ("deletionVectors",) and raised.value.version == deleted, name
    assert written.version == deleted  # the number alone is no read of its rows
    assert episodes(trajstore.open(written.root, version=enabled)) == before
    delta_protocol.purge(table(written))
    assert episodes(written) == [e for e in before if e["episode_id"] != gone]


def test_a_deletion_vector_is_refused_even_where_the_protocol_does_not_list_it(written: trajstore.Store) -> None:
    """An ``add`` with a deletion vector in a table still on reader version 1 (a writer that broke the protocol):
    deltalake applies it all the same, and trajstore refuses the version rather than serve the deleted rows."""
    ids, gone = {e["episode_id"] for e in episodes(written)}, victim(written)
    deleted = delta_protocol.delete_episode(table(written), gone)
    assert DeltaTable(str(table(written))).protocol().min_reader_version == 1
    assert delta_protocol.deltalake_episodes(table(written)) == ids - {gone}
    with pytest.raises(UnsupportedTableError, match=f"at version {deleted}: rows of it were deleted"):
        written.stats()


REFUSED = [  # (minReaderVersion, readerFeatures, table properties), the feature the error names, and how
    ((3, ["columnMapping"], {"delta.columnMapping.mode": "name"}), "columnMapping",
     r"columnMapping \(delta.columnMapping.mode = name\)"),
    ((2, None, {"delta.columnMapping.mode": "id"}), "columnMapping",
     r"columnMapping \(delta.columnMapping.mode = id\)"),
    ((3, ["typeWidening"], None), "typeWidening", "reader feature.s. typeWidening"),
    ((3, ["v2Checkpoint"], None), "v2Checkpoint", "reader feature.s. v2Checkpoint"),
    ((3, ["vacuumProtocolCheck"], None), "vacuumProtocolCheck", "reader feature.s. vacuumProtocolCheck"),
    ((3, ["timestampNtz", "aFeatureOfTomorrow"], None), "aFeatureOfTomorrow",  # deltalake cannot open it
     "reader feature.s. aFeatureOfTomorrow,"),
    ((4, None, None), "minReaderVersion", r"minReaderVersion 4 \(trajstore reads up to 3\)"),  # nor this one
]
READ = [
    (3, ["timestampNtz", "variantType", "variantType-preview", "deletionVectors"], None),
    (3, ["columnMapping"], {"delta.columnMapping.mode": "none"}),
    (2, None, None),  # column mapping in mode none: the files use the schema's names
]


@pytest.mark.parametrize(("protocol", "feature", "named"), REFUSED, ids=[f for _, f, _ in REFUSED])
def test_a_protocol_that_needs_a_reader_feature_trajstore_lacks_is_refused_by_name(
        written: trajstore.Store, protocol: tuple[int, list[str] | None, dict[str, str] | None], feature: str,
        named: str) -> None:
    """Every read of the version refuses it, naming the feature and the version, in the Store that read before and
    in a new one; the store's health says why; the version before reads as it was."""
    before = episodes(written)
    upgraded = delta_protocol.set_protocol(table(written), *protocol)
    for store in (written, trajstore.open(written.root)):
        with pytest.raises(UnsupportedTableError, match=f"at version {upgraded}: the Delta table needs .*{named}") \
                as raised:
            store.episodes()
        assert feature in raised.value.features and raised.value.version == upgraded
        assert store.version == upgraded
        assert [str(raised.value)] == plumbing(store).problems()
    assert episodes(trajstore.open(written.root, version=upgraded - 1)) == before


def test_a_log_entry_that_cannot_be_read_is_still_damage_not_a_refusal(written: trajstore.Store) -> None:
    """Where deltalake cannot open a version, trajstore looks for the protocol that made it refuse; a latest entry cut
    short is no protocol at all but damage (503 over REST, ``trajstore check``)."""
    latest = table(written) / "_delta_log" / f"{written.version:020d}.json"
    latest.write_bytes(latest.read_bytes()[:40])
    with pytest.raises(StoreDamagedError, match="the commit log of .* cannot be read"):
        trajstore.open(written.root).stats()


@pytest.mark.parametrize("protocol", READ, ids=[str(p[:2]) for p in READ])
def test_a_protocol_whose_reader_features_trajstore_reads_is_read(
        written: trajstore.Store, protocol: tuple[int, list[str] | None, dict[str, str] | None]) -> None:
    """Reader features that change nothing for a reader of the file list and the Parquet files (column types it
    reads as they are; deletion vectors and column mapping supported by the table but unused)."""
    before = episodes(written)
    delta_protocol.set_protocol(table(written), *protocol)
    assert episodes(trajstore.open(written.root)) == episodes(written) == before
