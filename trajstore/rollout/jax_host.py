"""The host half of a JAX rollout: counting and stopping, copying batches out of the device once, and
feeding them to a writer from a background thread while the next scan runs.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from trajstore.extras import needed
from trajstore.rollout.background import BackgroundWriter
from trajstore.rollout.jax_scan import Carry, RolloutScan
from trajstore.rollout.progress import RolloutProgress
from trajstore.rollout.sampling import RolloutResult, SampleUntil
from trajstore.rollout.target import RolloutTarget
from trajstore.write.writer import Writer

with needed("jax", "a JAX rollout"):
    import jax

log = logging.getLogger(__name__)


@dataclass
class Tally:
    """Steps and complete episodes stored so far, with the returns and lengths summed inside JAX."""

    num_envs: int
    steps: int = 0
    episodes: int = 0
    returns: list[np.ndarray] = field(default_factory=list)
    lengths: list[np.ndarray] = field(default_factory=list)

    def take(self, batch: dict[str, Any], ends: dict[str, np.ndarray], until: SampleUntil) -> tuple[int, bool]:
        """Count a host batch; returns how many time rows to store and whether the rollout stops there."""
        valid = batch.get("valid")
        done = batch["terminated"] | batch["truncated"]
        per_t = valid.sum(axis=1) if valid is not None else np.full(len(done), self.num_envs)
        if valid is not None:
            done = done & valid
        steps_t = self.steps + np.cumsum(per_t)
        eps_t = self.episodes + np.cumsum(done.sum(axis=1))
        keep, stop = len(done), until(episodes=int(eps_t[-1]), timesteps=int(steps_t[-1]))
        if stop:  # the first vector step at which the rule holds (it only turns true once)
            keep = 1 + next(t for t in range(len(done)) if until(episodes=int(eps_t[t]), timesteps=int(steps_t[t])))
        ended = done[:keep]
        self.returns.append(ends["return"][:keep][ended].astype(np.float64))
        self.lengths.append(ends["length"][:keep][ended].astype(np.int64))
        self.steps, self.episodes = int(steps_t[keep - 1]), int(eps_t[keep - 1])
        return keep, stop

    def result(self, writer: Writer, started: float) -> RolloutResult:
        """The rollout's result, its returns and lengths as numpy arrays (16 bytes an episode, not a list's ~70)."""
        returns = np.concatenate(self.returns) if self.returns else np.zeros(0)
        lengths = np.concatenate(self.lengths) if self.lengths else np.zeros(0, np.int64)
        out = RolloutResult(run_id=writer.run_id, env_id=writer.env_id, steps=writer.steps_written,
                            episodes=self.episodes, seconds=time.perf_counter() - started,
                            episode_returns=returns, episode_lengths=lengths)  # type: ignore[arg-type]
        if out.steps != self.steps:
            log.warning("rollout %s: counted %d steps but the writer stored %d", out.run_id, self.steps, out.steps)
        log.info("rollout %s/%s: %d steps, %d episodes in %.1fs", out.run_id, out.env_id, out.steps,
                 out.episodes, out.seconds)
        return out


def collect(scan: RolloutScan, params: Any, carry: Carry, *, sink: BackgroundWriter, until: SampleUntil,
            tally: Tally, bar: RolloutProgress, max_scans: int | None = None) -> None:
    """Run scans until ``until`` holds, each next scan dispatched before the previous batch is copied out."""
    pending: Any = scan.run(params, carry)
    dispatched = 1
    while pending is not None:
        carry, batch, ends = pending
        pending = None
        if max_scans is None or dispatched < max_scans:
            pending = scan.run(params, carry)  # asynchronous: the device works on it while we store this one
            dispatched += 1
        batch, ends = jax.device_get((batch, ends))  # the one host copy
        before = tally.episodes
        keep, stop = tally.take(batch, ends, until)
        sink.put(_head(batch, keep) if keep < scan.rollout_length else batch)
        new = tally.returns[-1][-100:].tolist() if tally.episodes > before else None
        bar.update(steps=tally.steps, episodes=tally.episodes, returns=new)
        if stop:
            return


def _head(batch: Any, n: int) -> Any:
    if isinstance(batch, Mapping):
        return {k: _head(v, n) for k, v in batch.items()}
    return batch[:n]


def open_writer(store: RolloutTarget, env: Any, *, run_id: str, env_id: str | None, **options: Any) -> Writer:
    """A same-step writer for ``env``'s spaces."""
    return store.writer(run_id=run_id, env_id=env_id or str(getattr(env, "name", type(env).__name__)),
                        observation_space=env.observation_space, action_space=env.action_space,
                        autoreset="same-step", **options)
