"""What a training loader reads: the selected steps of the latest committed version, pinned (:func:`loader_source`).

Every read of one loader — the columns its layout is built from, an ``episodes`` column it weights by — reads the
same files, those of the version current when it was made. The :class:`~trajstore.loaders.sequences.Source` also
names what the loader's layouts are kept by (:mod:`~trajstore.loaders.layout_store`): a key of the files read and the
episodes chosen, and the basis vacuum judges them by. With ``agent_id``, the steps are the chosen agents' own
trajectories (:mod:`~trajstore.loaders.agents`); without it, a selection holding multi-agent episodes is refused.
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence

import numpy as np
import pyarrow as pa

from trajstore.errors import InputError
from trajstore.loaders import stitched
from trajstore.loaders.agents import Trajectories, trajectories
from trajstore.loaders.layout import read_files
from trajstore.loaders.layout_store import Basis, LayoutStore
from trajstore.loaders.layout_store import files_digest as layout_files_digest
from trajstore.loaders.order import digest
from trajstore.loaders.sequences import Source
from trajstore.loaders.stitched import Stitched
from trajstore.query import sql
from trajstore.query.engine import Engine
from trajstore.query.filters import EpisodeFilter, Names, both, names_of
from trajstore.query.scan import ScanPlan, loader_plan, scan_plan
from trajstore.query.sql import Where
from trajstore.storage.log import DataFile


def loader_source(engine: Engine, layouts: LayoutStore, *, run_id: Names, where: Where | None,
                  filter: EpisodeFilter | None, agent_id: Names = None,  # noqa: A002
                  complete_only: bool = False, agent_field: str = "agent_id") -> Source:
    """The selected steps of the latest version, pinned: every read of a loader reads these files (``layouts``: where
    they are found and kept). With ``agent_id`` (one agent or several), the trajectories of those agents
    (:mod:`~trajstore.loaders.agents`; ``complete_only``: those whose last row ended them alone; ``agent_field``: the
    caller's name of ``agent_id``, in errors)."""
    asked = {"run_id": run_id, "where": where, "filter": filter}
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
    agents, selected = None, plan  # vacuum judges a layout by the selection's files (not the agents' alone)
    if agent_id is None:
        _refuse_agents(engine, plan)
    else:
        plan, agents = _agent_plan(engine, plan, names_of(agent_id), complete_only, asked, agent_field)

    def read(columns: Sequence[str]) -> Iterator[pa.RecordBatch]:
        try:
            yield from read_files(plan.files, plan.schema, list(columns), plan.episode_ids, plan.schemas)
        except (OSError, pa.ArrowException) as exc:
            raise engine.damage(exc, plan.files) or exc

    def episode_values(name: str) -> tuple[np.ndarray, np.ndarray]:
        with engine.snapshot(plan.files, con=engine.cursor()) as snap:
            snap.check_columns([name], view="episodes", field="weight_by")
            rows = snap.arrow(sql.episode_values(name))
        ids, values = rows["episode_id"].to_numpy(), rows["value"].to_numpy(zero_copy_only=False).astype(np.float64)
        return (ids, values) if agents is None else agents.values(ids, values)

    # the order depends on what is selected, not on how: a state made locally resumes over REST and back
    location = engine.table.location
    key = digest(sorted(location.relative(f.path) for f in plan.files))  # (in any log order)
    chosen = None if plan.episode_ids is None else digest(plan.episode_ids.tolist())
    if agents is not None:  # the layout's key and lineage, and the order's digest, name the agents
        chosen = digest({"episodes": chosen, "agents": agents.agents, "complete": complete_only})
    # a condition as its text: the same whether given as SQL here or parsed by the service
    selection = digest({"run_id": run_id, "env_id": env_id, "where": None if where is None else str(where),
                        "filter": filter,
                        **({} if agents is None else {"agent_id": agents.agents, "complete": complete_only})})
    types = plan.types

    def stitch(kinds: dict[str, Any]) -> Stitched | None:  # the files' copies, made now where missing
        if engine.table.arrays is None:
            return None
        return stitched.stitch(engine.table.array_copies(plan.files), kinds, plan.episode_ids)

    def check_types(names: Sequence[str]) -> None:
        if agents is not None:
            agents.check_alike(names)  # names the agents, before the types name their environment
        types.check_one_type(names, stackable=True)  # type: ignore[union-attr]

    return Source(plan.schema, read if agents is None else agents.reader(read), episode_values, key,
                  {"episodes": chosen}, layouts, _basis(engine, selected, run_id, env_id, selection, version, files),
                  check_types=check_types, stitch=stitch if agents is None else None, trajectories=agents)


def _refuse_agents(engine: Engine, plan: ScanPlan) -> None:
    """An :class:`InputError` naming the runs of the selection that hold multi-agent episodes: a loader's windows
    and transitions follow an episode's rows, which there interleave its agents."""
    schemas = plan.schemas if plan.schemas is not None else engine.table.schemas(plan.files)
    runs = sorted({f.run_id for f, s in zip(plan.files, schemas) if "agent_id" in s.logical.names})
    if runs:
        raise InputError(f"run_id: {', '.join(map(repr, runs))} holds multi-agent episodes (rows with an agent_id), "
                         "whose agents' rows interleave: pass agent_id=… (one agent or several) for windows and "
                         "transitions inside each agent's own trajectory, or select single-agent runs (run_id=…)")


def _agent_plan(engine: Engine, plan: ScanPlan, agents: list[str], complete_only: bool, asked: dict[str, Any],
                field: str) -> tuple[ScanPlan, Trajectories]:
    """``plan`` narrowed to the files holding rows of ``agents`` (their own types), and those agents'
    trajectories."""
    schemas = plan.schemas if plan.schemas is not None else engine.file_schemas(plan.files)
    where = "the selection (" + ", ".join(f"{k}={v!r}" for k, v in asked.items() if v is not None) + ")" \
        if any(v is not None for v in asked.values()) else "the store"
    try:
        files, held, found = trajectories(plan.files, schemas, plan.schema, plan.episode_ids, agents, where=where,
                                          complete_only=complete_only, field=field)
    except (OSError, pa.ArrowException) as exc:
        raise engine.damage(exc, plan.files) or exc
    types = engine.step_types(files)
    schema = pa.schema([types.schema.field(f.name) if f.name in types.schema.names else f for f in plan.schema])
    return ScanPlan(files, schema, plan.columns, plan.episode_ids, types, held), found


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
