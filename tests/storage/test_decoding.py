"""The step decoding described once (trajstore.storage.decoding): every rule of the description, in every reader —
numpy (the scan every Python reader uses), DuckDB's ``steps`` view, the DuckDB SQL a user runs
(``trajstore schema --sql``) and the Spark SQL (``--dialect spark``) — against what was written and what the plain
reference loops (``encoding_reference.py``) decode. Each test is named by its rule: a rule added to the description
without a case here, or a reader that lacks it, fails naming the rule."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.storage.encoding_reference import decode_reference, encode_reference
from tests.storage.test_encoding import episode_stacks, leaf_type
from trajstore.errors import InputError
from trajstore.query import spark_sql, sql
from trajstore.query.groups import group_files, step_types
from trajstore.query.scan import scan_steps
from trajstore.query.snapshot import Snapshot, decoding_sql
from trajstore.storage import decoding
from trajstore.storage.encoding import NEXT_DECODERS, OBS_DECODERS, FileEncoding, FileSchema, from_numpy
from trajstore.storage.log import DataFile

READ = ["episode_id", "step", "obs", "next_obs", "reward"]


@dataclass(frozen=True)
class Case:
    """Rows of one environment's file: observation leaves of ``dtype`` and frame ``shape``, stacked by ``k`` (or
    not), as a Dict observation (a ``pixels`` leaf beside an int ``mode``) or not; ``renamed``: the reward stored
    under a typed physical name; ``plain``: encoding 1 (no footer, every column as stored); ``action``: an extra
    column of that Arrow type."""

    dtype: str = "float32"
    shape: tuple[int, ...] = (3,)
    k: int | None = None
    dict_obs: bool = False
    renamed: bool = False
    plain: bool = False
    action: pa.DataType | None = None


# one environment per case; "mixed" is two environments storing ``action`` in types that cannot be one column
CASES: dict[str, list[Case]] = {
    "vector": [Case()],
    "stack": [Case("float32", (2,), 3)],
    "image": [Case("uint8", (3, 4))],
    "image_stack": [Case("int8", (2, 3), 2)],
    "dict": [Case("uint8", (2, 2), 4, dict_obs=True)],
    "renamed": [Case(renamed=True)],
    "plain": [Case(plain=True)],
    "mixed": [Case(action=pa.int64()), Case(action=pa.list_(pa.float32(), 1))],
}


def frames(rng: np.random.Generator, dtype: str, n: int, shape: tuple[int, ...]) -> np.ndarray:
    if np.dtype(dtype).kind == "f":
        return rng.normal(size=(n, *shape)).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, (n, *shape), endpoint=True).astype(dtype)


def logical_rows(case: Case, seed: int) -> pa.Table:
    """Episodes one after another (the first continues one: it starts at step 2), stacks as FrameStackObservation
    makes them, one stack that does not shift and one next_obs that is not the next obs (both stored whole)."""
    rng = np.random.default_rng(seed)
    obs_rows, next_rows, eids, steps = [], [], [], []
    for e, n in enumerate([5, 3, 6]):
        f = frames(rng, case.dtype, n + 1, case.shape)
        stacks = episode_stacks(f, case.k, "reset" if e % 2 else "zero") if case.k else f
        obs_rows.append(stacks[:-1].copy()), next_rows.append(stacks[1:].copy())
        first = 2 if e == 0 else 0
        eids += [100 * seed + e] * n
        steps += list(range(first, first + n))
    obs, nxt = np.concatenate(obs_rows), np.concatenate(next_rows)
    obs[9] = frames(rng, case.dtype, 1, obs.shape[1:])[0]  # mid-episode: a stack that breaks, a next_obs stored
    t = leaf_type(case.dtype, obs.shape[1:])
    n = len(obs)
    columns: dict[str, Any] = {"episode_id": pa.array(eids, pa.int64()), "step": pa.array(steps, pa.int32())}
    if case.dict_obs:
        mode = rng.integers(0, 5, n + 1)
        struct = pa.struct([("pixels", t), ("mode", pa.int64())])
        columns["obs"] = pa.StructArray.from_arrays([from_numpy(obs, t), pa.array(mode[:-1])], fields=list(struct))
        columns["next_obs"] = pa.StructArray.from_arrays([from_numpy(nxt, t), pa.array(mode[1:])],
                                                         fields=list(struct))
    else:
        columns["obs"], columns["next_obs"] = from_numpy(obs, t), from_numpy(nxt, t)
    columns["reward"] = pa.array(rng.normal(size=n).astype(np.float32))
    columns["terminated"] = pa.array(np.arange(n) % 4 == 3)
    columns["truncated"] = pa.array(np.zeros(n, bool))
    if case.action is not None:
        values = rng.integers(0, 3, n)
        columns["action"] = pa.array(values, case.action) if not pa.types.is_fixed_size_list(case.action) else \
            from_numpy(values.astype(np.float32).reshape(n, 1), case.action)
    return pa.table(columns)


def encoding(case: Case, table: pa.Table) -> FileEncoding:
    if case.plain:
        return FileEncoding()
    stacks = {("obs.pixels" if case.dict_obs else "obs"): case.k} if case.k else {}
    fmt = FileEncoding.for_obs(table.schema.field("obs").type, frame_stack=stacks)
    renames = {"reward": "reward__float32"} if case.renamed else {}
    if case.action is not None and pa.types.is_nested(case.action):  # as trajstore stores a second kind of action
        renames["action"] = "action__float32_1d"
    return fmt.with_columns(renames) if renames else fmt


@dataclass
class Written:
    """The files of one case, each environment's logical rows, and the files' schemas."""

    root: Path
    files: list[DataFile]
    schemas: list[FileSchema]
    logical: dict[str, pa.Table]


def write(root: Path, cases: list[Case]) -> Written:
    files, schemas, logical = [], [], {}
    for i, case in enumerate(cases):
        env = f"env{i}"
        table = logical_rows(case, i + 1)
        fmt = encoding(case, table)
        stored = encode_reference(table, fmt) if fmt.encoded else table
        stored = stored.rename_columns([fmt.physical(n) for n in stored.column_names])
        if fmt.encoded:
            plain = pa.Table.from_pylist(decode_reference(stored.rename_columns(table.column_names).to_pylist(), fmt),
                                         schema=table.schema)
            assert plain.equals(table)  # the reference reads back what was written
        folder = root / "steps" / "run_id=r" / f"env_id={env}"
        folder.mkdir(parents=True)
        path = folder / "part-0.parquet"
        pq.write_table(stored.replace_schema_metadata(fmt.metadata() if fmt.encoded or fmt.columns else None), path)
        files.append(DataFile(str(path), "r", env, table.num_rows, path.stat().st_size, 0))
        schemas.append(FileSchema.of(pq.read_schema(path)))
        logical[env] = table
    return Written(root, files, schemas, logical)


# --- each reader: the rows of one environment, columns of READ (and action where stored), by episode and step ------

def by_numpy(w: Written, env: str | None, columns: list[str]) -> list[dict[str, Any]]:
    """What a scan of ``env``'s files (every file for None) gives, as ``Store.scan`` reads them."""
    keep = [i for i, f in enumerate(w.files) if env is None or f.env_id == env]
    files, schemas = [w.files[i] for i in keep], [w.schemas[i] for i in keep]
    types = step_types(group_files(files, schemas))
    types.check_one_type(columns)
    reader = scan_steps(files, types.schema, columns, schemas=schemas)
    return reader.read_all().sort_by([("episode_id", "ascending"), ("step", "ascending")]).to_pylist()


def _query(env: str, columns: list[str]) -> str:
    return f"SELECT {sql.select_list(columns)} FROM steps WHERE env_id = {sql.literal(env)} ORDER BY episode_id, step"


def by_duckdb_view(w: Written, env: str, columns: list[str]) -> list[dict[str, Any]]:
    with Snapshot(w.files, schemas=w.schemas) as snapshot:
        return snapshot.arrow(_query(env, columns)).to_pylist()


def by_duckdb_sql(w: Written, env: str, columns: list[str]) -> list[dict[str, Any]]:
    con = duckdb.connect()
    paths = ", ".join(sql.literal(f.path) for f in w.files)
    con.execute(f"CREATE VIEW stored_steps AS SELECT * FROM read_parquet([{paths}], hive_partitioning = true, "
                "union_by_name = true)")
    con.execute(decoding_sql(w.files, w.schemas))
    answer = con.sql(_query(env, columns))  # fetched as Python values: a VARIANT through Arrow is opaque bytes
    return [dict(zip(answer.columns, row)) for row in answer.fetchall()]


READERS: dict[str, Callable[[Written, Any, list[str]], list[dict[str, Any]]]] = {
    "numpy": by_numpy, "duckdb_view": by_duckdb_view, "duckdb_sql": by_duckdb_sql}


def plain(v: Any) -> Any:
    """Values to compare across readers: lists whatever their fixed sizes."""
    if isinstance(v, dict):
        return {k: plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    return v


def mixed_types(name: str) -> bool:
    """Whether the environments of case ``name`` store ``action`` in types that cannot be one column."""
    return len({str(c.action) for c in CASES[name] if c.action is not None}) > 1


def cases_of(rule: decoding.Rule) -> list[str]:
    """The cases whose files a reader decodes by ``rule``."""
    out = []
    for name, cases in CASES.items():
        used = set()
        for case in cases:
            table = logical_rows(case, 1)
            fmt = encoding(case, table)
            used |= {r.name for r in fmt.plan(table.schema.field("obs").type).rules} if fmt.encoded else set()
            used |= {decoding.STORED.name} if not fmt.encoded or fmt.columns else set()
        used |= {decoding.MIXED.name} if mixed_types(name) else set()
        if rule.name in used:
            out.append(name)
    return out


def test_every_rule_has_a_case() -> None:
    assert [r.name for r in decoding.RULES if not cases_of(r)] == []
    assert len({r.name for r in decoding.RULES}) == len(decoding.RULES)


def test_every_reader_renders_every_expression_and_decodes_every_leaf_rule() -> None:
    """A new kind of expression or leaf rule that a dialect or the numpy decoder lacks fails here by name."""
    assert [e.__name__ for e in decoding.EXPRESSIONS if e not in sql._RENDER] == []
    assert [e.__name__ for e in decoding.EXPRESSIONS if e not in spark_sql._RENDER] == []
    assert [r.name for r in decoding.LEAF_RULES if r.name not in OBS_DECODERS | NEXT_DECODERS] == []


def check_rule(rule: decoding.Rule, read: Callable[[Written, str, list[str]], list[dict[str, Any]]],
               root: Path, reader: str) -> None:
    for name in cases_of(rule):
        w = write(root / name, CASES[name])
        if rule is decoding.MIXED and reader == "numpy":  # one environment at a time, each in its own type
            with pytest.raises(InputError, match="'action' is stored in types that cannot be one column"):
                by_numpy(w, None, [*READ, "action"])
        for env, table in w.logical.items():
            columns = READ + (["action"] if "action" in table.column_names else [])
            got = read(w, env, columns)
            want = table.select(columns).to_pylist()
            assert len(got) == len(want), (rule.name, name, env)
            for column in columns:
                theirs = [plain(r[column]) for r in got]
                if column == "action" and mixed_types(name):  # one type holds both: in Spark each value's text
                    theirs = [plain(_parsed(v)) for v in theirs]
                assert theirs == [plain(r[column]) for r in want], (rule.name, name, env, column)


def _parsed(v: Any) -> Any:
    import json

    return json.loads(v) if isinstance(v, str) else v


@pytest.mark.parametrize("reader", list(READERS))
@pytest.mark.parametrize("rule", decoding.RULES, ids=[r.name for r in decoding.RULES])
def test_each_rule_reads_back_what_was_written(rule: decoding.Rule, reader: str, tmp_path: Path) -> None:
    check_rule(rule, READERS[reader], tmp_path, reader)


@pytest.mark.spark
@pytest.mark.parametrize("rule", decoding.RULES, ids=[r.name for r in decoding.RULES])
def test_each_rule_reads_back_what_was_written_in_spark(rule: decoding.Rule, spark: Any, tmp_path: Path) -> None:
    def read(w: Written, env: str, columns: list[str]) -> list[dict[str, Any]]:
        stored = (spark.read.option("basePath", str(w.root / "steps")).option("mergeSchema", "true")
                  .parquet(*[f.path for f in w.files]))
        stored.createOrReplaceTempView("stored_steps")
        spark.sql(spark_sql.decoding_sql(w.files, w.schemas))
        rows = spark.sql(_query(env, columns).replace('"', "`")).collect()
        return [r.asDict(recursive=True) for r in rows]

    check_rule(rule, read, tmp_path, "spark")
