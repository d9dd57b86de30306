"""What a training loader reads: the selected steps of the latest committed version, pinned (:func:`loader_source`).

Every read of one loader — the columns its layout is built from, an ``episodes`` column it weights by — reads the
same files, those of the version current when it was made. The :class:`~trajstore.loaders.sequences.Source` also
names what the loader's layouts are kept by (:mod:`~trajstore.loaders.layout_store`): a key of the files read and the
episodes chosen, and the basis vacuum judges them by.
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence

import numpy as np
import pyarrow as pa

from trajstore.errors import InputError
from trajstore.loaders import stitched
from trajstore.loaders.layout import read_files
from trajstore.loaders.layout_store import Basis, LayoutStore
from trajstore.loaders.layout_store import files_digest as layout_files_digest
from trajstore.loaders.order import digest
from trajstore.loaders.sequences import Source
from trajstore.loaders.stitched import Stitched
from trajstore.query import sql
from trajstore.query.engine import Engine
from trajstore.query.filters import EpisodeFilter, Names, both
from trajstore.query.scan import ScanPlan, loader_plan, scan_plan
from trajstore.storage.log import DataFile


def loader_source(engine: Engine, layouts: LayoutStore, *, run_id: Names, where: str | None,
                  filter: EpisodeFilter | None) -> Source:  # noqa: A002
    """The selected steps of the latest version, pinned: every read of a loader reads these files (``layouts``: where
    they are found and kept)."""
    env_id = None
    if filter is not None and filter.per_episode().is_empty() and not filter.episode_id:
        run_id, env_id, filter = both(run_id, filter.run_id), filter.env_id or None, None  # noqa: A001 - files alone
    if where is None and filter is None:
        version, files = _listing(engine)  # one reading of the log for the files and the layout's basis
        plan = loader_plan(engine, run_id, env_id, files)
    else:
        plan = scan_plan(engine, None, run_id=run_id, env_id=env_id, where=where, filter=filter)
        version, files = _listing(engine)  # after the plan's: if anything, later (a layout kept longer)
    engine.verify_sizes(plan.files)
    _refuse_agents(engine, plan)

    def read(columns: Sequence[str]) -> Iterator[pa.RecordBatch]:
        try:
            yield from read_files(plan.files, plan.schema, list(columns), plan.episode_ids, plan.schemas)
        except (OSError, pa.ArrowException) as exc:
            raise engine.damage(exc, plan.files) or exc

    def episode_values(name: str) -> tuple[np.ndarray, np.ndarray]:
        with engine.snapshot(plan.files, con=engine.cursor()) as snap:
            snap.check_columns([name], view="episodes", field="weight_by")
            rows = snap.arrow(sql.episode_values(name))
        return rows["episode_id"].to_numpy(), rows["value"].to_numpy(zero_copy_only=False).astype(np.float64)

    # the order depends on what is selected, not on how: a state made locally resumes over REST and back
    location = engine.table.location
    key = digest(sorted(location.relative(f.path) for f in plan.files))  # (in any log order)
    chosen = None if plan.episode_ids is None else digest(plan.episode_ids.tolist())
    selection = digest({"run_id": run_id, "env_id": env_id, "where": where, "filter": filter})
    types = plan.types
    arrays = engine.table.arrays

    def stitch(kinds: dict[str, Any]) -> Stitched | None:
        if arrays is None:
            return None
        return stitched.stitch([arrays.read(location.relative(f.path)) for f in plan.files], kinds, plan.episode_ids)

    return Source(plan.schema, read, episode_values, key, {"episodes": chosen}, layouts,
                  _basis(engine, plan, run_id, env_id, selection, version, files),
                  check=lambda names: types.check(names, stackable=True),  # type: ignore[union-attr]
                  stitch=stitch)


def _refuse_agents(engine: Engine, plan: ScanPlan) -> None:
    """An :class:`InputError` naming the runs of the selection that hold multi-agent episodes: a loader's windows
    and transitions follow an episode's rows, which there interleave its agents."""
    schemas = plan.schemas if plan.schemas is not None else engine.table.schemas(plan.files)
    runs = sorted({f.run_id for f, s in zip(plan.files, schemas) if "agent_id" in s.logical.names})
    if runs:
        raise InputError(f"run_id: {', '.join(map(repr, runs))} holds multi-agent episodes (rows with an agent_id); "
                         "training windows and transitions are built from single-agent episodes: select other runs "
                         "(run_id=…), or read an agent's rows with store.sql (their agent_id)")


def _basis(engine: Engine, plan: ScanPlan, run_id: Names, env_id: Names, selection: str, version: int,
           files: list[DataFile]) -> Basis:
    """What vacuum keeps the layout of ``plan`` by: ``version`` (that of ``plan``'s files or later), and the files its
    selection names (every file of ``files``, that version's, when episode-level conditions chose the episodes)."""
    location = engine.table.location
    if plan.episode_ids is not None:
        named = [location.relative(f.path) for f in files]
        return Basis(version, episodes=True, files=layout_files_digest(named), selection=selection)
    runs, envs = (None if v is None else sorted([v] if isinstance(v, str) else map(str, v)) for v in (run_id, env_id))
    named = [location.relative(f.path) for f in plan.files]
    return Basis(version, runs, envs, files=layout_files_digest(named), selection=selection)


def _listing(engine: Engine) -> tuple[int, list[DataFile]]:
    """The version the log reads and its committed files, from one reading of the log (the two may not come from
    two readings: a commit between them would pair a version with another version's files)."""
    state = engine.table.log.read()
    return (-1, []) if state is None else (state.number, state.files)
