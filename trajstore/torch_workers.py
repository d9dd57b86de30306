"""What a DataLoader worker of :mod:`trajstore.torch` runs — its shard of a store loader, resumed where a previous
run stopped — in its own process, or, where that process was forked, in a fresh helper process. No PyTorch here:
the helper imports only trajstore.

Why a helper: deltalake's tokio runtime panics ("Forked process detected") in a process forked after the parent
created it, and PyTorch's DataLoader forks its workers by default on Linux. A forked worker therefore never
touches the store itself: it starts ``python -c …`` (a new interpreter, not a fork; DataLoader workers are
daemonic and may not start ``multiprocessing`` children), which opens the store and hands it one batch at a time
over a pipe, the next one prepared while the worker uses the last. The helper lives as long as the worker (with
``persistent_workers=True``, across epochs, keeping its stores and their layouts); it exits when its pipe closes.

Resume arithmetic: with ``W`` workers, a DataLoader delivers its workers' batches round robin (in order, its
default); a worker's shard has at most one batch more than a later worker's. After the loop took ``n`` batches,
worker ``w`` had delivered ``min(own, n // W + (w < n % W))`` of its own, and worker ``n mod W`` gives the next
one: a resumed DataLoader's worker ``w`` serves the shard of worker ``(w + n) mod W``, so the batches come in
the very order the stopped run would have given them.
"""

from __future__ import annotations

import logging
import math
import pickle
import subprocess
import sys
from dataclasses import dataclass, field
from multiprocessing import util
from typing import IO, Any, Iterator, Mapping

import numpy as np

from trajstore import store as stores
from trajstore.errors import InputError, TrajstoreError

log = logging.getLogger(__name__)

DEFAULT_BATCH_SIZE = 256  # Store.sequences / Store.transitions


@dataclass(frozen=True)
class ShardSpec:
    """One worker's iteration: which store (at which version), which loader with which arguments, its shard of
    the epoch, and how many batches of this rank's epoch the training loop had already taken (``resume``)."""

    uri: str
    storage_options: Mapping[str, Any] | None
    version: int | None
    method: str
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    rank: int = 0
    world_size: int = 1
    worker: int = 0
    workers: int = 1
    epoch: int = 0
    resume_batches: int | None = None

    @property
    def shard(self) -> int:
        return self.rank * self.workers + self.worker

    @property
    def shards(self) -> int:
        return self.world_size * self.workers


class StoreCache:
    """The stores one process opened, by location and version (so a later epoch reuses their loader layouts)."""

    def __init__(self) -> None:
        self._stores: dict[tuple[Any, ...], stores.Store] = {}

    def get(self, spec: ShardSpec) -> stores.Store:
        key = (spec.uri, tuple(sorted((spec.storage_options or {}).items())), spec.version)
        if key not in self._stores:
            self._stores.clear()  # the layouts of another version are of no more use
            version = spec.version if spec.version is not None and spec.version >= 0 else None
            self._stores[key] = stores.open(spec.uri, storage_options=spec.storage_options or None,
                                               version=version)
        return self._stores[key]


def shard_batches(store: stores.Store, spec: ShardSpec) -> Any:
    """The store loader of ``spec``'s shard (numpy batches), started after the batches already delivered."""
    kwargs = {**spec.kwargs, "epoch": spec.epoch, "format": "numpy"}
    loader = getattr(store, spec.method)

    def make(rank: int, world_size: int, resume: Mapping[str, Any] | None = None) -> Any:
        return loader(*spec.args, rank=rank, world_size=world_size, resume=resume, **kwargs)

    if not spec.resume_batches:
        return make(spec.shard, spec.shards)
    with make(0, 1) as whole:
        total = whole.items  # items in this epoch's order over every shard
    with make(spec.shard, spec.shards) as probe:
        state = probe.state_dict()
    size = int(kwargs.get("batch_size", DEFAULT_BATCH_SIZE))
    own = delivered(total, size, spec, spec.resume_batches)
    return make(spec.shard, spec.shards, {**state, "position": min(own * size, probe.items)})


def delivered(total: int, batch_size: int, spec: ShardSpec, n: int) -> int:
    """How many of worker ``spec.worker``'s batches were among the first ``n`` its rank's DataLoader gave."""
    counts = [math.ceil(len(range(spec.rank * spec.workers + w, total, spec.shards)) / batch_size)
              for w in range(spec.workers)]
    if n > sum(counts):
        raise InputError(f"resume: {n} batches taken, but epoch {spec.epoch} of rank {spec.rank} has only "
                         f"{sum(counts)}; pass the state of a run over the same data and arguments")
    W, w = spec.workers, spec.worker
    return min(counts[w], n // W + (1 if w < n % W else 0))


# --- the helper process ---------------------------------------------------------------------------------------

BOOT = ("import pickle, sys; sys.path[:0] = pickle.load(sys.stdin.buffer); "
        "import trajstore.torch_workers as w; w.serve()")


class Helper:
    """A fresh Python process that serves shards of a store's loaders to the (forked) process that started it."""

    def __init__(self) -> None:
        self._proc = subprocess.Popen([sys.executable, "-c", BOOT], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._send(sys.path)
        # multiprocessing's children end through os._exit: its own finalizers, not atexit, run there
        util.Finalize(self, _stop, args=(self._proc,), exitpriority=10)

    def batches(self, spec: ShardSpec) -> Iterator[dict[str, np.ndarray]]:
        """The batches of ``spec``'s shard, as :func:`shard_batches` in the helper gives them."""
        self._send(("open", spec))
        try:
            while True:
                self._send(("next", None))
                kind, value = self._receive()
                if kind == "end":
                    return
                if kind == "error":
                    raise value
                yield value
        finally:
            if self._proc.poll() is None:
                self._send(("close", None))

    def _send(self, message: Any) -> None:
        assert self._proc.stdin is not None
        try:
            pickle.dump(message, self._proc.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            self._proc.stdin.flush()
        except BrokenPipeError:
            raise self._ended() from None

    def _receive(self) -> tuple[str, Any]:
        assert self._proc.stdout is not None
        try:
            return pickle.load(self._proc.stdout)  # type: ignore[no-any-return]
        except EOFError:
            raise self._ended() from None

    def _ended(self) -> TrajstoreError:
        code = self._proc.wait()
        return TrajstoreError(f"the process reading the store for this DataLoader worker ended (exit code {code}); "
                              "its error is above")

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.stdin is not None:
        proc.stdin.close()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


def serve(stdin: IO[bytes] | None = None, stdout: IO[bytes] | None = None) -> None:
    """The helper's loop: ``open`` a shard, then answer each ``next`` with one batch (``("batch", arrays)``,
    ``("end", None)`` or ``("error", exception)``), preparing the following one before the next request."""
    stdin = stdin or sys.stdin.buffer
    stdout = stdout or sys.stdout.buffer
    sys.stdout = sys.stderr  # whatever trajstore or a library prints must not go into the pipe
    stores = StoreCache()
    batches: Any = None
    pending: tuple[str, Any] = ("end", None)
    while True:
        try:
            command, argument = pickle.load(stdin)
        except EOFError:
            return
        if command == "open":
            _close(batches)
            try:
                batches = shard_batches(stores.get(argument), argument)
                pending = _next(batches)
            except Exception as exc:  # noqa: BLE001 - handed to the worker, which raises it
                batches, pending = None, ("error", _picklable(exc))
        elif command == "next":
            pickle.dump(pending, stdout, protocol=pickle.HIGHEST_PROTOCOL)
            stdout.flush()
            pending = _next(batches) if pending[0] == "batch" else ("end", None)
        elif command == "close":
            _close(batches)
            batches = None


def _next(batches: Any) -> tuple[str, Any]:
    try:
        return "batch", next(batches)
    except StopIteration:
        return "end", None
    except Exception as exc:  # noqa: BLE001 - handed to the worker, which raises it
        return "error", _picklable(exc)


def _close(batches: Any) -> None:
    if batches is not None:
        batches.close()


def _picklable(exc: Exception) -> Exception:
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001
        return TrajstoreError(f"{type(exc).__name__}: {exc}")
