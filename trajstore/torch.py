"""PyTorch datasets over a store (the ``[torch]`` extra): windows and n-step transitions as an
``IterableDataset`` of ready-made batches, sharded by ``DataLoader`` worker and by data-parallel rank; and
:class:`ReplayDataset`, the batches of a prioritized replay.

Worker ``w`` of ``W`` on rank ``r`` of ``R`` reads shard ``r·W + w`` of ``R·W`` of the epoch's order, so the
workers of all ranks together visit every window once per epoch. Batches are made inside the dataset: give
the ``DataLoader`` ``batch_size=None``.

- **A store or a path**: the first argument is a :class:`~trajstore.Store` or its URI (``storage_options`` for
  ``s3://``); only the URI, the options and a version travel to the workers, never an open store.
- **Versions**: every worker of an epoch reads the same committed version: the latest when the dataset was made
  or :meth:`~StoreDataset.set_epoch` was last called, or always the version of a store opened at one
  (``trajstore.open(uri, version=N)``: give every rank that one when the store is being written meanwhile).
- **Epochs**: :meth:`~StoreDataset.set_epoch` reaches the workers also with ``persistent_workers=True`` (the epoch
  lives in shared memory, not in the workers' copies of the dataset).
- **Any start method**: with ``spawn`` or ``forkserver`` the workers open the store themselves; with ``fork``
  (the default on Linux), where deltalake cannot run, each worker reads through a fresh helper process (see
  :mod:`trajstore.torch_workers`), kept across epochs with ``persistent_workers=True``.
- **Resume**: after the training loop took ``n`` batches of the current epoch from the ``DataLoader`` (on this
  rank), ``data.state_dict(batches=n)`` is a plain dict; a new dataset with the same arguments and
  ``resume=`` that dict, in a ``DataLoader`` with the same ``num_workers`` (delivering in order, its default) and
  on the same rank, continues that epoch with batch ``n + 1``, reading the same version; later epochs start
  from their beginning.

>>> from torch.utils.data import DataLoader                                   # doctest: +SKIP
>>> data = trajstore.torch.Sequences(store, 64, columns=["obs", "action", "reward"], shuffle=True)
>>> loader = DataLoader(data, batch_size=None, num_workers=2, persistent_workers=True)
>>> for epoch in range(10):
...     data.set_epoch(epoch)
...     for step, batch in enumerate(loader):
...         train_step(batch["obs"], batch["mask"])
...         checkpoint = {"data": data.state_dict(batches=step + 1), ...}   # resume=checkpoint["data"]
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import os
from typing import Any, Iterator, Mapping

import numpy as np

from trajstore import store as stores
from trajstore.errors import InputError
from trajstore.extras import needed
from trajstore.loaders.loader import convert
from trajstore.loaders.order import check_count, check_shard, digest
from trajstore.torch_workers import Helper, ShardSpec, StoreCache, shard_batches

with needed("torch", "trajstore.torch"):
    import torch.utils.data

EPOCH, VERSION, WORKERS = 0, 1, 2  # the slots of the shared state


class StoreDataset(torch.utils.data.IterableDataset):
    """A store loader (``method`` of :class:`~trajstore.Store`) as a dataset of batches; see the module."""

    method = ""

    def __init__(self, store: stores.Store | str | os.PathLike[str], *args: Any, rank: int = 0,
                 world_size: int = 1, epoch: int | None = None,
                 storage_options: Mapping[str, Any] | None = None,
                 resume: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        if "format" in kwargs:
            raise InputError("format: a torch dataset always gives torch tensors; leave format out")
        check_shard(rank, world_size)
        super().__init__()
        self.uri, self.storage_options, self._pinned = _location(store, storage_options)
        self.args, self.kwargs = args, kwargs
        self.rank, self.world_size = rank, world_size
        self._resume = self._check_resume(resume, epoch)
        start = self._resume["epoch"] if self._resume else epoch or 0
        check_count("epoch", start, minimum=0)
        # epoch, version and workers seen: shared with every worker, also persistent ones (no lock: one writer,
        # the main process, between epochs)
        self._shared = multiprocessing.RawArray("q", 3)
        self._shared[EPOCH], self._shared[WORKERS] = start, 0
        self._shared[VERSION] = self._resume["version"] if self._resume else self._version_now()
        self._local()

    def _local(self) -> None:
        """What each process keeps for itself: the stores it opened, its helper process, its process id."""
        self._pid = os.getpid()
        self._stores = StoreCache()
        self._helper: Helper | None = None
        self._main_store: stores.Store | None = None

    # --- epochs, versions and resume state ------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        return int(self._shared[EPOCH])

    @property
    def version(self) -> int:
        """The committed version the current epoch reads."""
        return int(self._shared[VERSION])

    def set_epoch(self, epoch: int) -> None:
        """The epoch of the next iteration (its shuffled order), read from the latest version (or the pinned
        one); call it before each epoch. Reaches every worker, persistent ones too."""
        check_count("epoch", epoch, minimum=0)
        if epoch != self.epoch:
            self._shared[VERSION] = self._version_now()
        self._shared[EPOCH] = epoch

    def state_dict(self, *, batches: int) -> dict[str, Any]:
        """Where to resume after the training loop took ``batches`` batches of the current epoch (on this
        rank) from a DataLoader over this dataset: pass it as ``resume=`` to a new dataset."""
        check_count("batches", batches, minimum=0)
        return {"kind": self.method, "arguments": self._digest(), "epoch": self.epoch, "version": self.version,
                "batches": int(batches), "rank": self.rank, "world_size": self.world_size,
                "workers": max(int(self._shared[WORKERS]), 1)}

    def _check_resume(self, resume: Mapping[str, Any] | None, epoch: int | None) -> dict[str, Any] | None:
        if resume is None:
            return None
        keys = {"kind", "arguments", "epoch", "version", "batches", "rank", "world_size", "workers"}
        if not isinstance(resume, Mapping) or not keys <= set(resume):
            raise InputError(f"resume: expected the dict a dataset's state_dict(batches=…) returned, got {resume!r}")
        if resume["kind"] != self.method or resume["arguments"] != self._digest():
            raise InputError("resume: the state was made by a dataset with other arguments (or of another kind); "
                             "pass the same arguments as the dataset that made it")
        if (resume["rank"], resume["world_size"]) != (self.rank, self.world_size):
            raise InputError(f"resume: a state of rank {resume['rank']} of {resume['world_size']}, but this is rank "
                             f"{self.rank} of {self.world_size}")
        if epoch is not None and epoch != resume["epoch"]:
            raise InputError(f"resume: a state of epoch {resume['epoch']}, but epoch={epoch}; leave epoch out")
        return dict(resume)

    def _digest(self) -> str:
        return digest({"method": self.method, "uri": self.uri, "args": self.args, "kwargs": self.kwargs})

    def _version_now(self) -> int:
        if self._pinned is not None:
            return self._pinned
        if getattr(self, "_main_store", None) is None:
            self._main_store = stores.open(self.uri, storage_options=self.storage_options or None)
        assert self._main_store is not None
        return self._main_store.version

    # --- iteration ------------------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        info = torch.utils.data.get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        self._shared[WORKERS] = workers
        spec = self._spec(workers, worker)
        batches = self._batches(spec)
        try:
            for batch in batches:
                yield {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in batch.items()}
        finally:
            batches.close()

    def _spec(self, workers: int, worker: int) -> ShardSpec:
        resume = self._resume
        resumed = resume is not None and resume["epoch"] == self.epoch and resume["version"] == self.version
        if resumed and resume is not None and resume["workers"] != workers:
            raise InputError(f"resume: a state made with {resume['workers']} DataLoader worker(s), but this "
                             f"DataLoader has {workers}; use the same num_workers")
        taken = int(resume["batches"]) if resumed and resume is not None else None
        # a new DataLoader starts its round robin at worker 0: after n batches, the worker whose batch comes next
        # is n mod W, so worker w serves that one's shard, w + n mod W
        shard_worker = (worker + (taken or 0)) % workers
        return ShardSpec(self.uri, self.storage_options or None, self.version, self.method, self.args,
                         self.kwargs, self.rank, self.world_size, shard_worker, workers, self.epoch, taken)

    def _batches(self, spec: ShardSpec) -> Any:
        if os.getpid() != self._pid:  # a forked copy of the dataset: deltalake cannot run in this process
            if self._helper is None or not self._helper.alive:
                self._helper = Helper()
            return self._helper.batches(spec)
        return shard_batches(self._stores.get(spec), spec)

    # --- pickling: to spawned workers the shared state itself, anywhere else its values -----------------------

    def __getstate__(self) -> dict[str, Any]:
        state = {k: v for k, v in self.__dict__.items() if k not in ("_stores", "_helper", "_main_store", "_pid")}
        if multiprocessing.context.get_spawning_popen() is None:  # not to a new process: values, not shared memory
            state["_shared"] = list(self._shared)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        shared = state["_shared"]
        if isinstance(shared, list):
            state["_shared"] = multiprocessing.RawArray("q", shared)
        self.__dict__.update(state)
        self._local()


def _location(store: stores.Store | str | os.PathLike[str],
              storage_options: Mapping[str, Any] | None) -> tuple[str, dict[str, Any], int | None]:
    """The URI, storage options and pinned version (None: the latest) of ``store``."""
    if isinstance(store, stores.Store):
        if storage_options:
            raise InputError("storage_options: a Store carries its own; give them only with a URI")
        served = stores.plumbing(store)
        return store.uri, served.storage_options, served.pinned
    if not isinstance(store, (str, os.PathLike)):
        raise InputError(f"store: expected a trajstore.Store or its URI (a path or s3://…), got "
                         f"{type(store).__name__}")
    return os.fspath(store), dict(storage_options or {}), None


class Sequences(StoreDataset):
    """``store.sequences(length, **kwargs)`` as a dataset of batches (``store``: a Store or its URI)."""

    method = "sequences"

    def __init__(self, store: stores.Store | str | os.PathLike[str], length: int, **kwargs: Any) -> None:
        super().__init__(store, length, **kwargs)


class Transitions(StoreDataset):
    """``store.transitions(n, gamma=…, **kwargs)`` as a dataset of batches (``store``: a Store or its URI)."""

    method = "transitions"

    def __init__(self, store: stores.Store | str | os.PathLike[str], n: int, *, gamma: float,
                 **kwargs: Any) -> None:
        super().__init__(store, n, gamma=gamma, **kwargs)


class ReplayDataset(torch.utils.data.IterableDataset):
    """Batches of a prioritized replay (``store.replay(...)`` or ``client.replay(...)``) as a dataset: each item is
    ``replay.sample(batch_size)`` with torch tensors (text columns such as ``agent_id`` stay numpy arrays), drawn
    ``batches`` times per iteration (None: without end). Give the ``DataLoader`` ``batch_size=None`` and no
    workers: each batch must be drawn from the priorities the learner gave so far (``replay.update(batch["index"],
    td_error.abs())``, tensors accepted), which a worker drawing ahead, in a process of its own, would not have.

    >>> data = trajstore.torch.ReplayDataset(replay, 256)                        # doctest: +SKIP
    >>> for step, batch in zip(range(10_000), DataLoader(data, batch_size=None)):
    ...     loss = (batch["weight"] * td_error(batch) ** 2).mean()
    ...     replay.update(batch["index"], td_error(batch).abs().detach())
    """

    def __init__(self, replay: Any, batch_size: int, *, batches: int | None = None) -> None:
        super().__init__()
        if not callable(getattr(replay, "sample", None)) or not callable(getattr(replay, "update", None)):
            raise InputError(f"replay: expected a replay (store.replay(...) or client.replay(...)), got "
                             f"{type(replay).__name__}")
        self.replay = replay
        self.batch_size = check_count("batch_size", batch_size)
        self.batches = None if batches is None else check_count("batches", batches, minimum=0)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if torch.utils.data.get_worker_info() is not None:
            raise InputError("num_workers: a ReplayDataset draws in the learner's process, from the priorities "
                             "given so far; use DataLoader(data, batch_size=None) with num_workers=0")
        drawn = 0
        while self.batches is None or drawn < self.batches:
            yield convert(self.replay.sample(self.batch_size), "torch")
            drawn += 1

    def __getstate__(self) -> dict[str, Any]:
        raise InputError("num_workers: a ReplayDataset is not sent to DataLoader workers (its replay's priorities "
                         "live in this process or on the service); use num_workers=0")
