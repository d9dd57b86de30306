"""JSON rows written in small pieces: the same JSON as FastAPI writes of the response model (the plain
reference below), with every piece made from a bounded amount of data, large values included."""

from __future__ import annotations

import json

import duckdb
import pytest
from fastapi.encoders import jsonable_encoder

from trajstore.api import json_body
from trajstore.api.routes.sql import SqlResult
from trajstore.errors import QueryError
from trajstore.remote.wire import json_rows

QUERIES = [
    "SELECT 1.5::DECIMAL(4, 2) AS d, 'nan'::DOUBLE AS n, 'inf'::FLOAT AS f, TIMESTAMPTZ '2024-01-02 03:04:05+00' AS t, "
    "DATE '2024-01-02' AS dt, INTERVAL 3 SECOND AS iv, 'ab'::BLOB AS b, {'a': 1, 'b': [1.5, NULL]} AS s, "
    "MAP {'k': 2} AS m, [[1, 2], [3]] AS ll, NULL AS nothing, 0.1::FLOAT AS f32, 'x'::ENUM('x', 'y') AS e, "
    "TIME '12:00:00' AS tm, 12345678901234567890::HUGEINT AS h",
    # one row of large values: a list of 300k floats, a 600 kB string of multi-byte characters, a large struct
    "SELECT list(i::FLOAT / 7) AS big, 'é' || repeat('ü€😀', 50000) AS text, "
    "{'inner': list(i), 'x': repeat('a', 200000), 'nested': [list(i)]} AS st FROM range(300000) t(i)",
    "SELECT i, i::VARCHAR AS s, CASE WHEN i % 1000 = 0 THEN repeat('w', 100000) END AS sometimes "
    "FROM range(50000) t(i)",
    "SELECT * FROM range(0) t(i)",
    # integers a double does not hold (trajstore/api/ints.py): in columns, structs, maps, and one large list
    "SELECT i AS episode_id, i + 9007199254740990 AS near, -i - 9007199254740990 AS low, "
    "i::UBIGINT + 18446744073709551000::UBIGINT AS u, {'x': i + 4611686018427387904} AS st, "
    "MAP {i + 4611686018427387904: 1} AS m FROM range(5) t(i)",
    "SELECT list(i + 4611686018427387904) AS big FROM range(300000) t(i)",
]


def reference(table) -> list:  # what the route answered before: the model serialized by FastAPI
    return jsonable_encoder(SqlResult(columns=table.column_names, rows=json_rows(table), truncated=False))["rows"]


@pytest.mark.parametrize("query", QUERIES)
def test_the_same_json_as_the_response_model_in_bounded_pieces(query: str) -> None:
    table = duckdb.connect().sql(query).to_arrow_table()
    pieces = list(json_body.rows(table))
    assert json.loads(b"[" + b"".join(pieces) + b"]") == reference(table)
    # a piece is made from at most PIECE_BYTES of data: as JSON a few times that (floats, escapes), never a whole
    # large value
    assert max(map(len, pieces), default=0) <= 6 * json_body.PIECE_BYTES


def test_a_value_json_cannot_hold_is_a_query_error() -> None:
    table = duckdb.connect().sql("SELECT '\\xff'::BLOB AS b").to_arrow_table()
    with pytest.raises(QueryError, match="cannot be written as JSON.*ask for Arrow"):
        list(json_body.rows(table))


def test_ids_and_integers_past_two_to_the_53_are_decimal_strings() -> None:
    table = duckdb.connect().sql(QUERIES[-2]).to_arrow_table()
    rows = json.loads(b"[" + b"".join(json_body.rows(table)) + b"]")
    assert [r["episode_id"] for r in rows] == ["0", "1", "2", "3", "4"]  # always, whatever the value
    assert [r["near"] for r in rows] == [2**53 - 2, 2**53 - 1, "9007199254740992", "9007199254740993",
                                         "9007199254740994"]  # a number while a double holds it exactly
    assert [r["low"] for r in rows][1:3] == [-(2**53 - 1), str(-(2**53))]
    assert rows[0]["u"] == str(18446744073709551000) and rows[0]["st"] == {"x": str(2**62)}
    assert rows[1]["m"] == [[str(2**62 + 1), 1]]
    big = json.loads(b"[" + b"".join(json_body.rows(duckdb.connect().sql(QUERIES[-1]).to_arrow_table())) + b"]")
    assert big[0]["big"][:2] == [str(2**62), str(2**62 + 1)] and len(big[0]["big"]) == 300_000
