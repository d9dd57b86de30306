"""The REST service's ``where=``, parsed and rendered by trajstore (trajstore/query/condition.py): what it selects
is what the same condition means in Python (random trees through hypothesis, and the forms users write), and
everything else — subqueries, table functions, casts, a second statement, comments, unknown functions — is
refused by name before any SQL runs."""

from __future__ import annotations

import operator
import re
from typing import Any, Callable

import duckdb
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trajstore.errors import InputError
from trajstore.query.condition import FUNCTIONS, MAX_DEPTH, parse

ROWS = [
    {"run_id": "ppo-0", "env_id": "CartPole-v1", "episode_return": 21.0, "episode_length": 21, "complete": True},
    {"run_id": "ppo-1", "env_id": "CartPole-v1", "episode_return": 500.0, "episode_length": 500, "complete": True},
    {"run_id": "dqn-0", "env_id": "Acrobot-v1", "episode_return": -500.0, "episode_length": 500, "complete": False},
    {"run_id": "it's", "env_id": "Acrobot-v1", "episode_return": -62.5, "episode_length": 63, "complete": True},
    {"run_id": "dqn-2", "env_id": None, "episode_return": 0.0, "episode_length": 1, "complete": True},
]


def selected(text: str) -> list[int]:
    """The indexes of ``ROWS`` the parsed ``text`` selects, as DuckDB runs trajstore's rendering of it."""
    con = duckdb.connect()
    con.register("episodes", pa.Table.from_pylist([{**r, "i": i} for i, r in enumerate(ROWS)]))
    return [r[0] for r in con.execute(f"SELECT i FROM episodes WHERE {parse(text).sql} ORDER BY i").fetchall()]


def chosen(keep: Callable[[dict[str, Any]], bool]) -> list[int]:
    return [i for i, row in enumerate(ROWS) if keep(row)]


@pytest.mark.parametrize("text, keep", [
    ("episode_return > 100", lambda r: r["episode_return"] > 100),
    ("env_id = 'CartPole-v1' AND episode_length >= 21", lambda r: r["env_id"] == "CartPole-v1"),
    ("run_id = 'it''s'", lambda r: r["run_id"] == "it's"),
    ("run_id IN ('ppo-0', 'dqn-0')", lambda r: r["run_id"] in ("ppo-0", "dqn-0")),
    ("run_id NOT IN ('ppo-0', 'dqn-0')", lambda r: r["run_id"] not in ("ppo-0", "dqn-0")),
    ("episode_length BETWEEN 21 AND 63", lambda r: 21 <= r["episode_length"] <= 63),
    ("episode_length NOT BETWEEN 21 AND 63", lambda r: not 21 <= r["episode_length"] <= 63),
    ("env_id IS NULL", lambda r: r["env_id"] is None),
    ("env_id IS NOT NULL AND NOT complete", lambda r: r["env_id"] is not None and not r["complete"]),
    ("run_id LIKE 'dqn%'", lambda r: r["run_id"].startswith("dqn")),
    ("run_id ILIKE 'PPO%'", lambda r: r["run_id"].startswith("ppo")),
    ("starts_with(run_id, 'ppo') OR abs(episode_return) < 1", lambda r: r["run_id"].startswith("ppo")
     or abs(r["episode_return"]) < 1),
    ("episode_return / episode_length = 1", lambda r: r["episode_return"] / r["episode_length"] == 1),
    ("-episode_return > 100", lambda r: -r["episode_return"] > 100),
    ("complete AND episode_length > 100 OR episode_return < -100", lambda r: r["complete"] and
     r["episode_length"] > 100 or r["episode_return"] < -100),
    ('"episode_return" >= 0 and "complete"', lambda r: r["episode_return"] >= 0 and r["complete"]),
    ("round(episode_return / 10) = -6", lambda r: round(r["episode_return"] / 10) == -6),
    ("lower(env_id) = 'cartpole-v1'", lambda r: (r["env_id"] or "").lower() == "cartpole-v1"),
])
def test_a_parsed_condition_selects_what_it_means(text: str, keep: Callable[[dict[str, Any]], bool]) -> None:
    assert selected(text) == chosen(keep)


COMPARE = {"=": operator.eq, "<>": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt,
           ">=": operator.ge}


@st.composite
def numbers(draw: st.DrawFn, depth: int = 0) -> tuple[str, Any]:
    """A numeric expression over ``episode_length`` as text, and its value for a row (a function)."""
    if depth > 1 or draw(st.booleans()):
        if draw(st.booleans()):
            return "episode_length", lambda r: r["episode_length"]
        n = draw(st.integers(-600, 600))
        return str(n), lambda r: n
    (a, fa), (b, fb) = draw(numbers(depth + 1)), draw(numbers(depth + 1))
    op = draw(st.sampled_from(["+", "-", "*"]))
    fn = {"+": operator.add, "-": operator.sub, "*": operator.mul}[op]
    return f"({a} {op} {b})", lambda r: fn(fa(r), fb(r))


@st.composite
def conditions(draw: st.DrawFn, depth: int = 0) -> tuple[str, Any]:
    """A condition as text (with SQL's precedence of NOT over AND over OR, parenthesised only sometimes) and what it
    means for a row."""
    if depth > 2 or draw(st.integers(0, 2)) == 0:
        (a, fa), (b, fb) = draw(numbers()), draw(numbers())
        op = draw(st.sampled_from(sorted(COMPARE)))
        return f"{a} {op} {b}", lambda r: COMPARE[op](fa(r), fb(r))
    kind = draw(st.sampled_from(["AND", "OR", "NOT"]))
    if kind == "NOT":
        a, fa = draw(conditions(depth + 1))
        return f"NOT ({a})", lambda r: not fa(r)
    (a, fa), (b, fb) = draw(conditions(depth + 1)), draw(conditions(depth + 1))
    if kind == "AND":
        return f"({a}) AND ({b})", lambda r: fa(r) and fb(r)
    return f"{a} OR {b}", lambda r: fa(r) or fb(r)  # OR binds loosest: no parentheses needed


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(conditions())
def test_random_conditions_select_as_python_evaluates_them(case: tuple[str, Any]) -> None:
    text, keep = case
    assert selected(text) == chosen(keep), text


@pytest.mark.parametrize("text, message", [
    ("CAST((SELECT content FROM read_text('/etc/passwd')) AS INTEGER)=1", "unexpected 'CAST'"),
    ("(SELECT 1) = 1", "unexpected 'SELECT'"),
    ("getenv('TRAJSTORE_API_KEY') = 'x'", "unknown function 'getenv'"),
    ("read_text('/etc/passwd') IS NOT NULL", "unknown function 'read_text'"),
    ("1=1) OR (1=1", "unexpected ')' at character 4"),
    ("1=1; SET GLOBAL memory_limit='1MB'", "unexpected ';'"),
    ("episode_return > 0 -- comment", "unexpected '--'"),
    ("episode_return > 0 /* comment */", "unexpected '/*'"),
    ("episodes.episode_return > 0", "unexpected '.'"),
    ("episode_return::INTEGER > 0", "unexpected ':'"),
    ("run_id = \"\"", "unexpected '\"'"),
    ("run_id IN (SELECT run_id FROM steps)", "expected a column, a number or a 'string'"),
    ("run_id IN (run_id)", "expected a column, a number or a 'string'"),
    ("abs(1, 2) > 0", "abs() takes 1 argument(s), got 2"),
    ("episode_return > 1e400", "1e400 is not a finite number"),
    ("episode_return > " + "9" * 5000, "is not a finite number"),
    ("", "empty; give a condition"),
    ("x" * 10_001, "at most 10,000 characters"),
    ("(" * (MAX_DEPTH + 1) + "1=1" + ")" * (MAX_DEPTH + 1), f"nested more than {MAX_DEPTH} deep"),
    ("NOT " * 1000 + "complete", f"nested more than {MAX_DEPTH} deep"),
    ("- " * 1000 + "1 = 1", f"nested more than {MAX_DEPTH} deep"),
    ("episode_return > 0 AND", "unexpected the end"),
    ("run_id = 'unterminated", "unexpected \"'\""),
    ("env_id IS 'x'", "expected NULL after IS"),
])
def test_what_is_not_a_condition_is_refused_naming_where(text: str, message: str) -> None:
    with pytest.raises(InputError, match="^where: .*" + re.escape(message)):
        parse(text)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["episode_return", "run_id", "'a'", "1", "(", ")", "AND", "OR", "NOT", "=", ">",
                                 ",", "IN", "SELECT", "read_text", "COPY", ";", "abs", "--", "'x'')", "\"q\"", "-",
                                 "IS", "NULL", "BETWEEN", "LIKE", "*", "/*"]), max_size=14))
def test_any_text_is_refused_or_renders_only_quoted_names_literals_and_known_functions(words: list[str]) -> None:
    text = " ".join(words)
    try:
        found = parse(text)
    except InputError as exc:
        assert str(exc).startswith("where: ")
        return
    bare = re.sub(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"", " ", found.sql)  # names and strings out: what is left
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", bare))
    assert words <= {"AND", "OR", "NOT", "IN", "IS", "NULL", "BETWEEN", "LIKE", "ILIKE", "true", "false", "BIGINT",
                     "DOUBLE", *FUNCTIONS}, (text, found.sql)
    assert set(re.sub(r"[A-Za-z0-9_.\s]", "", bare)) <= set("()<>=+-*/%,:"), (text, found.sql)
    assert "::" not in bare.replace("::BIGINT", "").replace("::DOUBLE", "")
