"""Group commit: what many writers hand in, committed together, at most one commit of a table per interval.

One Delta table takes one commit at a time, each a new log entry: a service that commits every ingest request on
its own stores at most its commit rate times the request's size (16 actors of 128-step requests: ~940 steps/s at
~8 commits/s), and an object store takes ~15 conditional writes a second on one contended object whatever the
number of writers. Delta's practice is to separate writing data from committing it: many writers write, one
committer orders what they wrote into few, larger commits. A :class:`GroupCommitter` is that committer for one
table in one process:

- **Ingest requests** (:meth:`GroupCommitter.ingest`: rows a :class:`~trajstore.remote.writer.RemoteWriter` sent)
  are each checked on their own, on the caller's thread, against the latest version the committer knows
  (:func:`~trajstore.operations.ingest.prepare`: nothing the client says is trusted; a retry of a stored request is
  recognised first, and one of a request still waiting here is joined to it). Then they wait for the next group.
- **Files written by workers** (:meth:`GroupCommitter.commit_files`, what a
  :class:`~trajstore.operations.handoff.HandedFiles` sink hands over:
  a local writer's Parquet files, written by the worker straight into the table's folder) wait alike.
- **A group** is what waits when the interval since the last commit has passed (``interval_s``), or sooner once it
  holds ``group_bytes``: the requests are checked once more against the version the commit is planned on (only what
  changed since each was checked is read: the committer knows what its own commits stored; another writer's
  appends are read for the episodes they may hold; a delete means reading again), a request that no longer fits —
  or whose key another request of the group took — is refused alone, and the rest are written as one file per
  partition and format (their rows in the order they came) and committed with the workers' files in **one** Delta
  commit, each idempotency key its own ``txn`` action (for a writer that numbers its requests, its latest number).
  Every caller is answered once that commit has landed (:mod:`~trajstore.storage.landing` settles a commit whose
  answer was lost), or with its own error.

Faults: a commit that lost the race to another process's is planned again on the new version (its files written
again); one that did not land fails its group, whose files are removed (kept when the log cannot tell, as orphans
``trajstore vacuum`` removes); a process killed mid-group leaves files no version lists, and its clients' retries
(same keys) are stored once. Memory is the caller's to bound (the service counts each request's bytes from arrival
to answer, :mod:`~trajstore.api.budgets`); a group takes at most ``group_bytes`` of rows (at least one request).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa

from trajstore.errors import CommitError, ConflictError, InputError
from trajstore.operations.continuity import EndsCache, FileEnds, StoredEnd, check_continues
from trajstore.operations.ingest import IdempotencyKey, Prepared, key_of, prepare
from trajstore.retry import tries
from trajstore.storage.log import DataFile, Log, LogCommit, TableState, WrittenFile, files_holding
from trajstore.storage.retention import TXN_RETENTION, interval_seconds
from trajstore.storage.table import StepsTable
from trajstore.write.sink import CommitHook

log = logging.getLogger(__name__)

ATTEMPTS = 30  # tries of one group while other processes keep committing first
KEPT_VERSIONS = 4096  # versions whose changes the committer remembers for the checks of waiting requests, at most
RECENT_VERSIONS = 64  # and at least, older than the oldest waiting check (a request checked against a stale latest)
KEPT_PATHS = 100_000  # handed files remembered as committed (a worker that hands one twice is told it is)
KEYS_PRUNED_FROM = 4_096  # the keys kept before expired ones are first let go (then each time their number doubles)
REFRESH_S = 0.05  # how stale the latest version requests are checked against may get (each is checked again)
REWRITES = frozenset({"compact", "add_column"})  # trajstore's commits that rewrite rows without changing them
_KEYS = frozenset({"episode_id", "step", "terminated", "truncated"})  # what a file's episode ends are made of


@dataclass(frozen=True)
class Outcome:
    """What became of one request or hand-over: committed as ``version`` (None: stored before, a
    ``duplicate``), its new file (``file``, for a request), and the group's size (``group``: requests and hand-overs
    committed together)."""

    version: int | None
    duplicate: bool = False
    file: str | None = None
    group: int = 0


@dataclass(eq=False)
class _Entry:
    """One request (``prepared``) or hand-over (``files``) waiting for its group, and its answer."""

    prepared: Prepared | None = None
    files: tuple[WrittenFile, ...] = ()
    nbytes: int = 0
    future: Future[Outcome] = field(default_factory=Future)
    joined: list[Future[Outcome]] = field(default_factory=list)  # retries of the same request, answered with it
    outcome: Outcome | BaseException | None = None  # once answered
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def key(self) -> IdempotencyKey | None:
        return None if self.prepared is None else self.prepared.key

    def answer(self, outcome: Outcome | BaseException) -> None:
        with self._lock:  # a retry joining from then on is answered at once (:meth:`join`), never left waiting
            if self.outcome is None:
                self.outcome = outcome
            futures = [self.future, *self.joined]
        for i, future in enumerate(futures):
            if future.done():
                continue
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome if i == 0 else Outcome(outcome.version, True, None, outcome.group))

    def join(self, *futures: Future[Outcome]) -> bool:
        """Answer ``futures`` (retries of this request) with it: False if it was answered already with an error
        (a retry is then handled as a request of its own)."""
        with self._lock:
            if self.outcome is None:
                self.joined.extend(futures)
                return True
            outcome = self.outcome
        if isinstance(outcome, BaseException):
            return False
        for future in futures:
            if not future.done():
                future.set_result(Outcome(outcome.version, True, None, outcome.group))
        return True


Ends = dict[tuple[int, Any], StoredEnd]


@dataclass(frozen=True)
class _Change:
    """What one version did that waiting requests care about: the idempotency keys it stored (id -> their version), and
    the ends it made of episodes (``ends``: the committer's own commit, known exactly) or its log entry
    (``commit``: another writer's, read when asked)."""

    apps: dict[str, int]
    ends: Ends | None = None
    commit: LogCommit | None = None


@dataclass
class _Since:
    """What the versions since a group's requests were checked did: the keys they stored (id -> (the table's version,
    the key's)), and, in order, the ends each version that touched the group's episodes made (None: it removed rows,
    read the store again)."""

    read: Callable[[Sequence[DataFile], np.ndarray], list[StoredEnd]]
    keys: dict[str, tuple[int, int]] = field(default_factory=dict)
    changes: list[tuple[int, Ends | None]] = field(default_factory=list)

    def key(self, app_id: str, *, after: int) -> int | None:
        """The key's version a version after ``after`` stored under ``app_id``, or None."""
        found = self.keys.get(app_id)
        return found[1] if found is not None and found[0] > after else None

    def ends(self, prepared: Prepared, state: TableState) -> Ends:
        """What ``state`` holds of the episodes of ``prepared``: what it held at the version it was checked
        against, brought forward by each version since that changed any."""
        ids = _ids(prepared)
        ends: Ends = {(s.episode_id, s.agent_id): s for s in prepared.stored}
        for version, change in self.changes:
            if version <= prepared.checked:
                continue
            if change is None:
                return {(s.episode_id, s.agent_id): s for s in self.read(state.files, _sorted(ids))}
            for key, end in change.items():
                if key[0] in ids:
                    ends[key] = _later(ends.get(key), end)
        return ends


class _Keys:
    """The idempotency keys (app transactions) the latest version this committer knows holds, in memory: read whole
    from the log once (:meth:`~trajstore.storage.log.Log.app_transactions`), then brought forward version by version
    from what each committed (``change``: the committer's own commits from memory, another writer's from its log
    entry). A request's key is looked up here, not with deltalake's ``transaction_version``, which reads the
    checkpoint and every entry since on each call. Where the log cannot be read whole, each look-up asks the
    version itself (:meth:`~trajstore.storage.log.TableState.app_version`). Keys past the table's transaction
    retention answer nothing, as in Delta, and are let go once the keys kept have doubled since the last time: every
    ingest request adds one, so a service serving for days would otherwise keep them all."""

    RETRY = 25  # versions until a log that could not be read whole is tried again

    def __init__(self, log: Log, change: Callable[[int], _Change]) -> None:
        self._log, self._change = log, change
        self._apps: dict[str, tuple[int, int | None]] | None = None
        self._at = -1  # the version _apps holds (or the last one that could not be read whole)
        self._prune_at = KEYS_PRUNED_FROM  # the number of keys at which expired ones are next let go
        self._lock = threading.Lock()

    @property
    def at(self) -> int:
        """The version the keys kept are brought forward from (by each later version's change); with none kept, the
        largest int: nothing to bring forward."""
        return self._at if self._apps is not None else sys.maxsize

    def lookup(self, state: TableState) -> Callable[[str], int | None]:
        """The version the key of an id holds at ``state`` or later (keys only come, or expire), or None."""
        with self._lock:
            if self._apps is not None and self._at < state.number:
                try:
                    for version in range(self._at + 1, state.number + 1):
                        now = int(time.time() * 1000)
                        self._apps.update((k, (v, now)) for k, v in self._change(version).apps.items())
                        self._at = version
                except CommitError:  # an entry gone: read whole again
                    self._apps = None
            if self._apps is None and (self._at < 0 or state.number >= self._at + self.RETRY):
                self._apps, self._at = self._log.app_transactions(state.number), state.number
            if self._apps is None or self._at < state.number:
                return state.app_version
            apps, kept = self._apps, _kept_ms(state)
            if kept is not None and len(apps) >= self._prune_at:
                self._apps = apps = _unexpired(apps, kept)
                self._prune_at = max(2 * len(apps), KEYS_PRUNED_FROM)

        def held(app_id: str) -> int | None:
            found = apps.get(app_id)
            if found is None or (kept is not None and not _alive(found, _oldest_kept(kept))):
                return None
            return found[0]

        return held


def _unexpired(apps: dict[str, tuple[int, int | None]], kept_ms: float) -> dict[str, tuple[int, int | None]]:
    """``apps`` without the keys a look-up no longer answers (older than ``kept_ms``)."""
    oldest = _oldest_kept(kept_ms)
    return {k: v for k, v in apps.items() if _alive(v, oldest)}


def _oldest_kept(kept_ms: float) -> float:
    """The time (ms) before which an app transaction has expired, now."""
    return time.time() * 1000 - kept_ms


def _alive(key: tuple[int, int | None], oldest_ms: float) -> bool:
    """Whether a key (its version, the time it was seen) is still kept: one without a time always is."""
    return key[1] is None or key[1] >= oldest_ms


def _kept_ms(state: TableState) -> float | None:
    """How long ``state``'s table keeps an app transaction (ms), None: for ever."""
    try:
        return interval_seconds(state.properties[TXN_RETENTION]) * 1000
    except (KeyError, InputError):
        return None


class GroupCommitter:
    """The one committer of ``table`` in this process (see the module's docstring): at most one commit per
    ``interval_s`` seconds, sooner once ``group_bytes`` of rows wait; ``upkeep`` told of each partition it wrote.
    Its thread starts with the first request and ends with :meth:`close`."""

    def __init__(self, table: StepsTable, *, interval_s: float = 0.25, group_bytes: int = 64 * 1024 * 1024,
                 upkeep: CommitHook | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        if not interval_s >= 0:
            raise InputError(f"commit_interval: must be a duration >= 0, got {interval_s!r}")
        self.table, self.interval_s, self.group_bytes, self.upkeep = table, interval_s, group_bytes, upkeep
        self.commits = 0  # commits this committer made
        self.groups: list[int] = []  # the size of each group it committed, oldest first (the last 1,000)
        self._clock = clock
        self._wake = threading.Condition()
        self._waiting: list[_Entry] = []
        self._waiting_bytes = 0
        self._keys: dict[str, _Entry] = {}  # the waiting requests by idempotency key
        self._closing = False
        self._thread: threading.Thread | None = None
        self._last_commit = -float("inf")
        self._state: tuple[float, TableState | None] | None = None
        self._state_lock = threading.Lock()
        self._changes: dict[int, _Change] = {}  # what each recent version did (its own commits from memory)
        self._changes_lock = threading.Lock()  # taken to change _changes (requests' threads read it too)
        self._needed_from = 0  # the oldest version whose change waiting requests may still ask for
        self._committed_paths: dict[str, int] = {}  # handed files committed, and their version
        self.ends = EndsCache()  # what each committed file holds of its episodes: its own files' never read
        self._apps = _Keys(table.log, self._change)  # the keys the log holds
        self._schemas: dict[str, tuple[int, pa.Schema | None]] = {}  # env_id -> its stored schema at a version
        self._schemas_lock = threading.Lock()

    # --- what callers hand in ----------------------------------------------------------------------------

    def ingest(self, rows: pa.Table, *, run_id: str, env_id: str, idempotency_key: str | None = None,
               idempotency_sequence: int | None = None) -> Future[Outcome]:
        """Check ``rows`` (an ingest request, see :func:`~trajstore.operations.ingest.prepare`) on this thread and
        hand them to the next group; the future is answered once that group's commit has landed (a
        :class:`Outcome`), or with the request's own error. A request repeated under its ``idempotency_key`` is
        answered as a duplicate: at once when it is stored, with its first try's commit when that one still waits
        here; another request under a used key is a :class:`~trajstore.errors.ConflictError`. With
        ``idempotency_sequence`` the key names a writer, and the number one of its requests (see
        :class:`~trajstore.operations.ingest.IdempotencyKey`)."""
        key = key_of(idempotency_key, idempotency_sequence, rows, run_id=run_id, env_id=env_id)
        if key is not None:
            joined = self._join(key)
            if joined is not None:
                return joined
        state = self.latest()
        prepared = prepare(self.table, state, rows, run_id=run_id, env_id=env_id, key=key, ends=self.ends.ends,
                           schema_of=lambda env: self._stored_schema(state, env),
                           app_version=None if state is None or key is None else self._apps.lookup(state))
        if prepared is None:
            done: Future[Outcome] = Future()
            done.set_result(Outcome(None, duplicate=True))
            return done
        return self._hand(_Entry(prepared, nbytes=prepared.rows.nbytes))

    def commit_files(self, files: Sequence[WrittenFile]) -> Future[Outcome]:
        """Hand ``files`` (written whole into the table's folder by a worker, not committed) to the next group;
        the future is answered once they are committed. Files handed before and committed are a duplicate."""
        if not files:
            raise InputError("files: hand at least one written file")
        if all(f.path in self._committed_paths for f in files):
            done: Future[Outcome] = Future()
            done.set_result(Outcome(self._committed_paths[files[0].path], duplicate=True))
            return done
        return self._hand(_Entry(files=tuple(files), nbytes=sum(f.size for f in files)))

    def latest(self) -> TableState | None:
        """The latest version this committer knows: read again when another commit may have come (at most every
        :data:`REFRESH_S`); requests checked against it are checked again at their commit."""
        now = self._clock()
        with self._state_lock:
            if self._state is not None and now - self._state[0] < REFRESH_S:
                return self._state[1]
            known = None if self._state is None else self._state[1]
            if known is None or self.table.log.has_entry(known.number + 1):
                known = self.table.log.read()
            self._state = (now, known)
            return known

    def _stored_schema(self, state: TableState | None, env_id: str) -> pa.Schema | None:
        """The stored schema of ``env_id`` at ``state`` (:meth:`~trajstore.storage.table.StepsTable.stored_schema`),
        made once per version and environment whatever the number of requests checked against it."""
        if state is None:
            return None
        with self._schemas_lock:
            known = self._schemas.get(env_id)
            if known is None or known[0] != state.number:
                known = (state.number, self.table.stored_schema(env_id=env_id, files=state.files, state=state))
                self._schemas[env_id] = known
            return known[1]

    @property
    def waiting_bytes(self) -> int:
        """The bytes of rows and files waiting for a group."""
        return self._waiting_bytes

    def close(self) -> None:
        """Commit what waits, then stop. Idempotent."""
        with self._wake:
            self._closing = True
            self._wake.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()

    def _join(self, key: IdempotencyKey) -> Future[Outcome] | None:
        """A future answered with the waiting request of ``key`` (a retry of it), if one waits; None also when
        what waits under a writer's key is another of its requests."""
        with self._wake:
            first = self._keys.get(key.app_id)
            first_key = None if first is None else first.key
            if first is None or first_key is None or (key.sequence is not None and
                                                      first_key.sequence != key.sequence):
                return None
            if first_key.version != key.version:
                raise key.conflict()
            joined: Future[Outcome] = Future()
            return joined if first.join(joined) else None

    def _hand(self, entry: _Entry) -> Future[Outcome]:
        with self._wake:
            if self._closing:
                raise CommitError(f"{self.table.uri}: the committer is closed; nothing was stored")
            self._waiting.append(entry)
            self._waiting_bytes += entry.nbytes
            if entry.key is not None:
                self._keys[entry.key.app_id] = entry  # a writer's latest request
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="trajstore-group-commit", daemon=True)
                self._thread.start()
            self._wake.notify_all()
        return entry.future

    # --- the committer's thread ----------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            group = self._next_group()
            if group is None:
                return
            commits = self.commits
            try:
                self._commit(group)
            except BaseException as exc:  # noqa: BLE001 - every caller hears it; the committer goes on
                for entry in group:
                    entry.answer(exc if isinstance(exc, Exception) else CommitError(f"interrupted: {exc!r}"))
            finally:
                with self._wake:
                    for entry in group:
                        if entry.key is not None and self._keys.get(entry.key.app_id) is entry:
                            del self._keys[entry.key.app_id]
                    if self.commits != commits:
                        self._last_commit = self._clock()

    def _next_group(self) -> list[_Entry] | None:
        """The next group, once the interval since the last commit has passed or ``group_bytes`` wait; None when
        closed with nothing waiting."""
        with self._wake:
            while True:
                if not self._waiting:
                    if self._closing:
                        return None
                    self._wake.wait()
                    continue
                wait = self._last_commit + self.interval_s - self._clock()
                if wait <= 0 or self._waiting_bytes >= self.group_bytes or self._closing:
                    break
                self._wake.wait(wait)
            group: list[_Entry] = []
            size = 0
            while self._waiting and (not group or size + self._waiting[0].nbytes <= self.group_bytes):
                entry = self._waiting.pop(0)
                group.append(entry)
                size += entry.nbytes
            self._waiting_bytes -= size
            return group

    def _commit(self, group: list[_Entry]) -> None:
        """Check, write and commit ``group`` as one version (planned again after a lost race)."""
        log_ = self.table.log
        state = log_.ensure(_merged_schema(group))  # this commit's own reading of the log, brought forward below
        self.ends.retain(state.files)  # files compacted away since: their ends are asked about no more
        written: list[WrittenFile] = []
        wrote_for: list[_Entry] = []
        for attempt in tries(ATTEMPTS):
            if attempt:  # another process took the version: planned again on the versions since
                state = log_.advanced(state)
            accepted, ends = self._judge(group, state)
            if accepted != wrote_for:  # the files hold exactly the accepted requests' rows
                self.table.discard([w.path for w in written], None)
                written, wrote_for = [], []
                if not accepted:
                    return
                written, wrote_for = self._write(accepted), accepted
            files = [*written, *(f for e in accepted for f in e.files)]
            apps = list(_versions(accepted).items())
            try:
                landed = log_.commit_group(state, files, apps, metadata={"operation": "append",
                                                                         "group": len(accepted)})
            except BaseException as exc:
                self.table.discard([w.path for w in written], exc)
                raise
            if landed:
                self._landed(state.number + 1, accepted, written, ends)
                return
        self.table.discard([w.path for w in written], None)
        raise CommitError(f"{len(group)} request(s) to {self.table.uri} were not committed: other commits kept "
                          f"coming first ({ATTEMPTS} attempts); nothing was stored, send them again")

    def _judge(self, group: list[_Entry], state: TableState) -> tuple[list[_Entry], Ends]:
        """The entries of ``group`` that still fit the table ``state`` (the others answered: a duplicate, a
        conflict, rows that no longer continue their episodes), and the ends the accepted rows make. Each request
        was checked against a version that held neither its key nor anything past its rows' start: only the
        versions since are looked at (:meth:`_since`)."""
        accepted: list[_Entry] = []
        made: Ends = {}
        apps: dict[str, _Entry] = {}  # each key's latest request accepted
        requests: dict[tuple[str, int], _Entry] = {}  # and every request by its key and version
        since = self._since(group, state)
        for entry in group:
            if entry.future.done():
                continue
            key = entry.key
            if key is not None:
                try:
                    if key.holds(since.key(key.app_id, after=entry.prepared.checked)):  # type: ignore[union-attr]
                        entry.answer(Outcome(None, True))  # stored by a version since its check
                        continue
                    first = requests.get((key.app_id, key.version))
                    if first is not None:  # the same request earlier in this group: answered with it
                        first.join(entry.future, *entry.joined)
                        continue
                    latest = apps.get(key.app_id)  # the key's latest request in this group
                    error = None if latest is None else _out_of_turn(key, latest.key)  # type: ignore[arg-type]
                    if error is not None:
                        raise error
                except ConflictError as exc:
                    entry.answer(exc)
                    continue
            if entry.prepared is not None:
                try:
                    ends = since.ends(entry.prepared, state)
                    ids = _ids(entry.prepared)
                    ends.update({k: v for k, v in made.items() if k[0] in ids})  # earlier requests of the group
                    check_continues(entry.prepared.spans, list(ends.values()), run_id=entry.prepared.run_id,
                                    env_id=entry.prepared.env_id)
                except InputError as exc:
                    entry.answer(exc)
                    continue
                for end in entry.prepared.spans.ends(run_id=entry.prepared.run_id, env_id=entry.prepared.env_id):
                    made[(end.episode_id, end.agent_id)] = end
            if key is not None:
                apps[key.app_id] = requests[(key.app_id, key.version)] = entry
            accepted.append(entry)
        return accepted, made

    def _since(self, group: list[_Entry], state: TableState) -> _Since:
        """What each version since the oldest check of the group's requests did to them: the keys it stored, and
        the ends it made of their episodes (the committer's own commits from memory; another writer's appends read
        once for all the group's episodes; a version that removed rows marked, to be read again)."""
        checked = [e.prepared.checked for e in group if e.prepared is not None and not e.future.done()]
        since = _Since(self.ends.ends)
        if not checked:
            return since
        wanted = {i for e in group if e.prepared is not None for i in _ids(e.prepared)}
        ids = _sorted(wanted)
        for version in range(min(checked) + 1, state.number + 1):
            change = self._change(version)
            for app_id, recorded in change.apps.items():
                since.keys[app_id] = (version, recorded)
            if change.ends is not None:
                found = {k: v for k, v in change.ends.items() if k[0] in wanted}
                if found:
                    since.changes.append((version, found))
                continue
            commit = change.commit
            assert commit is not None
            rewrite = commit.operation in REWRITES or (commit.added and not any(f.data_change for f in commit.added))
            if commit.removed and not rewrite:  # a delete, another engine's rewrite: what it left is read again
                since.changes.append((version, None))
            elif not commit.removed and commit.added:
                held = files_holding(commit.added, ids)
                if held:
                    found = {(s.episode_id, s.agent_id): s for s in self.ends.ends(held, ids)}
                    since.changes.append((version, found))
        return since

    def _change(self, version: int) -> _Change:
        found = self._changes.get(version)
        if found is None:
            commit = self.table.log.commit(version)
            if commit is None:
                raise CommitError(f"{self.table.uri}: the log entry of version {version} is gone; send the "
                                  "request again")
            found = _Change(dict(commit.apps), commit=commit)
            with self._changes_lock:
                found = self._changes.setdefault(version, found)
                self._forget()
        return found

    def _write(self, accepted: list[_Entry]) -> list[WrittenFile]:
        """The rows of the accepted requests as files: one per partition, format and schema, rows in the order they
        came."""
        parts: dict[tuple[Any, ...], list[pa.Table]] = {}
        for entry in accepted:
            if entry.prepared is not None:
                rows = entry.prepared.rows
                key = (entry.prepared.run_id, entry.prepared.env_id, rows.schema.serialize().to_pybytes())
                parts.setdefault(key, []).append(rows)
        written: list[WrittenFile] = []
        try:
            for (run_id, env_id, *_), tables in parts.items():
                rows = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
                written.append(self.table.write(rows, run_id=run_id, env_id=env_id))
                if _KEYS <= set(rows.column_names):  # what the file holds, known: never read to check a request
                    self.ends.learn(written[-1].path, FileEnds.of(rows, run_id=run_id, env_id=env_id))
        except BaseException as exc:
            self.table.discard([w.path for w in written], exc)
            raise
        return written

    def _landed(self, version: int, accepted: list[_Entry], written: list[WrittenFile], ends: Ends) -> None:
        self.commits += 1
        self.groups = [*self.groups[-999:], len(accepted)]
        with self._wake:  # what waiting requests were checked against: they need the changes since
            checked = [e.prepared.checked for e in self._waiting if e.prepared is not None]
        self._needed_from = min([*(c + 1 for c in checked), self._apps.at + 1, version - RECENT_VERSIONS])
        with self._changes_lock:
            self._changes[version] = _Change(_versions(accepted), ends=ends)
            self._forget()
        with self._state_lock:
            self._state = None  # read again by the next request
        files = {(w.run_id, w.env_id): w.path for w in written}
        for entry in accepted:
            if entry.prepared is not None:
                path = files[(entry.prepared.run_id, entry.prepared.env_id)]
            else:
                path = None
                for f in entry.files:
                    self._committed_paths[f.path] = version
            entry.answer(Outcome(version, False, path, len(accepted)))
        while len(self._committed_paths) > KEPT_PATHS:
            del self._committed_paths[next(iter(self._committed_paths))]
        if self.upkeep is not None:
            for run_id, env_id in sorted({*files, *((f.run_id, f.env_id) for e in accepted for f in e.files)}):
                self.upkeep.wrote(run_id, env_id)

    def _forget(self) -> None:
        """Let go of the changes older than any waiting request or key look-up needs (a version's change holds the
        end of every episode it touched: kept for hours of commits, they grew with every request served), and of
        all but the last :data:`KEPT_VERSIONS`. A change let go that is asked for again is read from its log entry."""
        for version in [v for v in self._changes if v < self._needed_from]:
            del self._changes[version]
        while len(self._changes) > KEPT_VERSIONS:
            del self._changes[min(self._changes)]


def _ids(prepared: Prepared) -> set[int]:
    return set(prepared.spans.episode_id.tolist())


def _sorted(ids: set[int]) -> np.ndarray:
    return np.array(sorted(ids), np.int64)


def _later(before: StoredEnd | None, found: StoredEnd) -> StoredEnd:
    """What the store holds of an episode after ``found`` (what later files hold of it) joins ``before``."""
    if before is None or found.last_step >= before.last_step:
        return found if found.end_step is not None or before is None else \
            StoredEnd(found.run_id, found.env_id, found.episode_id, found.last_step, before.end_step, found.agent_id)
    return before


def _merged_schema(group: list[_Entry]) -> pa.Schema:
    """The physical columns of every file the group commits (the table must hold them all first)."""
    fields: dict[str, pa.Field] = {}
    for entry in group:
        schemas = [entry.prepared.rows.schema] if entry.prepared is not None else [f.schema for f in entry.files]
        for schema in schemas:
            for f in schema:
                fields.setdefault(f.name, f)
    return pa.schema(list(fields.values()))


def _versions(accepted: list[_Entry]) -> dict[str, int]:
    """The app transactions committing ``accepted`` records: each key's id and version (a writer's latest number
    where the group holds several of its requests)."""
    return {e.key.app_id: e.key.version for e in accepted if e.key is not None}


def _out_of_turn(key: IdempotencyKey, first: IdempotencyKey) -> ConflictError | None:
    """The error of a request whose key an earlier request of its group holds (another request than it): a
    conflict, or None when both are numbered requests of one writer in the order it sent them (both committed)."""
    if key.sequence is None or first.sequence is None or key.sequence == first.sequence:
        return key.conflict()
    if key.sequence > first.sequence:
        return None
    return ConflictError(f"idempotency_sequence: number {key.sequence} of writer {key.name!r} came after its "
                         f"number {first.sequence}; a writer sends its requests in the order of their numbers")
