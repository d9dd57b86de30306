"""No request text reaches SQL outside the sandbox (issue 47, item 1): the probe's escapes — file reads,
``getenv``, ``COPY … TO``, ``SET GLOBAL``, ``ATTACH``, a parenthesis closed early — sent on every route that takes
text, as the five ``where=`` routes were attacked. Each is a 4xx whose body holds no file content and no secret, no
file is written anywhere, no setting of the server's DuckDB changes (its queries still answer), the store is intact.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator
from urllib.parse import quote

import httpx
import pytest

from tests.api.helpers import API_KEY
from tests.security.conftest import CANARY, SECRET, get
from tests.served import Server

pytestmark = [pytest.mark.server, pytest.mark.security]

WHERE_ROUTES = ["/compare", "/compare/scores", "/compare/improvement", "/compare/profile", "/curves/groups"]
ROUTE_PARAMS = {"/compare/improvement": {"x": "ppo", "y": "dqn"}, "/compare/profile": {"threshold": "10"}}
PASSWD_LINE = "root:x:0:0"


def escapes(target: Path) -> list[str]:
    """The probe's texts, each an attempt to read a file or the environment, write ``target``, or change a
    setting of the process's DuckDB."""
    canary = target.parent / CANARY
    return [
        "CAST((SELECT content FROM read_text('/etc/passwd')) AS INTEGER)=1",
        "CAST((SELECT content FROM read_text('/proc/self/environ')) AS INTEGER)=1",
        f"CAST((SELECT content FROM read_text('{canary}')) AS INTEGER)=1",
        "getenv('TRAJSTORE_API_KEY') = 'x'",
        f"1=1) OR (1=1)); COPY (SELECT 42) TO '{target}'; SELECT ((1",
        f"1=1) AND (SELECT 1 FROM (COPY (SELECT 42) TO '{target}')) --",
        "1=1)) UNION ALL SELECT 42 FROM read_text('/etc/passwd') --",
        "1=1); SET GLOBAL memory_limit='1MB'; SELECT (1",
        f"1=1); ATTACH '{target}.db' AS x; SELECT (1",
        "1=1) OR (1=1",
        "'\"; DROP VIEW episodes; --",
        "episode_return > 0 /* comment */",
    ]


@pytest.fixture
def target(server: Server, probed: Path) -> Iterator[Path]:
    """Where an escape would write: beside the store, in a folder the server can write."""
    path = probed.parent / "written-by-a-request.csv"
    yield path
    assert not path.exists(), "a request wrote a file"
    assert not Path(f"{path}.db").exists(), "a request attached (and so created) a database file"


def refused_cleanly(answer: httpx.Response) -> None:
    """A 4xx problem document that leaks nothing."""
    assert 400 <= answer.status_code < 500, (answer.status_code, answer.text[:500])
    body = answer.text
    for secret in (PASSWD_LINE, API_KEY, SECRET):
        assert secret not in body, f"the answer holds {secret!r}: {body[:500]}"


def still_serving(server: Server) -> None:
    """The server's own DuckDB still answers as before: no setting of it was changed."""
    assert get(server, "/stats").status_code == 200
    answer = get(server, "/compare", by="config.algo", last=3, reps=50)
    assert answer.status_code == 200, answer.text[:500]


@pytest.mark.usefixtures("intact")
@pytest.mark.parametrize("route", WHERE_ROUTES)
def test_the_probes_where_escapes_are_refused_on_every_comparison_route(server: Server, target: Path,
                                                                       route: str) -> None:
    for text in escapes(target):
        answer = get(server, route, by="config.algo", where=text, **ROUTE_PARAMS.get(route, {}))
        refused_cleanly(answer)
        assert "where" in answer.json()["detail"], answer.text
    still_serving(server)


@pytest.mark.parametrize("route", WHERE_ROUTES)
def test_a_condition_over_episodes_still_selects_on_every_comparison_route(server: Server, route: str) -> None:
    base = {"by": "config.algo", **ROUTE_PARAMS.get(route, {}), "reps": 50, "last": 3}
    one_task = get(server, route, **base, where="env_id = 'CartPole-v1' AND episode_length >= 1")
    assert one_task.status_code == 200, one_task.text[:500]
    if route == "/compare/scores":
        assert {row["task"] for row in one_task.json()} == {"CartPole-v1"}
    unknown = get(server, route, **base, where="no_such_column > 1")
    assert unknown.status_code == 422 and "where: unknown column(s) ['no_such_column']" in unknown.json()["detail"]


def string_parameters(spec: dict[str, Any]) -> Iterator[tuple[str, str, str]]:
    """``(method, path, name)`` of every query and path parameter of the service that takes text."""
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            for parameter in operation.get("parameters", []):
                if parameter["in"] in ("query", "path") and _takes_text(parameter.get("schema", {})):
                    yield method, path, parameter["name"]


def _takes_text(schema: dict[str, Any]) -> bool:
    if "anyOf" in schema:
        return any(_takes_text(s) for s in schema["anyOf"])
    if schema.get("type") == "array":
        return _takes_text(schema.get("items", {}))
    return schema.get("type") == "string" and "enum" not in schema


@pytest.mark.usefixtures("intact")
def test_every_text_parameter_of_every_route_refuses_the_escapes_or_treats_them_as_values(server: Server,
                                                                                         target: Path) -> None:
    spec = httpx.get(server.url + "/openapi.json", timeout=30).json()
    found = list(string_parameters(spec))
    assert len(found) > 40 and ("get", "/compare", "where") in found  # the spec really was walked
    with httpx.Client(base_url=server.url, timeout=60) as http:
        for method, path, name in found:
            for text in escapes(target):
                url = path.replace("{" + name + "}", quote(text, safe=""))
                url = url.replace("{episode_id}", "1").replace("{run_id}", "ppo-0").replace("{version}", "1")
                params = {} if "{" + name + "}" in path else {name: text}
                answer = http.request(method.upper(), url, params=params, headers={"Authorization": "Bearer wrong"})
                assert answer.status_code < 500 or answer.status_code == 503, (method, path, name, answer.text[:300])
                for secret in (PASSWD_LINE, API_KEY, SECRET):
                    assert secret not in answer.text, (method, path, name, answer.text[:300])
    still_serving(server)
