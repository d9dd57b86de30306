"""PyTorch datasets over a store (the ``[torch]`` extra): windows and n-step transitions as an
``IterableDataset`` of ready-made batches, sharded by ``DataLoader`` worker and by data-parallel rank.

Worker ``w`` of ``W`` on rank ``r`` of ``R`` reads shard ``r·W + w`` of ``R·W`` of the epoch's order, so the
workers of all ranks together visit every window once per epoch. Batches are made inside the dataset: give
the ``DataLoader`` ``batch_size=None``. Each worker opens the store itself (only the URI is pickled); use the
``spawn`` start method (``multiprocessing_context="spawn"``), as deltalake's runtime does not survive ``fork``.

>>> from torch.utils.data import DataLoader                                   # doctest: +SKIP
>>> data = trajstore.torch.Sequences("./trajdata", 64, columns=["obs", "action", "reward"], shuffle=True)
>>> loader = DataLoader(data, batch_size=None, num_workers=2, multiprocessing_context="spawn")
>>> for epoch in range(10):
...     data.set_epoch(epoch)
...     for batch in loader:                                                 # doctest: +SKIP
...         train_step(batch["obs"], batch["mask"])
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

import torch.utils.data

import trajstore
from trajstore.errors import InputError


class _StoreDataset(torch.utils.data.IterableDataset):
    method = ""

    def __init__(self, uri: str, *args: Any, rank: int = 0, world_size: int = 1, epoch: int = 0,
                 storage_options: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        if "format" in kwargs:
            raise InputError("format: a torch dataset always gives torch tensors; leave format out")
        super().__init__()
        self.uri, self.args, self.kwargs = str(uri), args, kwargs
        self.rank, self.world_size, self.epoch = rank, world_size, epoch
        self.storage_options = dict(storage_options or {})

    def set_epoch(self, epoch: int) -> None:
        """The epoch of the next iteration (its shuffled order); call it before each epoch."""
        self.epoch = epoch

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        info = torch.utils.data.get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        store = trajstore.open(self.uri, storage_options=self.storage_options or None)
        batches = getattr(store, self.method)(*self.args, rank=self.rank * workers + worker,
                                              world_size=self.world_size * workers, epoch=self.epoch,
                                              format="torch", **self.kwargs)
        try:
            yield from batches
        finally:
            batches.close()


class Sequences(_StoreDataset):
    """``store.sequences(length, **kwargs)`` of the store at ``uri`` as a dataset of batches."""

    method = "sequences"

    def __init__(self, uri: str, length: int, **kwargs: Any) -> None:
        super().__init__(uri, length, **kwargs)


class Transitions(_StoreDataset):
    """``store.transitions(n, gamma=…, **kwargs)`` of the store at ``uri`` as a dataset of batches."""

    method = "transitions"

    def __init__(self, uri: str, n: int, *, gamma: float, **kwargs: Any) -> None:
        super().__init__(uri, n, gamma=gamma, **kwargs)
