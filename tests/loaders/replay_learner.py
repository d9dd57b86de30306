"""A learner in a process of its own, for the tests of a replay's priorities in the store
(``tests/loaders/test_replay_priorities.py``): ``python -m tests.loaders.replay_learner MODE STORE FOLDER [ARGS]``.

- ``journal``: samples and updates in a loop, committing explicitly every iteration; before each commit it writes the
  priorities it has given every item so far to ``FOLDER/journal-<k>.npz`` and after it prints ``committed <k>``; it
  runs until killed.
- ``shared LEARNER ROUNDS``: ``ROUNDS`` rounds, each giving handles of its own and handle 0 the value
  ``1000 * LEARNER + round`` and committing; prints each commit's version. Once its replay is open it writes
  ``FOLDER/opened-LEARNER``, and it starts once ``FOLDER/go`` exists.
- ``resume``: prints, as JSON, ``(episode_id, start, probability)`` of 4096 items drawn from the replay resumed.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

import trajstore


def journal(store: trajstore.Store, folder: Path) -> None:
    given: dict[tuple[int, int], float] = {}
    with store.replay(n=2, gamma=0.9, priorities="learner", commit_interval=None, commit_updates=None) as replay:
        rng = np.random.default_rng(0)
        for k in range(1, 1_000_000):
            batch = replay.sample(64)
            priority = rng.exponential(1.0, 64)
            replay.update(batch["index"], priority)
            for e, s, p in zip(batch["episode_id"], batch["start"], priority):
                given[(int(e), int(s))] = float(p)
            keys = np.array(list(given), np.int64).reshape(-1, 2)
            np.savez(folder / "partial.npz", episode=keys[:, 0], step=keys[:, 1],
                     priority=np.array(list(given.values())))
            os.replace(folder / "partial.npz", folder / f"journal-{k}.npz")  # whole, or absent, when killed
            replay.commit()
            print(f"committed {k}", flush=True)


def shared(store: trajstore.Store, folder: Path, learner: int, rounds: int) -> None:
    with store.replay(priorities="shared", commit_interval=None, commit_updates=None) as replay:
        (folder / f"opened-{learner}").write_text("")
        while not (folder / "go").exists():
            time.sleep(0.01)
        own = np.arange(1, 11) + 10 * learner
        for r in range(rounds):
            replay.update(np.concatenate([[0], own]), np.full(11, 1000.0 * learner + r))
            print(f"version {replay.commit()}", flush=True)


def resume(store: trajstore.Store) -> None:
    with store.replay(n=2, gamma=0.9, priorities="learner", commit_interval=None) as replay:
        batch = replay.sample(4096)
    print(json.dumps([[int(e), int(s), float(p)] for e, s, p in
                      zip(batch["episode_id"], batch["start"], batch["probability"])]))


if __name__ == "__main__":
    mode, uri, where = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    opened = trajstore.open(uri)
    if mode == "journal":
        journal(opened, where)
    elif mode == "shared":
        shared(opened, where, int(sys.argv[4]), int(sys.argv[5]))
    else:
        resume(opened)
