"""Query results for a shell: an aligned table, CSV with nested cells as JSON, JSON lines without NaN, Parquet."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trajstore.cli import formats
from trajstore.errors import InputError

TABLE = pa.table({"name": ["a", "a much longer name than forty characters, to be clipped"],
                  "x": [1.5, math.nan], "obs": [[1.0, 2.0], None], "n": [3, 12345]})


def test_table_aligns_columns_and_clips_long_cells() -> None:
    lines = formats.render_table(TABLE).splitlines()
    assert lines[0].split() == ["name", "x", "obs", "n"]
    assert set(lines[1]) <= {"-", " "} and lines[-1] == "(2 rows)"
    assert "…" in lines[3] and len(lines[3].split("  ")[0]) <= formats.MAX_CELL
    assert lines[2].endswith("    3") and lines[3].endswith("12345")  # numbers right-aligned
    assert "[1.0, 2.0]" in lines[2]


def test_csv_has_a_header_and_nested_cells_as_json() -> None:
    rows = formats.render_csv(TABLE).splitlines()
    assert rows[0] == "name,x,obs,n"
    assert rows[1] == 'a,1.5,"[1.0, 2.0]",3'
    assert rows[2].endswith(",nan,,12345")


def test_json_lines_turn_nan_into_null() -> None:
    objects = [json.loads(line) for line in formats.render_json(TABLE).splitlines()]
    assert objects[0] == {"name": "a", "x": 1.5, "obs": [1.0, 2.0], "n": 3}
    assert objects[1]["x"] is None and objects[1]["obs"] is None


def test_parquet_needs_a_file_and_keeps_types(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="--output"):
        formats.write(TABLE, "parquet", io.StringIO())
    formats.write(TABLE, "parquet", io.StringIO(), output=str(tmp_path / "out.parquet"))
    back = pq.read_table(tmp_path / "out.parquet").cast(TABLE.schema)
    assert back.drop_columns(["x"]).equals(TABLE.drop_columns(["x"]))
    assert back["x"][0].as_py() == 1.5 and math.isnan(back["x"][1].as_py())


def test_unknown_format_and_output_to_a_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="format must be one of"):
        formats.write(TABLE, "xml", io.StringIO())
    formats.write(TABLE, "csv", io.StringIO(), output=str(tmp_path / "out.csv"))
    assert (tmp_path / "out.csv").read_text() == formats.render_csv(TABLE)


def test_numbers_for_people_keep_four_significant_digits() -> None:
    assert [formats.number(v) for v in (21.642, 11.1365, 0.5, 8.64828, 1234.56, 12345.6, -4523.19, 2.5e-7)] == \
        ["21.64", "11.14", "0.5", "8.648", "1235", "12346", "-4523", "2.5e-07"]
    assert formats.number(math.nan) == "nan" and formats.number(-math.inf) == "-inf"


def test_a_wide_table_wraps_into_blocks_that_fit_each_repeating_its_keys() -> None:
    table = pa.table({"run_id": ["a-very-long-run-name-20261204", "b"], **{f"column_{i:02d}": [1.5, 2.25]
                                                                          for i in range(12)}})
    lines = formats.render_table(table, width=60, keys=["run_id"]).splitlines()
    assert max(map(len, lines)) <= 60 and lines[-1] == "(2 rows)"
    headers = [line.split() for i, line in enumerate(lines) if i == 0 or (i and lines[i - 1] == "")]
    assert len(headers) > 1 and all(h[0] == "run_id" for h in headers)
    assert [c for h in headers for c in h[1:]] == table.column_names[1:]  # every column once, in order
    assert formats.render_table(table).count("\n") == 5  # no width: one line per row


def test_a_column_too_wide_even_alone_is_cut_to_fit() -> None:
    table = pa.table({"k": ["x"], "text": ["y" * 39]})
    lines = formats.render_table(table, width=30, keys=["k"]).splitlines()
    assert max(map(len, lines)) <= 30 and lines[2].endswith("…")
