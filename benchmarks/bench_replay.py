"""Prioritized replay (issue 50): ``store.replay`` against TorchRL's ``PrioritizedSampler`` over a
``LazyTensorStorage`` and cpprb's ``PrioritizedReplayBuffer`` holding the same items in RAM, side by side in one run.

Items: 1M and 10M steps (obs float32[4], next_obs float32[4], action int64, reward float32, terminated, truncated:
the columns a step item of ``store.replay()`` has) and 1M windows of 16 steps (stride 1 over episodes of 100 steps:
obs, action, reward, terminated, truncated and mask, the columns of ``store.replay(length=16, stride=1)``). One batch
is ``sample(256)`` (every column gathered; each method's batch touched) and ``update(256)`` of the sampled items with
new priorities (alpha 0.6, beta 0.4, eps 1e-6; every method with replacement, by its own sum tree). Also: a fresh
process's first prioritized batch at 10M items (from opening the store: with no priorities stored, and resuming 10M
committed ones), a ``commit()`` of 100K updated priorities, and each method's memory per item.

    python benchmarks/bench_replay.py            # writes the replay section of docs/benchmarks.md
    python benchmarks/bench_replay.py --quick    # 100k and 1M steps, 100k windows: a check that it all runs

TorchRL 0.14.1's C++ sum tree (its ``_torchrl`` extension) loads only beside the torch it was built with (2.14), not
the CPU 2.13 of the project's environment: its runs use the environment ``--torchrl-python`` names
(``make bench-torchrl-venv`` builds ``.venv-torchrl``: torch 2.14.1, torchrl 0.14.1, tensordict 0.14.3, numpy). cpprb
11.0 runs in the project's environment (extra ``bench``). Every measurement runs in a fresh process (this file with
``--child``); the methods take turns, ``--repeats`` times. Stores and the arrays the baselines load are kept under
``--data`` (default ``.cache/bench-replay``).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

BATCH, WARMUP = 256, 200
ALPHA, BETA, EPS = 0.6, 0.4, 1e-6
LENGTH, EPISODE = 16, 100  # windows of 16 steps over episodes of 100
SIZES = [("steps", 1_000_000), ("steps", 10_000_000), ("windows", 1_000_000)]
QUICK = [("steps", 100_000), ("steps", 1_000_000), ("windows", 100_000)]
ENVS = 1000
COMMITTED = 100_000  # priorities updated before the commit timed


def _log(msg: str) -> None:
    print(f"[bench:replay] {msg}", file=sys.stderr, flush=True)


# --- the data: one store per size, and the same items as arrays for the baselines ------------------------------


def steps_of(kind: str, items: int) -> int:
    """The steps a store holds for ``items`` items: one per step, or windows of 16 at stride 1 (85 per episode)."""
    if kind == "steps":
        return items
    per_episode = EPISODE - LENGTH + 1
    return -(-items // (per_episode * ENVS)) * EPISODE * ENVS


def generate(steps: int, folder: Path) -> None:
    """``steps`` steps of ``ENVS`` envs (episodes of 100 steps, terminated), written into a store at ``folder/store``
    and, env by env, as ``.npy`` arrays (what the baselines load)."""
    import numpy as np

    import trajstore

    T = steps // ENVS
    rng = np.random.default_rng(0)
    arrays: dict[str, Any] = {
        "obs": np.lib.format.open_memmap(folder / "obs.npy", "w+", np.float32, (ENVS, T, 4)),
        "next_obs": np.lib.format.open_memmap(folder / "next_obs.npy", "w+", np.float32, (ENVS, T, 4)),
        "action": np.lib.format.open_memmap(folder / "action.npy", "w+", np.int64, (ENVS, T)),
        "reward": np.lib.format.open_memmap(folder / "reward.npy", "w+", np.float32, (ENVS, T)),
    }
    store = trajstore.open(folder / "store", create=True)
    chunk = 1000
    with store.writer(run_id="bench", env_id="Bench-v0") as w:
        for t0 in range(0, T, chunk):
            n = min(chunk, T - t0)
            obs = rng.standard_normal((n + 1, ENVS, 4), dtype=np.float32)
            t = np.arange(t0, t0 + n)
            terminated = np.broadcast_to(((t % EPISODE) == EPISODE - 1)[:, None], (n, ENVS)).copy()
            next_obs = obs[1:].copy()
            batch = {"obs": obs[:-1], "next_obs": next_obs, "action": rng.integers(0, 4, (n, ENVS)),
                     "reward": rng.standard_normal((n, ENVS), dtype=np.float32), "terminated": terminated,
                     "truncated": np.zeros((n, ENVS), bool)}
            w.add_batch(batch)
            for name in arrays:
                arrays[name][:, t0:t0 + n] = np.swapaxes(batch[name], 0, 1)
    for a in arrays.values():
        a.flush()
    (folder / "done").write_text("")


def data_folder(root: Path, kind: str, items: int) -> Path:
    steps = steps_of(kind, items)
    folder = root / f"steps-{steps}"
    if not (folder / "done").exists():
        import shutil

        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        _log(f"writing {steps:,} steps into {folder}")
        t = time.perf_counter()
        generate(steps, folder)
        _log(f"written in {time.perf_counter() - t:.1f} s")
    return folder


def baseline_items(folder: Path, kind: str, items: int) -> dict[str, Any]:
    """The items as arrays in RAM: each step's columns, or each window's (16 consecutive steps of an episode)."""
    import numpy as np

    cols = {c: np.load(folder / f"{c}.npy", mmap_mode="r") for c in ("obs", "next_obs", "action", "reward")}
    envs, T = cols["reward"].shape
    terminated = np.broadcast_to((np.arange(T) % EPISODE) == EPISODE - 1, (envs, T))
    if kind == "steps":
        out = {c: np.ascontiguousarray(v.reshape(envs * T, *v.shape[2:]))[:items] for c, v in cols.items()}
        out["terminated"] = np.ascontiguousarray(terminated.reshape(-1))[:items]
        out["truncated"] = np.zeros(items, bool)
        return out
    per_episode = EPISODE - LENGTH + 1
    episode = np.arange(items) // per_episode
    start = episode * EPISODE + np.arange(items) % per_episode  # in the env-major order of all steps
    at = start[:, None] + np.arange(LENGTH)[None, :]
    flat = {c: v.reshape(envs * T, *v.shape[2:]) for c, v in cols.items() if c != "next_obs"}
    out = {c: np.ascontiguousarray(v[at]) for c, v in flat.items()}
    out["terminated"] = np.ascontiguousarray(terminated.reshape(-1)[at])
    out["truncated"] = np.zeros((items, LENGTH), bool)
    out["mask"] = np.ones((items, LENGTH), bool)
    return out


# --- in a child process --------------------------------------------------------------------------------------


def rss_anon_mib() -> float:
    from timing import status_kib

    return status_kib("RssAnon") / 1024


def touch(batch: Any) -> None:
    for a in (batch.values() if hasattr(batch, "values") else batch):
        if hasattr(a, "numel"):
            if a.numel():
                a.reshape(-1)[-1].item()
        elif hasattr(a, "size") and a.size:
            a.reshape(-1)[-1].item()


def timed(step: Any, batches: int) -> dict[str, Any]:
    times = []
    for i in range(WARMUP + batches):
        t = time.perf_counter()
        step()
        if i >= WARMUP:
            times.append(time.perf_counter() - t)
    times.sort()
    return {"batches": len(times), "min_ms": times[0] * 1e3, "median_ms": statistics.median(times) * 1e3,
            "p90_ms": times[int(0.9 * (len(times) - 1))] * 1e3}


def child_trajstore(folder: Path, kind: str, items: int, batches: int, priorities: str | None) -> dict[str, Any]:
    import numpy as np

    import trajstore

    before = rss_anon_mib()
    t0 = time.perf_counter()
    store = trajstore.open(folder / "store")
    kwargs: dict[str, Any] = {"length": LENGTH, "stride": 1} if kind == "windows" else {}
    replay = store.replay(**kwargs, priorities=priorities, alpha=ALPHA, beta=BETA, eps=EPS, commit_interval=None,
                          commit_updates=None)
    touch(replay.sample(BATCH))
    first = time.perf_counter() - t0
    n = len(replay)
    rng = np.random.default_rng(0)

    def step() -> None:
        batch = replay.sample(BATCH)
        touch(batch)
        replay.update(batch["index"], rng.random(BATCH))

    out = timed(step, batches) if batches else {}
    return {"first_batch_s": first, "items": n, "bytes_per_item": replay.nbytes / n,
            "anon_mib": rss_anon_mib() - before, **out}


def child_store_priorities(folder: Path, kind: str, name: str) -> dict[str, Any]:
    """Every item given a priority and committed (what a resumed replay reads)."""
    import numpy as np

    import trajstore

    store = trajstore.open(folder / "store")
    with store.replay(priorities=name, commit_interval=None, commit_updates=None) as replay:
        n = len(replay)
        rng = np.random.default_rng(1)
        for lo in range(0, n, 1 << 20):
            index = np.arange(lo, min(n, lo + (1 << 20)))
            replay.update(index, rng.exponential(1.0, len(index)))
        t = time.perf_counter()
        version = replay.commit()
        return {"items": n, "version": version, "commit_s": time.perf_counter() - t}


def child_commit(folder: Path) -> dict[str, Any]:
    import numpy as np

    import trajstore

    store = trajstore.open(folder / "store")
    name = f"commit-{os.getpid()}"
    with store.replay(priorities=name, commit_interval=None, commit_updates=None) as replay:
        index = np.random.default_rng(2).choice(len(replay), COMMITTED, replace=False)
        replay.update(index, np.random.default_rng(3).exponential(1.0, COMMITTED))
        t = time.perf_counter()
        replay.commit()
        return {"commit_s": time.perf_counter() - t, "rows": COMMITTED}


def child_cpprb(folder: Path, kind: str, items: int, batches: int) -> dict[str, Any]:
    import cpprb
    import numpy as np

    data = baseline_items(folder, kind, items)
    before = rss_anon_mib()
    t0 = time.perf_counter()
    env = {k: {"shape": v.shape[1:] or 1, "dtype": v.dtype} for k, v in data.items()}
    rb = cpprb.PrioritizedReplayBuffer(items, env, alpha=ALPHA, eps=EPS)
    for lo in range(0, items, 100_000):
        rb.add(**{k: v[lo:lo + 100_000] for k, v in data.items()})
    filled = time.perf_counter() - t0
    anon = rss_anon_mib() - before
    del data
    rng = np.random.default_rng(0)

    def step() -> None:
        batch = rb.sample(BATCH, beta=BETA)
        touch(batch)
        rb.update_priorities(batch["indexes"], rng.random(BATCH))

    return {"fill_s": filled, "items": rb.get_stored_size(), "anon_mib": anon, **timed(step, batches)}


def child_torchrl(folder: Path, kind: str, items: int, batches: int) -> dict[str, Any]:
    import numpy as np
    import torch
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, PrioritizedSampler, ReplayBuffer

    data = baseline_items(folder, kind, items)
    before = rss_anon_mib()
    t0 = time.perf_counter()
    rb = ReplayBuffer(storage=LazyTensorStorage(items), sampler=PrioritizedSampler(items, alpha=ALPHA, beta=BETA,
                                                                                  eps=EPS), batch_size=BATCH)
    for lo in range(0, items, 100_000):
        part = {k: torch.from_numpy(np.ascontiguousarray(v[lo:lo + 100_000])) for k, v in data.items()}
        rb.extend(TensorDict(part, batch_size=[len(part["reward"])]))
    filled = time.perf_counter() - t0
    anon = rss_anon_mib() - before
    del data
    rng = np.random.default_rng(0)

    def step() -> None:
        batch, info = rb.sample(return_info=True)
        touch(list(batch.values()))
        rb.update_priority(info["index"], torch.from_numpy(rng.random(BATCH, dtype=np.float32)))

    return {"fill_s": filled, "items": len(rb), "anon_mib": anon, **timed(step, batches)}


def child(argv: list[str]) -> None:
    method, folder, kind, items, batches = argv[0], Path(argv[1]), argv[2], int(argv[3]), int(argv[4])
    extra = argv[5] if len(argv) > 5 else None
    if method == "trajstore":
        out = child_trajstore(folder, kind, items, batches, extra if extra != "-" else None)
    elif method == "store-priorities":
        out = child_store_priorities(folder, kind, extra or "bench")
    elif method == "commit":
        out = child_commit(folder)
    elif method == "cpprb":
        out = child_cpprb(folder, kind, items, batches)
    else:
        out = child_torchrl(folder, kind, items, batches)
    print(json.dumps(out), flush=True)


# --- the run -------------------------------------------------------------------------------------------------


def run_child(python: str, *args: Any) -> dict[str, Any]:
    cmd = [python, str(Path(__file__).resolve()), "--child", *map(str, args)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(args: argparse.Namespace) -> dict[str, Any]:
    sizes = QUICK if args.quick else SIZES
    res: dict[str, Any] = {"sizes": [], "load_start": load(), "torchrl_python": args.torchrl_python}
    for kind, items in sizes:
        folder = data_folder(args.data, kind, items)
        runs: dict[str, list[dict[str, Any]]] = {"trajstore": [], "torchrl": [], "cpprb": []}
        for r in range(args.repeats):
            for method in ("trajstore", "torchrl", "cpprb"):
                _log(f"{kind} {items:,}: {method}, run {r + 1}")
                python = args.torchrl_python if method == "torchrl" else sys.executable
                runs[method].append(run_child(python, method, folder, kind, items, args.batches, "-"))
        res["sizes"].append({"kind": kind, "items": items, "steps": steps_of(kind, items), "runs": runs})
    big = max((s for s in sizes if s[0] == "steps"), key=lambda s: s[1])
    folder = data_folder(args.data, *big)
    first = [run_child(sys.executable, "trajstore", folder, "steps", big[1], 0, "-") for _ in range(args.repeats)]
    # a name of this run's own: the priorities resumed are one commit of every item (a replay's folder is merged only
    # past 32 files, so rows a name kept from earlier runs would be read too)
    name = time.strftime("bench-%Y%m%d-%H%M%S")
    stored = run_child(sys.executable, "store-priorities", folder, "steps", big[1], 0, name)
    resumed = [run_child(sys.executable, "trajstore", folder, "steps", big[1], 0, name)
               for _ in range(args.repeats)]
    commits = [run_child(sys.executable, "commit", folder, "steps", big[1], 0) for _ in range(args.repeats)]
    res.update(first=first, stored=stored, resumed=resumed, name=name, commits=commits, big=big[1], load_end=load())
    return res


def load() -> str:
    from report import load_average

    return load_average()


def median_of(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def report_md(res: dict[str, Any], machine: dict[str, str], command: str) -> str:
    lines = [f"Generated by `{command}` on {machine['date']}. Every number below was measured in that one run; "
             f"load average {res['load_start']} at its start and {res['load_end']} at its end (1, 5, 15 minutes).",
             "", "### Targets", "", "| target | measured | required | result |", "|---|---:|---:|---|"]
    targets = []
    for size in res["sizes"]:
        ours = median_of(size["runs"]["trajstore"], "median_ms")
        for other, label in (("torchrl", "TorchRL PrioritizedSampler"), ("cpprb", "cpprb PrioritizedReplayBuffer")):
            theirs = median_of(size["runs"][other], "median_ms")
            targets.append((f"sample(256) + update(256), {_size(size)}: trajstore / {label}", ours / theirs,
                            "≤ 1.00", ours <= theirs, "{:.2f}"))
    first = median_of(res["first"], "first_batch_s")
    targets.append((f"a fresh process's first prioritized batch, {res['big']:,} step items, no priorities stored (s)",
                    first, "≤ 1.0", first <= 1.0, "{:.2f}"))
    resumed = median_of(res["resumed"], "first_batch_s")
    targets.append((f"a fresh process's first prioritized batch, {res['big']:,} step items, resuming as many "
                    "committed priorities (s)", resumed, "≤ 1.0", resumed <= 1.0, "{:.2f}"))
    commit = median_of(res["commits"], "commit_s")
    targets.append((f"commit() of {COMMITTED:,} updated priorities (s)", commit, "≤ 1.0", commit <= 1.0, "{:.2f}"))
    for what, value, required, ok, fmt in targets:
        lines.append(f"| {what} | {fmt.format(value)} | {required} | {'PASS' if ok else '**FAIL**'} |")
    lines += ["", "### Per batch: sample(256) + update(256)", "",
              "Medians over the timed batches of one fresh process (after 200 untimed ones); the median of the "
              f"{len(res['sizes'][0]['runs']['trajstore'])} processes per method (each one's median in the last "
              "column), the methods taking turns.", "",
              "| items | method | min ms | median ms | p90 ms | vs TorchRL | vs cpprb | medians of each run |",
              "|---|---|---:|---:|---:|---:|---:|---|"]
    for size in res["sizes"]:
        trl = median_of(size["runs"]["torchrl"], "median_ms")
        cpp = median_of(size["runs"]["cpprb"], "median_ms")
        for method, label in (("trajstore", "trajstore `store.replay`"), ("torchrl", "TorchRL PrioritizedSampler + "
                                                                                      "LazyTensorStorage"),
                              ("cpprb", "cpprb PrioritizedReplayBuffer")):
            runs = size["runs"][method]
            med = median_of(runs, "median_ms")
            lines.append(f"| {_size(size)} | {label} | {median_of(runs, 'min_ms'):.3f} | {med:.3f} | "
                         f"{median_of(runs, 'p90_ms'):.3f} | {med / trl:.2f} | {med / cpp:.2f} | "
                         f"{_joined(runs, 'median_ms', '{:.3f}')} |")
    lines += ["", "### Memory per item, and filling", "",
              "trajstore: what the replay holds (its trees: the weights once, 16 children a node; its items' "
              "runs, one per trajectory: episode, agent, first item, count, first handle), from `Replay.nbytes`; "
              "the steps stay in the store's files (array copies mapped: the page cache's, shared by every "
              "process). TorchRL and cpprb: the growth of the process's "
              "own memory (`RssAnon`) while the items were added (their storage and sum trees), per item; the "
              "seconds that took.", "", "| items | method | bytes per item | fill s |", "|---|---|---:|---:|"]
    for size in res["sizes"]:
        ours = size["runs"]["trajstore"]
        lines.append(f"| {_size(size)} | trajstore | {median_of(ours, 'bytes_per_item'):.1f} | "
                     f"(first batch {median_of(ours, 'first_batch_s'):.2f} s) |")
        for method in ("torchrl", "cpprb"):
            runs = size["runs"][method]
            per_item = median_of(runs, "anon_mib") * 2**20 / size["items"]
            lines.append(f"| {_size(size)} | {method} | {per_item:.1f} | {median_of(runs, 'fill_s'):.2f} |")
    resumed = median_of(res["resumed"], "first_batch_s")
    lines += ["", "### A fresh process, and commits", "",
              f"From `trajstore.open` to the first batch of `store.replay()` over {res['big']:,} step items, in a "
              f"fresh process (imports before): with no priorities stored {first:.2f} s (runs: "
              f"{_joined(res['first'], 'first_batch_s', '{:.2f}')}); resuming {res['stored']['items']:,} "
              f"committed priorities (`priorities=\"{res['name']}\"`, committed in one commit of "
              f"{res['stored']['commit_s']:.2f} s) {resumed:.2f} s (runs: "
              f"{_joined(res['resumed'], 'first_batch_s', '{:.2f}')}). A `commit()` of "
              f"{COMMITTED:,} priorities updated at random items: {commit:.3f} s (runs: "
              f"{_joined(res['commits'], 'commit_s', '{:.3f}')}).",
              "", "### Machine", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in machine.items()]
    lines.append(f"| TorchRL's environment | `{res['torchrl_python']}` (torch 2.14.1, torchrl 0.14.1) |")
    lines.append(f"| load average at end | {res['load_end']} |")
    return "\n".join(lines)


def _joined(runs: list[dict[str, Any]], key: str, fmt: str) -> str:
    return ", ".join(fmt.format(r[key]) for r in runs)


def _size(size: dict[str, Any]) -> str:
    n = size["items"]
    label = f"{n // 1_000_000}M" if n % 1_000_000 == 0 else f"{n // 1000}k"
    return f"{label} {'windows of 16' if size['kind'] == 'windows' else 'steps'}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        child(argv[1:])
        return 0
    from report import machine_info, output_options, publish

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes: a check that it all runs")
    parser.add_argument("--repeats", type=int, default=3, help="processes per method and size (default: 3)")
    parser.add_argument("--batches", type=int, default=3000, help="timed batches per process (default: 3000)")
    parser.add_argument("--data", type=Path, default=REPO / ".cache" / "bench-replay")
    parser.add_argument("--torchrl-python", default=str(REPO / ".venv-torchrl" / "bin" / "python"),
                        help="the Python of an environment with torch 2.14 and torchrl 0.14.1 (make "
                             "bench-torchrl-venv)")
    output_options(parser, "full runs", check=True)
    args = parser.parse_args(argv)
    args.data.mkdir(parents=True, exist_ok=True)
    machine = machine_info(REPO)
    res = run(args)
    command = "python benchmarks/bench_replay.py" + "".join(f" {shlex.quote(a)}" for a in argv)
    body = report_md(res, machine, command)
    out = args.out if args.out is not None or args.quick else REPO / "docs" / "benchmarks.md"
    publish(out, "replay", "## Prioritized replay (issue 50)\n\n" + body)
    ok = all(line.endswith("PASS |") for line in body.splitlines() if line.startswith("| ") and
             line.rstrip().endswith(("PASS |", "**FAIL** |")))
    return 0 if ok or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())
