"""Episode ids without coordination: a writer's ids are its token and a counter, unique and positive, and a
new token is drawn when the counter runs out."""

from __future__ import annotations

import numpy as np

from trajstore.write.episode_ids import COUNTER_BITS, TOKEN_BITS, EpisodeIds


def test_ids_are_the_token_and_a_counter() -> None:
    ids = EpisodeIds(token=5)
    first, second = ids(3), ids(2)
    assert (first == (5 << COUNTER_BITS) + np.arange(3)).all()
    assert (second == (5 << COUNTER_BITS) + np.arange(3, 5)).all()
    assert ids(0).shape == (0,)


def test_a_new_token_when_the_counter_runs_out() -> None:
    ids = EpisodeIds(token=1)
    ids._next = (1 << COUNTER_BITS) - 2  # two ids left under this token
    out = ids(5)
    assert len(np.unique(out)) == 5
    assert (out[:2] >> COUNTER_BITS == 1).all()
    new_token = out[2] >> COUNTER_BITS
    assert new_token != 1 and (out[2:] == (new_token << COUNTER_BITS) + np.arange(3)).all()


def test_ids_are_positive_int64_and_writers_differ() -> None:
    a, b = EpisodeIds(), EpisodeIds()
    ids = np.concatenate([a(1000), b(1000)])
    assert ids.dtype == np.int64 and (ids >= 0).all() and (ids < 2 ** (TOKEN_BITS + COUNTER_BITS)).all()
    assert len(np.unique(ids)) == 2000
