"""Resume states given by a caller: what is not a state is an InputError naming ``resume`` with a bounded
message, however large or deeply nested (the JSON decoder's RecursionError included); loaders over a version
with no steps."""

from __future__ import annotations

import json

import numpy as np
import pytest

import trajstore
from tests.helpers import make_batch
from trajstore.errors import InputError
from trajstore.query.order import parse_state, resume_position

STATE = {"kind": "sequences", "digest": "d" * 32, "epoch": 0, "position": 3}


def deep(levels: int) -> list:
    value: list = []
    for _ in range(levels):
        value = [value]
    return value


def position(state: object) -> int:
    return resume_position(state, kind="sequences", digest_="d" * 32, epoch=0, total=10)  # type: ignore[arg-type]


def test_a_state_round_trips_through_its_json() -> None:
    assert position(parse_state(json.dumps(STATE))) == 3
    assert position({**STATE, "position": np.int64(4)}) == 4


@pytest.mark.parametrize("text", ["[" * 100_000, "[" * 5000 + "]" * 5000, "{" * 3000, "nope", "[]", "7",
                                  "1" * 5000, ""])
def test_text_that_is_not_a_state_is_refused(text: str) -> None:
    with pytest.raises(InputError, match="resume: expected the JSON of an iterator's state_dict") as info:
        parse_state(text)
    assert len(str(info.value)) < 300


@pytest.mark.parametrize("state,message", [
    ({"position": 3}, "resume: expected the dict"),
    (deep(50_000), "resume: expected the dict"),
    ({**STATE, "kind": deep(50_000)}, "resume: kind and digest must be strings"),
    ({**STATE, "digest": {"a": deep(50_000)}}, "resume: kind and digest must be strings"),
    ({**STATE, "epoch": np.zeros(3)}, "resume: kind and digest must be strings and epoch an integer"),
    ({**STATE, "epoch": 10**5000}, "resume: a state of epoch"),
    ({**STATE, "kind": "x" * 100_000}, r"resume: a state of store\.x+\.\.\.x+\(\.\.\.\), not of store\.sequences"),
    ({**STATE, "position": 11}, r"resume: position must be in \[0, 10\]"),
    ({**STATE, "position": deep(50_000)}, r"resume: position must be in \[0, 10\], got \[+\.\.\.\]+$"),
    ({**STATE, "position": True}, r"resume: position must be in \[0, 10\]"),
])
def test_a_bad_state_is_named_with_a_bounded_message(state: object, message: str) -> None:
    with pytest.raises(InputError, match=message) as info:
        position(state)
    assert len(str(info.value)) < 400


def test_loaders_over_a_version_without_steps_refuse_or_yield_nothing(store: trajstore.Store) -> None:
    with store.writer(run_id="a", env_id="E") as w:
        w.add_batch(make_batch(np.random.default_rng(0), 4, 2))
    empty = trajstore.open(store.uri, version=0)  # the store's creation: no file, no column
    assert list(empty.sequences(2)) == []
    with pytest.raises(InputError, match="gamma: 'return_to_go' is computed from the steps' reward, which these "
                                         "steps do not have"):
        empty.sequences(2, gamma=0.0)
    with pytest.raises(InputError, match="columns: n-step transitions need"):
        empty.transitions(1, gamma=0.5)
