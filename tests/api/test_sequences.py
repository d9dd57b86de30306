"""GET /sequences and GET /transitions: Client.iter_sequences / Client.transitions give exactly the batches of the
local Store.sequences / Store.transitions on the served store, resume through REST, and bad input is 422."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

import trajstore
from tests.api.helpers import Live
from trajstore.errors import RemoteError


def same(remote: list[dict[str, Any]], local: list[dict[str, Any]]) -> None:
    assert len(remote) == len(local) > 0
    for r, want in zip(remote, local):
        assert list(r) == list(want)
        for k in r:
            assert r[k].shape == want[k].shape and r[k].dtype == want[k].dtype, k
            np.testing.assert_array_equal(r[k], want[k], err_msg=k)


@pytest.mark.server
@pytest.mark.parametrize("kwargs", [
    dict(length=16, pad=True, gamma=0.99, shuffle=True, seed=3, epoch=1, batch_size=32, run_id="beta"),
    dict(length=8, stride=4, rank=1, world_size=2, columns=["obs", "action"], batch_size=50, env_id="CartPole-v1"),
    dict(length=4, weight_by="episode_return", num_samples=300, seed=1, batch_size=64, run_id="beta"),
])
def test_iter_sequences_are_the_local_batches(live: Live, populated: Path, kwargs: dict[str, Any]) -> None:
    store = trajstore.open(populated)
    local_kwargs = {k: v for k, v in kwargs.items() if k != "env_id"}
    if "env_id" in kwargs:
        local_kwargs["filter"] = trajstore.EpisodeFilter(env_id=[kwargs["env_id"]])
    local = list(store.sequences(**local_kwargs))
    with trajstore.Client(live.url) as client:
        remote = list(client.sequences(**kwargs))
    same(remote, local)


@pytest.mark.server
def test_transitions_are_the_local_batches_and_resume(live: Live, populated: Path) -> None:
    store = trajstore.open(populated)
    args = dict(gamma=0.9, shuffle=True, seed=2, batch_size=200, run_id="beta")
    local = list(store.transitions(3, **args))
    with trajstore.Client(live.url) as client:
        it = client.transitions(3, **args)
        head = [next(it) for _ in range(2)]
        state = it.state_dict()
        it.close()
        assert state["position"] == 400 and state["kind"] == "transitions"
        rest = list(client.transitions(3, resume=state, **args))
        same(head + rest, local)
        local_state = (lambda it: (next(it), next(it), it.state_dict())[-1])(store.transitions(3, **args))
        assert local_state == state  # the same selection, the same state: resumable on either side
        with pytest.raises(RemoteError, match="422.*resume: the state was made with other arguments"):
            client.transitions(3, resume=state, **{**args, "seed": 5})


@pytest.mark.server
def test_arrow_format_streams_the_arrow_batches(live: Live, populated: Path) -> None:
    store = trajstore.open(populated)
    local = next(store.sequences(8, batch_size=10, run_id="beta", format="arrow"))
    with trajstore.Client(live.url) as client:
        remote = next(client.sequences(8, batch_size=10, run_id="beta", format="arrow"))
    assert remote.equals(local)


@pytest.mark.parametrize("query,field", [
    ("/sequences?length=0", "length"),
    ("/sequences?length=4&stride=0", "stride"),
    ("/sequences?length=4&gamma=1.5", "gamma"),
    ("/sequences?length=4&rank=2&world_size=2", "rank"),
    ("/sequences?length=4&columns=nope", "columns"),
    ("/sequences?length=4&resume=%7Bbad", "resume"),
    ("/transitions?n=2", "gamma"),
    ("/transitions?n=2&gamma=0.9&columns=return_to_go", "columns"),
])
def test_bad_input_is_422_naming_the_field(client: TestClient, query: str, field: str) -> None:
    response = client.get(query)
    assert response.status_code == 422, response.text
    assert field in response.text
