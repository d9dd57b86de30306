"""Store.scan: the rows and order of ``SELECT … FROM steps`` read straight from the committed files, in the types
the files store (array columns every environment stores with one shape as fixed-size lists where DuckDB's view
gives variable-size ones, so that ``obs`` converts to a ``(n, *shape)`` array; timestamps in the files' zone)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from gymnasium import spaces

import trajstore
from tests.helpers import make_batch, write_mixed_store
from trajstore.errors import InputError


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> trajstore.Store:
    """Two runs, two envs with different observation shapes, lineage and extras in some files only,
    several commits per writer."""
    return write_mixed_store(tmp_path_factory.mktemp("scan") / "store", seed=0, commits=3)


def in_duckdb(store: trajstore.Store, columns: list[str], where: str = "true") -> pa.Table:
    """The reference: the same selection through DuckDB."""
    select = ", ".join(f'"{c}"' for c in columns)
    with store.snapshot() as snap:
        return snap.arrow(f"SELECT {select} FROM steps WHERE {where}")


def same(scanned: pa.Table, reference: pa.Table) -> bool:
    """The same columns and rows (SQL has no order: both sorted by episode_id and step, which must be there); where
    the scan has fixed-size lists or the files' time zone, the view's lists and timestamps are cast to them
    (nothing else may differ)."""
    assert scanned.schema.names == reference.schema.names
    keys = [("episode_id", "ascending"), ("step", "ascending")]
    scanned, reference = scanned.sort_by(keys), reference.sort_by(keys)
    for i, (got, ref) in enumerate(zip(scanned.schema, reference.schema)):
        if got.type != ref.type:
            fixed = pa.types.is_fixed_size_list(got.type) or pa.types.is_struct(got.type)
            assert fixed or (pa.types.is_timestamp(got.type) and pa.types.is_timestamp(ref.type)), (got, ref)
            reference = reference.set_column(i, ref.name, reference.column(i).cast(got.type))
    return scanned.equals(reference)


def test_every_column_matches_the_steps_view_in_rows_order_and_types(mixed: trajstore.Store) -> None:
    with mixed.snapshot() as snap:
        columns = snap.step_columns
    got = mixed.scan(batch_size=7).read_all()
    assert same(got, in_duckdb(mixed, columns))
    assert got.num_rows == sum(f.rows for f in mixed.maintain.files())


@pytest.mark.parametrize(("kwargs", "where"), [
    ({"run_id": "b"}, "run_id = 'b'"),
    ({"env_id": ["Wide-v0", "Other-v0"]}, "env_id IN ('Wide-v0', 'Other-v0')"),
    ({"run_id": ["a"], "env_id": "Small-v0"}, "run_id = 'a' AND env_id = 'Small-v0'"),
    ({"where": "complete AND episode_return > 0"},
     "episode_id IN (SELECT episode_id FROM episodes WHERE complete AND episode_return > 0)"),
    ({"where": "\"mode\" = 'train'"}, "episode_id IN (SELECT episode_id FROM episodes WHERE \"mode\" = 'train')"),
])
def test_filters_select_the_same_steps_as_sql(mixed: trajstore.Store, kwargs: dict, where: str) -> None:
    columns = ["run_id", "env_id", "episode_id", "step", "obs", "reward", "policy_version"]
    got = mixed.scan(columns, batch_size=50, **kwargs).read_all()
    assert same(got, in_duckdb(mixed, columns, where))


def test_dict_observations_are_structs_as_in_the_view(tmp_path: Path) -> None:
    store = trajstore.open(tmp_path / "dict", create=True)
    rng = np.random.default_rng(1)
    for env_id, dim in (("Dict-v0", 2), ("Dict-v1", 5)):  # the pos shape differs between the two envs
        obs = {"pos": rng.uniform(-1, 1, (10, 2, dim)).astype(np.float32), "mode": rng.integers(0, 3, (10, 2))}
        batch = make_batch(rng, 10, 2)
        batch["obs"] = batch["next_obs"] = obs
        box = spaces.Dict({"pos": spaces.Box(-1, 1, (dim,), np.float32), "mode": spaces.Discrete(3)})
        with store.writer(run_id="r", env_id=env_id, observation_space=box, action_space=spaces.Discrete(4)) as w:
            w.add_batch(batch)
    columns = ["env_id", "episode_id", "step", "obs", "next_obs", "action"]
    got = store.scan(columns).read_all()
    assert pa.types.is_struct(got.schema.field("obs").type)
    assert same(got, in_duckdb(store, columns))


def test_episode_ids_select_their_steps_and_skip_other_files(mixed: trajstore.Store) -> None:
    ids = mixed.sql("SELECT episode_id FROM episodes ORDER BY episode_id")["episode_id"].to_pylist()
    chosen = [ids[0], ids[len(ids) // 2], ids[-1], 12345]  # the last one is in no file
    columns = ["episode_id", "step", "action"]
    got = mixed.scan(columns, episode_id=chosen).read_all()
    assert same(got, in_duckdb(mixed, columns, f"episode_id IN ({', '.join(map(str, chosen))})"))
    assert set(got["episode_id"].to_pylist()) == set(chosen[:3])
    assert mixed.scan(columns, episode_id=12345).read_all().num_rows == 0


def test_batches_are_at_most_batch_size_and_arrive_in_order(mixed: trajstore.Store) -> None:
    reader = mixed.scan(["episode_id", "step"], batch_size=16)
    sizes = [b.num_rows for b in reader]
    assert max(sizes) == 16 and sum(sizes) == sum(f.rows for f in mixed.maintain.files())


def test_an_empty_store_scans_to_no_rows_with_the_view_types(tmp_path: Path) -> None:
    store = trajstore.open(tmp_path / "empty", create=True)
    got = store.scan(["episode_id", "obs"]).read_all()
    assert got.num_rows == 0
    assert got.schema == in_duckdb(store, ["episode_id", "obs"]).schema


def test_bad_arguments_name_the_field(mixed: trajstore.Store) -> None:
    with pytest.raises(InputError, match=r"columns: unknown column\(s\) \['nope'\]"):
        mixed.scan(["obs", "nope"])
    with pytest.raises(InputError, match="batch_size"):
        mixed.scan(batch_size=0)


def test_wide_rows_make_smaller_batches(tmp_path: Path) -> None:
    store = trajstore.open(tmp_path / "wide", create=True)
    with store.writer(run_id="r", env_id="Pixels-v0") as w:
        w.add_batch(make_batch(np.random.default_rng(2), 20, 4, obs_dim=3072))  # 12 KiB of obs per row
    cap = 100_000
    batches = list(store.scan(["obs", "reward"], batch_size=1000, max_batch_bytes=cap))
    assert sum(b.num_rows for b in batches) == 80
    assert 1 <= max(b.num_rows for b in batches) <= cap // (3072 * 4 + 4)  # obs and reward, decoded
    assert all(b.nbytes <= 1.25 * cap for b in batches)  # near the cap: offsets and padding come on top
    narrow = list(store.scan(["reward"], batch_size=1000, max_batch_bytes=cap))
    assert [b.num_rows for b in narrow] == [80]  # narrow rows: batch_size applies
    with pytest.raises(InputError, match="max_batch_bytes"):
        store.scan(max_batch_bytes=0)


def test_fixed_shapes_come_as_fixed_size_lists(mixed: trajstore.Store) -> None:
    small = mixed.scan(["obs", "next_obs"], env_id="Small-v0").read_all()
    assert small.schema.field("obs").type == pa.list_(pa.float32(), 3)
    from trajstore.schema import to_numpy
    assert to_numpy(small["obs"]).shape == (small.num_rows, 3)
    both = mixed.scan(["obs"], run_id="a").read_all()  # Small-v0 (3) and Wide-v0 (8): no one size
    assert pa.types.is_list(both.schema.field("obs").type)


def test_the_types_follow_each_commit(tmp_path: Path) -> None:
    store = trajstore.open(tmp_path / "growing", create=True)
    rng = np.random.default_rng(4)
    with store.writer(run_id="r", env_id="A-v0") as w:
        w.add_batch(make_batch(rng, 5, 2))
    assert "hidden" not in store.scan().schema.names  # the types of this version are now kept
    with store.writer(run_id="r", env_id="B-v0") as w:  # a new extra column in a later commit
        w.add_batch(make_batch(rng, 5, 2, extras={"hidden": rng.random((5, 2, 3)).astype(np.float32)}))
    got = store.scan(["env_id", "episode_id", "step", "hidden"]).read_all()
    assert same(got, in_duckdb(store, ["env_id", "episode_id", "step", "hidden"]))
    assert got["hidden"].null_count == 10 and got.num_rows == 20
