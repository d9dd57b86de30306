"""The ``steps`` table: Hive-partitioned Parquet files made visible by commits to a Delta Lake log, in a local
directory or under an ``s3://`` prefix (one code path: a :class:`~trajstore.storage.location.Location` gives
the pyarrow filesystem and the deltalake storage options).

:class:`StepsTable` is the files' side — a file written whole and made durable (:meth:`StepsTable.write`), each
committed file's schema and format read once from its footer, files of failed writes cleaned up — and holds the
table's :class:`~trajstore.storage.log.Log` (``table.log``), which reads and commits versions. A file is written
whole first and only then added to the log in one commit, so a writer killed mid-file leaves at most a file no
reader ever lists (on S3, an upload is not an object until it completes). Readers take the committed file list
of one log version.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence
from urllib.parse import quote

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from trajstore.errors import CommitUnknownError, StoreDamagedError, first_line
from trajstore.settings import Settings
from trajstore.storage.arrays import FOLDER as ARRAYS
from trajstore.storage.arrays import FileArrays, StepArrays
from trajstore.storage.cache import FILES, FileCache, FileCopies, FileId, StoreCache, prune_all, store_folder
from trajstore.storage.encoding import EncodingError, FileSchema
from trajstore.storage.location import Location, explain, locate
from trajstore.storage.log import DataFile, Log, TableState, WrittenFile
from trajstore.storage.summaries import FOLDER as SUMMARIES
from trajstore.storage.summaries import Footer, Summaries

log = logging.getLogger(__name__)

SCHEMAS_KEPT = 200_000  # file schemas kept per table (committed files never change)
SHARED_KEPT = 1_000  # distinct schemas kept per table, one copy each however many files have it
FOOTERS_KEPT = 10_000  # footers kept until the files' summaries are written
FOOTER_THREADS = 8  # footers read at once from an object store
COPY_THREADS = 2  # files read into array copies at once (each read whole: its rows in memory)
LISTED_FROM = 8  # an object store's files checked by one listing, not a request each, from this many on
DOWNLOAD_THREADS = 8  # an s3:// store's files copied to this machine at once
BOUND_EVERY_S = 10.0  # a writer keeps its s3:// store's local caches within their bound at most this often
# How each column is encoded, chosen by measuring pyarrow's writer on 1.75M CartPole rows in file order (zstd on
# top of each). Integers that change by small steps or take few small values (env steps and wall times grow by
# the same amount along an env's rows; discrete actions) as bit-packed deltas: 2-3x faster to write than a
# dictionary, whose hash table every value goes through, and smaller (action 9 ms and 0.29 MB against 22 ms and
# 0.23 MB; env_steps 10 ms and 0.02 MB against 13 ms and 0.89 MB); any Parquet reader decodes them.
DELTAS = ("action", "env_steps", "wall_time")
# A dictionary only where a column holds few values that deltas do not pack (flags, text, a user's lineage values);
# the rest plain: env_index (one value per run of an env's rows, 5 ms against 9) and worker_id (one text per
# writer, 11 ms against 19) compress to almost nothing under zstd either way.
DICTIONARY = ("terminated", "truncated", "mode", "policy_version", "seed")


class StepsTable:
    """The Delta table at ``<store>/steps`` (``location``: a directory or an ``s3://`` prefix): its files, and its
    log (``log``; ``pinned``: the version a read-only store reads). With ``arrays`` (a
    :class:`~trajstore.storage.arrays.StepArrays`), loaders of a local table gather from its files' array copies
    (:meth:`array_copies`), made by the first that reads each file, or with ``write_arrays`` by each write; with
    ``summaries`` (:class:`~trajstore.storage.summaries.Summaries`), each file written gets its summary too,
    and readers keep one for each committed file that has none. An ``s3://`` table keeps both on this machine
    (:mod:`~trajstore.storage.cache`), with ``copies`` of its data files that DuckDB reads instead of the bucket's,
    all within ``bound``."""

    def __init__(self, location: Location | str | Path, *, row_group_rows: int = 1024 * 1024,
                 pinned: int | None = None, arrays: StepArrays | None = None, write_arrays: bool = False,
                 summaries: Summaries | None = None, copies: FileCopies | None = None,
                 bound: StoreCache | None = None) -> None:
        self.location = locate(location)
        self.arrays = arrays
        self.write_arrays = write_arrays
        self.summaries = summaries
        self.copies = copies if not self.location.is_local else None
        self.bound = bound
        self._bounded = time.monotonic()
        self.fs = self.location.fs
        self.row_group_rows = row_group_rows
        self.log = Log(self.location, pinned=pinned)
        self._kept_files: tuple[tuple[int, int, int, int], tuple[DataFile, ...]] | None = None  # see files()
        self._schemas: dict[str, FileSchema] = {}
        self._footers: dict[str, Footer] = {}  # footers read, until a summary keeps them (local, with summaries)
        self._shared_schemas: dict[bytes, tuple[pa.Schema, FileSchema]] = {}  # by footer schema (see _shared)
        self._schemas_lock = threading.Lock()

    @classmethod
    def of_store(cls, store: Location, settings: Settings, *, pinned: int | None = None) -> StepsTable:
        """The ``steps`` table of the store at ``store`` as ``settings`` ask for it (its row groups; array copies
        and summaries beside a local table unless turned off): what a :class:`~trajstore.store.Store` reads and
        writes, and what a test of the layers below it opens."""
        options: dict[str, Any] = {"row_group_rows": settings.row_group_rows, "pinned": pinned,
                                   "write_arrays": settings.writer_arrays}
        if store.is_local:
            folder, bound = Path(store.root), None
        elif settings.remote_cache:  # this machine's folder of the store (storage/cache.py)
            folder = Path(os.path.expanduser(settings.remote_cache)) / store_folder(store.uri)
            bound = StoreCache(folder, settings.remote_cache_bytes)
            options.update(copies=bound.add(FileCopies(folder / FILES)), bound=bound)
        else:
            return cls(store.child("steps"), **options)
        if settings.loader_arrays:
            options["arrays"] = StepArrays(folder / ARRAYS)
        if settings.episode_summaries:
            options["summaries"] = Summaries(folder / SUMMARIES)
        for kept in (options.get("arrays"), options.get("summaries")):
            if bound is not None and kept is not None:
                bound.add(kept)
        return cls(store.child("steps"), **options)

    @property
    def caches(self) -> list[FileCache]:
        """What this table keeps of its data files (:mod:`~trajstore.storage.cache`)."""
        return [c for c in (self.arrays, self.summaries, self.copies) if c is not None]

    def file_id(self, f: DataFile) -> FileId | None:
        """The committed file ``f`` as the caches know it (a local file's modification time read now); None for a
        local file that is not there."""
        rel = self.location.relative(f.path)
        if not f.is_local:
            return FileId(rel, f.size)
        try:
            return FileId(rel, f.size, os.stat(f.path).st_mtime_ns)
        except OSError:
            return None

    def forget(self, path: str) -> None:
        """Remove what the caches keep of the data file at ``path`` (a failed write's, an orphan removed)."""
        rel = self.location.relative(path)
        for kept in self.caches:
            kept.remove(rel)

    def prune_caches(self) -> list[str]:
        """Remove what the caches keep of data files no longer in the table's folder (:meth:`FileCache.prune
        <trajstore.storage.cache.FileCache.prune>`), then keep them within their bound; the files pruned."""
        if not self.caches:
            return []
        if self.location.is_local:
            exists = lambda rel: os.path.exists(self.location.path(rel))  # noqa: E731
        else:  # one listing of the bucket's table, not a request per entry
            selector = pafs.FileSelector(self.location.root, recursive=True, allow_not_found=True)
            there = {self.location.relative(i.path) for i in self.fs.get_file_info(selector)
                     if i.type == pafs.FileType.File}
            exists = there.__contains__
        removed = prune_all(self.caches, exists)
        if self.bound is not None:
            self.bound.bound()
        return removed

    def local_copies(self, files: Sequence[DataFile], *, fill: bool = True) -> list[str] | None:
        """Paths of local copies of the committed ``files`` of an ``s3://`` table (each read where kept, made with
        ``fill`` where not, while they fit in half the cache's bound), or None where any has none (or the table is
        local, or keeps no copies): DuckDB then reads the copies as it reads a local table's files."""
        copies = self.copies
        if copies is None or not files:
            return None
        ids = [FileId(self.location.relative(f.path), f.size) for f in files]
        found = [copies.read(i) for i in ids]
        missing = [k for k, p in enumerate(found) if p is None]
        bound = self.bound
        if missing and fill and bound is not None and \
                (bound.max_bytes <= 0 or sum(files[k].size for k in missing) <= bound.max_bytes // 2):
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(min(DOWNLOAD_THREADS, len(missing))) as pool:
                for k, path in zip(missing, pool.map(lambda k: self._download(files[k], ids[k]), missing)):
                    found[k] = path
            log.info("%s: copied %d file(s) to this machine", self.uri, sum(found[k] is not None for k in missing))
            if bound.bound():  # the entries written longest ago went: these copies may be among them
                found = [copies.read(i) for i in ids]
        return None if any(p is None for p in found) else [p for p in found if p is not None]

    def _download(self, f: DataFile, kept: FileId) -> str | None:
        """The copy of the committed file ``f`` made on this machine (None where it cannot be)."""
        def fetch(partial: Path) -> None:
            with self.fs.open_input_stream(f.path) as source, open(partial, "wb") as out:
                while chunk := source.read(8 << 20):
                    out.write(chunk)

        assert self.copies is not None
        return self.copies.fill(kept, fetch)

    @property
    def path(self) -> Any:
        """The table's folder: a :class:`~pathlib.Path` for a local table, else its ``s3://`` URI."""
        return Path(self.location.root) if self.location.is_local else self.location.uri

    @property
    def uri(self) -> str:
        return self.location.uri

    def files(self) -> list[DataFile]:
        """The committed files of the version the log reads (the latest, or the pinned one). On a local disk, the
        list of the latest version is kept while its log entry is the newest (:meth:`Log.newest_entry`): a read
        that asks again (a ``stats`` asks twice, a service once per request) lists the log folder instead of
        opening the log (~0.1 ms against ~5–15 ms)."""
        entry = self.log.newest_entry()
        kept = self._kept_files
        if entry is not None and kept is not None and kept[0] == entry:
            return list(kept[1])
        version = self.log.read()
        if version is None:
            return []
        if entry is not None and version.number == entry[0]:  # else a commit came between: nothing kept
            self._kept_files = (entry, tuple(version.files))
        return list(version.files)

    def column_names(self, state: TableState | None = None) -> list[str]:
        """Every column name the table's schema holds at the version the log reads (``state``: that version, read
        already; each physical name and the field it declares it holds; columns of files since deleted too): what a
        new column's name must differ from in more than case (Delta refuses two that do not)."""
        version = self.log.read() if state is None else state
        if version is None:
            return []
        fields = {d["field"] for d in version.declarations.values() if d and isinstance(d.get("field"), str)}
        return sorted({*version.schema.names, *fields})

    def properties(self) -> dict[str, str]:
        """The table's properties at the version the log reads (none before the first commit)."""
        version = self.log.read()
        return {} if version is None else version.properties

    def size_problem(self, f: DataFile) -> str | None:
        """Why the committed file ``f`` is not what the log says, judged from its size alone (a missing file,
        one of another size), or None. Cheap: no file is opened."""
        if f.is_local:
            try:
                size = os.stat(f.path).st_size
            except FileNotFoundError:
                return f"{f.uri}: committed file is missing"
        else:
            try:
                info = self.fs.get_file_info(f.path)
            except OSError as exc:
                raise explain(exc, self.location) or exc
            if info.type == pafs.FileType.NotFound:
                return f"{f.uri}: committed file is missing"
            size = info.size
        if f.size and size != f.size:
            return f"{f.uri}: is {size} bytes, the log says {f.size}"
        return None

    def size_problems(self, files: Sequence[DataFile]) -> Iterator[str | None]:
        """:meth:`size_problem` of each of ``files``, in order; on an object store from one listing of the table
        where there are more than a few (not a request per file)."""
        if self.location.is_local or len(files) <= LISTED_FROM:
            yield from map(self.size_problem, files)
            return
        selector = pafs.FileSelector(self.location.root, recursive=True, allow_not_found=True)
        try:
            sizes = {i.path: i.size for i in self.fs.get_file_info(selector) if i.type == pafs.FileType.File}
        except OSError as exc:
            raise explain(exc, self.location) or exc
        for f in files:
            size = sizes.get(f.path)
            yield f"{f.uri}: committed file is missing" if size is None else \
                f"{f.uri}: is {size} bytes, the log says {f.size}" if f.size and size != f.size else None

    def stored_schema(self, env_id: str | None = None, *, files: Sequence[DataFile] | None = None,
                      state: TableState | None = None) -> pa.Schema | None:
        """The columns readers get (logical names, decoded types, fixed sizes kept) merged over the committed
        files (``files``: those of a version read already, ``state``; its declarations are those of a file another
        tool wrote), the newest file's first.

        With ``env_id``, over the files of that environment only: observation shapes and dtypes may differ
        between environments, never within one.
        """
        files = [f for f in (self.files() if files is None else files) if env_id is None or f.env_id == env_id]
        if not files:
            return None
        fields: dict[str, pa.Field] = {}
        ordered = sorted(zip(files, self.schemas(files, state=state)), key=lambda p: -p[0].modified_ms)
        problem = self.size_problem(ordered[0][0])  # the schemas may be known: the newest file must be there
        if problem:
            raise StoreDamagedError.of_file(ordered[0][0].uri, problem.split(": ", 1)[1],
                                            self.location.uri.rsplit("/", 1)[0])
        for _, stored in ordered:
            for column in stored.logical:
                fields.setdefault(column.name, column)
        return pa.schema(list(fields.values()))

    def schemas(self, files: Sequence[DataFile], *, state: TableState | None = None) -> list[FileSchema]:
        """Each committed file's :class:`~trajstore.storage.encoding.FileSchema` (from its footer, or for a file
        another tool wrote from the table's declarations: those of ``state``, a version read already that lists
        ``files``, or of the latest), read once per file."""
        with self._schemas_lock:
            known = {f.path: self._schemas[f.path] for f in files if f.path in self._schemas}
        missing = list({f.path: f for f in files if f.path not in known}.values())
        if missing:
            def footer(f: DataFile) -> tuple[Footer, FileSchema | None]:
                found, stored = self._shared(f, self._copied_footer(f) or read_footer(f, self.location))
                if self.summaries is not None:  # what a summary of the file keeps, not read again to write it
                    with self._schemas_lock:
                        if len(self._footers) >= FOOTERS_KEPT:
                            self._footers.clear()
                        self._footers[f.path] = found
                return found, stored

            if len(missing) > 1 and not missing[0].is_local:
                from concurrent.futures import ThreadPoolExecutor

                with ThreadPoolExecutor(FOOTER_THREADS) as pool:
                    footers = list(pool.map(footer, missing))
            else:
                footers = [footer(f) for f in missing]
            declared: Mapping[str, Any] = {}
            if any(stored is None for _, stored in footers):  # another tool's files: the table declares them
                state = self.log.read() if state is None else state
                declared = {} if state is None else state.declarations
            read = [stored or file_schema(f, found, self.location, declared)
                    for f, (found, stored) in zip(missing, footers)]
            known.update((f.path, stored) for f, stored in zip(missing, read))
            self._keep(missing, read)
        return [known[f.path] for f in files]

    def _shared(self, f: DataFile, found: Footer) -> tuple[Footer, FileSchema | None]:
        """The footer ``found`` of one of trajstore's files with the schema, and the
        :class:`~trajstore.storage.encoding.FileSchema`, of every file whose footer holds an equal one (a function of
        the schema alone, metadata included): a table's files share a few schemas, and a service keeping each file's
        it has seen (:meth:`schemas`) kept as many copies as files, a few KB each. Another tool's file is left as it
        is, without a FileSchema: its schema also depends on the table's declarations."""
        if found.nulls is not None:
            return found, None
        key = _schema_key(found.schema)
        with self._schemas_lock:
            hit = self._shared_schemas.get(key)
        if hit is None:
            made = (found.schema, file_schema(f, found, self.location))
            with self._schemas_lock:
                if len(self._shared_schemas) >= SHARED_KEPT:
                    self._shared_schemas.clear()
                hit = self._shared_schemas.setdefault(key, made)
        return (found if hit[0] is found.schema else dataclasses.replace(found, schema=hit[0])), hit[1]

    def _copied_footer(self, f: DataFile) -> Footer | None:
        """The footer of an ``s3://`` table's file ``f`` read from this machine's copy of it, or None where there
        is none, or it cannot be read (the bucket's file is read instead)."""
        if self.copies is None or f.is_local:
            return None
        copy = self.copies.read(FileId(self.location.relative(f.path), f.size))
        if copy is None:
            return None
        try:
            return read_footer(dataclasses.replace(f, path=copy, fs=pafs.LocalFileSystem()))
        except StoreDamagedError:
            log.warning("the local copy of %s cannot be read; reading the store's file", f.uri)
            return None

    def remember(self, files: Sequence[DataFile], footers: Sequence[Footer]) -> None:
        """Take what the footers of committed ``files`` say as read elsewhere (from their summaries), so that
        :meth:`schemas` reads none of them. A footer of trajstore's format gives one schema however many files
        share it (read once, not per file)."""
        declared: dict[str, Any] | None = None
        shared: dict[str, FileSchema] = {}
        read = []
        for f, footer in zip(files, footers):
            if footer.nulls is not None:  # another tool's file: its format from the table's declarations
                if declared is None:
                    state = self.log.read()
                    declared = {} if state is None else dict(state.declarations)
                read.append(file_schema(f, footer, self.location, declared))
            elif footer.key is None:
                read.append(self._shared(f, footer)[1] or file_schema(f, footer, self.location))
            else:
                if footer.key not in shared:
                    shared[footer.key] = file_schema(f, footer, self.location)
                read.append(shared[footer.key])
        self._keep(files, read)

    def _keep(self, files: Sequence[DataFile], read: Sequence[FileSchema]) -> None:
        with self._schemas_lock:
            if len(self._schemas) + len(read) > SCHEMAS_KEPT:
                self._schemas.clear()
                self._footers.clear()
            self._schemas.update((f.path, stored) for f, stored in zip(files, read))

    def footer(self, f: DataFile) -> Footer:
        """What the committed file ``f``'s footer says (:func:`read_footer`), as :meth:`schemas` read it last, or
        read now."""
        with self._schemas_lock:
            found = self._footers.pop(f.path, None)
        return found if found is not None else read_footer(f, self.location)

    def known_schemas(self) -> set[str]:
        """The paths of the files whose schemas :meth:`schemas` holds (reads no footer)."""
        with self._schemas_lock:
            return set(self._schemas)

    # --- writing ----------------------------------------------------------------------------------

    def append(self, data: pa.Table, *, run_id: str, env_id: str) -> str:
        """Write ``data`` (without partition columns) as one Parquet file and commit it. Returns its path."""
        return self.commit(self.write(data, run_id=run_id, env_id=env_id))

    def write(self, data: pa.Table, *, run_id: str, env_id: str) -> WrittenFile:
        """First half of :meth:`append`: write ``data`` as a Parquet file that no reader sees yet, durable before
        any commit lists it (fsynced on a disk; on S3 a completed upload already is)."""
        self.log.writable("write")
        rel = f"run_id={quote(run_id, safe='')}/env_id={quote(env_id, safe='')}/part-{uuid.uuid4().hex}.parquet"
        full = self.location.path(rel)
        try:
            size, modified_ns, footer, body = self._write_file(data, full)
            if self.location.is_local:
                fsync_file(Path(full))
            self._keep_written(FileId(rel, size, modified_ns), footer, data, body, run_id=run_id, env_id=env_id)
        except BaseException as exc:
            self.discard([full], exc)
            if isinstance(exc, OSError):
                raise explain(exc, self.location) or exc
            raise
        return WrittenFile(full, rel, run_id, env_id, size, int(time.time() * 1000), _stats(data), data.schema)

    def _keep_written(self, f: FileId, footer: pa.Schema, data: pa.Table, body: pa.Buffer | None, *, run_id: str,
                      env_id: str) -> None:
        """What the caches keep of the file ``f`` just written, from its rows ``data`` in memory and (on an object
        store) its bytes ``body``: the first read of a store just written reads no footer, and on ``s3://`` no
        bucket either."""
        if self.copies is not None and body is not None:
            self.copies.write(f, body)
        if self.arrays is not None and self.write_arrays:
            self.arrays.write(f, data)
        if self.summaries is not None:  # from the rows in memory: the first read summarizes nothing
            self.summaries.write_rows(f.rel, f.size, f.modified_ns, footer, data, run_id=run_id, env_id=env_id)
        if self.bound is not None and time.monotonic() - self._bounded > BOUND_EVERY_S:
            self._bounded = time.monotonic()
            self.bound.bound()

    def array_copies(self, files: Sequence[DataFile]) -> list[FileArrays | None]:
        """The array copy of each committed file of ``files`` (:mod:`~trajstore.storage.arrays`), made now from the
        file where it has none: the first loader that reads a file pays for its copy, once for every later loader
        and process. All or nothing: where any of ``files`` cannot have one (another tool's file, wide steps, a
        store this process may not write, copies off), those without one stay None (the loader lays the files out
        from Parquet instead) and none is made."""
        if self.arrays is None:
            return [None] * len(files)
        arrays = self.arrays
        ids = [self.file_id(f) for f in files]
        copies = [None if i is None else arrays.read(i) for i in ids]
        missing = [i for i, c in enumerate(copies) if c is None]
        if not missing or not arrays.writable() or any(ids[i] is None for i in missing):
            return copies
        columns = dict(zip(missing, map(arrays.columns, self.schemas([files[i] for i in missing]))))
        if any(c is None for c in columns.values()):
            return copies
        sources = self.local_copies([files[i] for i in missing])  # an s3:// table's: this machine's copies
        paths = {i: files[i].path if sources is None else sources[k] for k, i in enumerate(missing)}
        fs = self.fs if sources is None else pafs.LocalFileSystem()
        with arrays.building():  # another process of this machine may have made them meanwhile
            copies = [c if c is not None else arrays.read(ids[i]) for i, c in enumerate(copies)]  # type: ignore[arg-type]
            missing = [i for i, c in enumerate(copies) if c is None]

            def make(i: int) -> FileArrays | None:
                made = ids[i]
                assert made is not None
                try:  # as stored: physical names, encoded
                    with fs.open_input_file(paths[i]) as source:
                        data = pq.ParquetFile(source).read(columns=columns[i])
                except (OSError, pa.ArrowException) as exc:  # the layout's read of the file says what is wrong
                    log.warning("no loader copy of %s (%s); loaders will read it from Parquet", made.rel, exc)
                    return None
                return arrays.read(made) if arrays.write(made, data) else None

            if len(missing) > 1:
                from concurrent.futures import ThreadPoolExecutor

                with ThreadPoolExecutor(min(COPY_THREADS, len(missing))) as pool:
                    made = list(pool.map(make, missing))
            else:
                made = [make(i) for i in missing]
        for i, copy in zip(missing, made):
            copies[i] = copy
        log.info("%s: made the loaders' array copies of %d file(s)", self.uri, sum(c is not None for c in made))
        return copies

    def delete(self, path: str) -> None:
        """Remove a file of the table that no commit lists (a refused or abandoned write); gone already is fine."""
        try:
            self.fs.delete_file(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            access = explain(exc, self.location)
            if access is not None:  # asking whether it is gone would wait on the same store again
                raise access from exc
            try:
                gone = self.fs.get_file_info(path).type == pafs.FileType.NotFound
            except OSError:
                gone = False
            if not gone:
                raise

    def discard(self, paths: list[str], cause: BaseException | None) -> None:
        """Clean up after a write or commit that failed with ``cause`` (None: refused, nothing committed): remove
        the files it wrote, which no commit lists. Never raises, so the cleanup cannot hide ``cause``.

        Every commit path raises only once the log says its commit did not land
        (:mod:`~trajstore.storage.landing`); the files are kept when that could not be told
        (:class:`~trajstore.errors.CommitUnknownError`) or the call was interrupted, and, on an object store,
        after any failure that came from the store itself (an error, no answer): a PUT of the log entry that got
        no answer may still be on its way, and would then need them, and asking a store that does not answer
        to delete them would only wait again. Files kept by a commit that did not land are listed by no version:
        ``trajstore check`` reports them as orphans and :func:`~trajstore.operations.check.remove_orphans` (or
        ``trajstore vacuum``) removes them."""
        keep = isinstance(cause, CommitUnknownError) or (cause is not None and not isinstance(cause, Exception))
        if paths and (keep or (not self.location.is_local and _from_store(cause))):
            log.info("%s: %d file(s) of a failed write or commit left as they are (if no version lists them, "
                     "`trajstore check` reports them as orphans)", self.uri, len(paths))
            return
        for path in paths:
            try:
                self.delete(path)
                self.forget(path)
            except Exception as exc:  # noqa: BLE001 - the caller raises the error that matters
                log.warning("%s: could not remove the uncommitted file %s: %s", self.uri, path, first_line(exc))

    def reserve(self, types: Mapping[str, pa.DataType], logical: Mapping[str, pa.DataType] | None = None,
                declared: Mapping[str, Mapping[str, Any] | None] | None = None) -> dict[str, str]:
        """The physical name of each column, reserved and declared in the log first (:meth:`Log.reserve
        <trajstore.storage.log.Log.reserve>`)."""
        return self.log.reserve(types, logical, declared)

    def commit(self, written: WrittenFile) -> str:
        """Second half of :meth:`append`: commit ``written``, exactly once (:meth:`Log.append
        <trajstore.storage.log.Log.append>`: safe to call again after it raised). Returns its path."""
        self.log.append(written)
        return written.path

    def _write_file(self, data: pa.Table, path: str) -> tuple[int, int, pa.Schema, pa.Buffer | None]:
        """Write ``data`` as one Parquet file at ``path``; its size in bytes, its modification time (``st_mtime_ns``;
        0 on an object store), the Arrow schema its footer holds (what a reader of its footer gets) and, on an
        object store, its bytes (uploaded whole)."""
        options: dict[str, Any] = {"compression": "zstd", "row_group_size": self.row_group_rows,
                                   "write_statistics": ["episode_id", "step"], **column_encodings(data.schema)}
        footer: list[pq.FileMetaData] = []
        if self.location.is_local:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(data, path, metadata_collector=footer, **options)  # a native file: written without the GIL
            written = os.stat(path)
            return written.st_size, written.st_mtime_ns, footer[0].schema.to_arrow_schema(), None
        buffer = pa.BufferOutputStream()  # encoded in memory, then one upload: the object appears whole or not
        pq.write_table(data, buffer, metadata_collector=footer, **options)
        body = buffer.getvalue()
        with self.fs.open_output_stream(path) as out:
            out.write(body)
        return body.size, 0, footer[0].schema.to_arrow_schema(), body


def column_encodings(schema: pa.Schema) -> dict[str, Any]:
    """The ``use_dictionary`` and ``column_encoding`` options of ``pq.write_table`` for a data file of ``schema``
    (see :data:`DELTAS` and :data:`DICTIONARY`)."""
    deltas = {f.name: "DELTA_BINARY_PACKED" for f in schema if f.name in DELTAS
              and (pa.types.is_integer(f.type) or pa.types.is_timestamp(f.type))}
    return {"use_dictionary": [f.name for f in schema if f.name in DICTIONARY and f.name not in deltas],
            "column_encoding": deltas}


def steps_dataset(files: Sequence[DataFile], schema: pa.Schema) -> ds.FileSystemDataset:
    """A pyarrow dataset over exactly ``files`` (in order; never a listing of their folder), typed as ``schema``
    (stored names): ``run_id`` and ``env_id`` from each file's partition, every column cast to its type in
    ``schema``, columns a file lacks as nulls."""
    partitions = [(ds.field("run_id") == f.run_id) & (ds.field("env_id") == f.env_id) for f in files]
    filesystem = files[0].fs if files else pafs.LocalFileSystem()  # one table's files share its filesystem
    full = schema
    for name in ("env_id", "run_id"):
        if name not in full.names:
            full = full.insert(0, pa.field(name, pa.string()))
    return ds.FileSystemDataset.from_paths([f.path for f in files], schema=full, format=ds.ParquetFileFormat(),
                                           filesystem=filesystem, partitions=partitions)


def read_file_schema(f: DataFile, location: Location | None = None,
                     table: Mapping[str, dict[str, Any] | None] | None = None) -> FileSchema:
    """The :class:`~trajstore.storage.encoding.FileSchema` of one committed file, from its footer (a file another
    tool wrote: from the ``table``'s declarations, see :func:`~trajstore.storage.encoding.foreign_format`). A file
    that is missing or cannot be read, or whose format is unreadable, is a :class:`StoreDamagedError` naming it;
    with the store's ``location``, an object store that fails or does not answer is its
    :class:`~trajstore.errors.StoreAccessError` instead."""
    return file_schema(f, read_footer(f, location, foreign=table is not None), location, table)


def _schema_key(schema: pa.Schema) -> bytes:
    """What tells two schemas apart, their metadata and their fields' included: the schema's IPC message."""
    return schema.serialize().to_pybytes()


def read_footer(f: DataFile, location: Location | None = None, *, foreign: bool = True) -> Footer:
    """What the footer of one committed file says that readers need (:class:`~trajstore.storage.summaries.Footer`:
    its Arrow schema; with ``foreign``, for a file without trajstore's format, its null counts and rows too); a
    file that cannot be read is a :class:`StoreDamagedError` (or :class:`~trajstore.errors.StoreAccessError`, see
    :func:`read_file_schema`)."""
    try:
        with f.fs.open_input_file(f.path) as source:
            meta = pq.ParquetFile(source).metadata
        schema = meta.schema.to_arrow_schema()
        if foreign and (schema.metadata or {}).get(b"trajstore") is None:
            return Footer(schema, null_counts(meta), meta.num_rows)
        return Footer(schema)
    except (OSError, pa.ArrowException) as exc:
        access = None if location is None else explain(exc, location)
        if access is not None:
            raise access from exc
        problem = "is missing" if isinstance(exc, FileNotFoundError) else f"cannot be read ({first_line(exc)})"
        raise StoreDamagedError.of_file(f.uri, problem, _store(location)) from exc


def file_schema(f: DataFile, footer: Footer, location: Location | None = None,
                table: Mapping[str, dict[str, Any] | None] | None = None) -> FileSchema:
    """The :class:`~trajstore.storage.encoding.FileSchema` of the committed file ``f`` whose footer says
    ``footer``; an unreadable format is a :class:`StoreDamagedError` naming it."""
    try:
        return FileSchema.of(footer.schema, where=f.uri, table=table, nulls=footer.nulls or {}, rows=footer.rows)
    except EncodingError as exc:
        raise StoreDamagedError.of_file(f.uri, f"has an unreadable format ({exc})", _store(location)) from exc


def _store(location: Location | None) -> str | None:
    return None if location is None else location.uri.rsplit("/", 1)[0]


def null_counts(meta: pq.FileMetaData) -> dict[str, int | None]:
    """Each top-level column's null values over a file's row groups (the most of its leaves: a null row is a null
    in every leaf), from the footer's statistics; None where a row group has none."""
    out: dict[str, int | None] = {}
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        seen: dict[str, int | None] = {}
        for c in range(group.num_columns):
            chunk = group.column(c)
            name = chunk.path_in_schema.split(".", 1)[0]
            stats = chunk.statistics
            count = stats.null_count if stats is not None and stats.has_null_count else None
            if name in seen and seen[name] is None:
                continue
            seen[name] = None if count is None else max(count, seen.get(name) or 0)
        for name, count in seen.items():
            out[name] = None if count is None or (name in out and out[name] is None) else (out.get(name) or 0) + count
    return out


def missing_files(location: Location, files: Sequence[DataFile]) -> list[DataFile]:
    """The ``files`` that are not in the table's folder (one listing of it, not a request per file)."""
    selector = pafs.FileSelector(location.root, recursive=True, allow_not_found=True)
    found = {os.path.normpath(i.path) if location.is_local else i.path
             for i in location.fs.get_file_info(selector) if i.type == pafs.FileType.File}
    return [f for f in files if (location.normalized(f.path) if location.is_local else f.path) not in found]


def _from_store(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or an error it was raised from) came from the store's side: an object store that failed
    or did not answer, a disk that failed; then whether a commit under way landed is unknown."""
    while exc is not None:
        if isinstance(exc, OSError) and not isinstance(exc, FileNotFoundError):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def fsync_file(path: Path) -> None:
    """``path``'s bytes flushed to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _stats(data: pa.Table) -> dict[str, object]:
    stats: dict[str, object] = {"numRecords": data.num_rows}
    cols = [c for c in ("episode_id", "step") if c in data.column_names]
    if data.num_rows and cols:
        import pyarrow.compute as pc

        stats["minValues"] = {c: pc.min(data[c]).as_py() for c in cols}
        stats["maxValues"] = {c: pc.max(data[c]).as_py() for c in cols}
        stats["nullCount"] = {c: 0 for c in cols}
    return stats
