"""A replay held open by a service, used as a local :class:`~trajstore.loaders.replay.Replay` is
(``Client.replay``): ``sample``, ``update``, ``commit``, ``close``, ``len``.

Batches come as Arrow IPC (``GET /replays/{id}/sample``) and are read back into the local replay's arrays (the same
names, dtypes and shapes); updates go as authenticated POSTs of an Arrow IPC body (``index``, ``priority``). Every
learner that opens a replay of the same ``priorities`` name on one service resumes from the priorities committed
under it; learners that should share one replay's trees share its id (:attr:`RemoteReplay.replay_id`, or
``Client.replay(replay_id=...)``).
"""

from __future__ import annotations

from typing import Any, Protocol

import pyarrow as pa

from trajstore.errors import ReplayClosedError
from trajstore.loaders.loader import convert, from_arrow
from trajstore.loaders.replay import checked_updates
from trajstore.remote.wire import ARROW_STREAM, ipc_bytes


class Requests(Protocol):
    """What a remote replay sends its requests through (a :class:`~trajstore.remote.client.Client`; named here
    rather than imported, as the client imports this module)."""

    def _request(self, method: str, path: str, **kwargs: Any) -> Any: ...


class RemoteReplay:
    """A service's replay of id ``replay_id`` (see the module); ``described`` is what the service said of it."""

    def __init__(self, client: Requests, described: dict[str, Any], format: str = "numpy") -> None:  # noqa: A002
        self._client, self.replay_id, self._format = client, str(described["replay_id"]), format
        self.described = described
        self.name: str | None = described.get("priorities")
        self.version: int | None = described.get("version")
        self._closed = False

    @property
    def _path(self) -> str:
        return f"/replays/{self.replay_id}"

    def __len__(self) -> int:
        """The items the replay holds."""
        return int(self.describe()["items"])

    def describe(self) -> dict[str, Any]:
        """What the replay is and holds, as the service says."""
        self._open()
        return self._client._request("GET", self._path).json()

    def sample(self, batch_size: int) -> Any:
        """A batch of ``batch_size`` items drawn with replacement in proportion to their priorities: what
        :meth:`Replay.sample <trajstore.loaders.replay.Replay.sample>` gives."""
        self._open()
        response = self._client._request("GET", f"{self._path}/sample", params={"batch_size": batch_size},
                                         headers={"Accept": ARROW_STREAM})
        batches = pa.ipc.open_stream(response.content).read_all().to_batches()
        return convert(from_arrow(batches[0]), self._format)

    def update(self, index: Any, priority: Any) -> None:
        """Give the items of handles ``index`` their ``priority`` (checked here as the local replay checks them, and
        again by the service)."""
        self._open()
        handles, given = checked_updates(index, priority)
        body = ipc_bytes(pa.table({"index": handles, "priority": given}))
        self._client._request("POST", f"{self._path}/update", content=body,
                              headers={"Content-Type": ARROW_STREAM})

    def commit(self) -> int | None:
        """Commit the updates given so far (by every learner of this replay) to the store's ``priorities`` table;
        the version they landed as."""
        self._open()
        self.version = self._client._request("POST", f"{self._path}/commit").json()["version"]
        return self.version

    def close(self) -> None:
        """Commit what is pending and close the replay on the service (for every learner sharing it). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.version = self._client._request("DELETE", self._path).json()["version"]

    def __enter__(self) -> RemoteReplay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _open(self) -> None:
        if self._closed:
            raise ReplayClosedError("replay: closed; open a new one with client.replay(...) (it resumes from the "
                                    "priorities committed)")
