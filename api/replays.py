"""The replays a service holds open for remote learners (``POST /replays``, :mod:`trajstore.api.routes.replays`).

Each is a :class:`~trajstore.loaders.replay.Replay` of the service's store, known by a random id (128 bits: a
learner that does not hold it cannot sample or update another's replay, beyond holding the API key), shared by every
learner that has the id. A replay is closed (its updates committed to the ``priorities`` table, its layout unmapped)
by ``DELETE /replays/{id}``, or once unused for ``replay_idle_s`` (looked for at each request to a replay); a new one
of the same ``priorities`` name resumes from what was committed.

Budgets: at most ``replay_max_open`` replays at once (429 with ``Retry-After`` beyond) and ``replay_memory_bytes``
for the trees and slots of all of them together (413 beyond, the replay that would pass it closed at once: its memory
is known once its items are); a replay is made while holding one of the places ``/sequences`` streams take.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from trajstore.api.settings import ServiceSettings
from trajstore.errors import QueryBusyError, QueryMemoryError, ReplayNotFoundError, size_text
from trajstore.loaders.replay import Replay
from trajstore.settings import PREFIX

log = logging.getLogger(__name__)

RETRY_AFTER_S = 5  # a learner refused for want of a place asks again after this (an idle replay may close)


@dataclass
class Held:
    """An open replay and when it was last used (``time.monotonic()``)."""

    replay: Replay
    used: float = field(default_factory=time.monotonic)


class Replays:
    """The service's open replays (see the module)."""

    def __init__(self, settings: ServiceSettings) -> None:
        self.max_open, self.memory_bytes = settings.replay_max_open, settings.replay_memory_bytes
        self.idle_s = settings.replay_idle_s
        self._held: dict[str, Held] = {}
        self._lock = threading.Lock()

    def open(self, make: Callable[[], Replay]) -> tuple[str, Replay]:
        """A new replay (``make`` makes it) and its id; refused when ``replay_max_open`` are open, or when its
        trees would pass ``replay_memory_bytes`` with the others'."""
        self.expire()
        with self._lock:
            if len(self._held) >= self.max_open:
                raise QueryBusyError(f"replay: {len(self._held)} replays are open on this service, its limit "
                                     f"({PREFIX}REPLAY_MAX_OPEN); close one (DELETE /replays/{{id}}) or wait for an "
                                     f"idle one to close ({PREFIX}REPLAY_IDLE_S)", retry_after_s=RETRY_AFTER_S)
        replay = make()
        with self._lock:
            held = sum(h.replay.nbytes for h in self._held.values())
            if held + replay.nbytes > self.memory_bytes or len(self._held) >= self.max_open:
                full, items = len(self._held) >= self.max_open, replay.describe()["items"]
                replay.close()
                if full:
                    raise QueryBusyError(f"replay: {self.max_open} replays are open on this service, its limit "
                                         f"({PREFIX}REPLAY_MAX_OPEN)", retry_after_s=RETRY_AFTER_S)
                raise QueryMemoryError(f"replay: its {items} items would take {size_text(replay.nbytes)} of "
                                       f"trees and slots, with the {size_text(held)} of the open replays over the "
                                       f"limit of {size_text(self.memory_bytes)} ({PREFIX}REPLAY_MEMORY_BYTES); "
                                       "select fewer episodes or give a capacity")
            key = secrets.token_hex(16)
            self._held[key] = Held(replay)
        return key, replay

    def get(self, key: str) -> Replay:
        """The open replay of id ``key`` (marked used); :class:`ReplayNotFoundError` for any other."""
        self.expire()
        with self._lock:
            held = self._held.get(key)
            if held is None:
                raise ReplayNotFoundError(f"replay_id: no open replay {key!r} on this service (never opened, closed, "
                                          f"or closed after {self.idle_s:g} s unused); open one with POST /replays "
                                          "(a replay of the same priorities name resumes from its committed "
                                          "priorities)")
            held.used = time.monotonic()
            return held.replay

    def close(self, key: str) -> Replay:
        """Close the replay of id ``key`` (its updates committed) and forget it."""
        replay = self.get(key)
        with self._lock:
            self._held.pop(key, None)
        replay.close()
        return replay

    def expire(self) -> None:
        """Close the replays unused for ``replay_idle_s``."""
        now = time.monotonic()
        with self._lock:
            idle = [k for k, h in self._held.items() if now - h.used > self.idle_s]
            gone = [self._held.pop(k).replay for k in idle]
        for replay in gone:
            try:
                replay.close()
            except Exception:  # a failed commit of an idle replay must not fail another request
                log.exception("closing an idle replay (%r) failed; its uncommitted updates are lost", replay.name)

    def close_all(self) -> None:
        """Close every replay (the service stopping): their updates committed."""
        with self._lock:
            gone = [h.replay for h in self._held.values()]
            self._held.clear()
        for replay in gone:
            try:
                replay.close()
            except Exception:  # every replay closed, whatever one of them raises
                log.exception("closing a replay (%r) failed; its uncommitted updates are lost", replay.name)

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)
