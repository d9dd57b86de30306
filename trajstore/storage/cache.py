"""What a store keeps beside its table, on local disk, about its committed data files: one rule for every kind.

A cache entry belongs to one committed data file (its path in the table, :class:`FileId`) and is read only while it
names that file as it is (path, size and, on a disk, modification time: committed files never change, so on an object
store path and size are enough). Every kind of entry (:mod:`~trajstore.storage.summaries`: a file's footer and
episode fragments; :mod:`~trajstore.storage.arrays`: its decoded numeric columns; :class:`FileCopies`: the file's own
bytes, for an ``s3://`` store) is kept by a :class:`FileCache` under one folder, by the same rule:

- **written whole**: into a temporary name (``.tmp-…``) in the cache's folder, then renamed into place
  (:meth:`FileCache.writing`); a killed process leaves at most a temporary, which nothing reads;
- **removed with its file**: a write that failed, a vacuum (:meth:`FileCache.remove`);
- **pruned by one rule** (:meth:`FileCache.prune`): temporaries older than a grace (a killed writer's), entries whose
  file is no longer in the table, entries that cannot be read once as old; and, for a cache with a size bound
  (:class:`StoreCache`), the entries written longest ago past the bound.

A local store keeps its caches beside ``steps/`` (``summaries/``, ``arrays/``). An ``s3://`` store keeps them in a
folder of this machine (:func:`store_folder` under the ``remote_cache`` setting, bounded by ``remote_cache_bytes``),
filled by writers from the rows in memory, as locally, and by readers at their first read; with a copy of each data
file (``files/``) from which DuckDB reads local bytes, as Databricks' disk cache of remote Parquet does. None of it is
a source of truth: the Delta table alone says which files a version has, and an entry that is missing, cut short or
of another file is made again from the table.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

log = logging.getLogger(__name__)

TEMPORARY = ".tmp-"  # the prefix of an entry being written
TEMPORARY_GRACE_S = 3600.0  # a temporary this old is a killed writer's
FILES = "files"  # an s3:// store's copies of its data files, under its local cache folder


@dataclass(frozen=True)
class FileId:
    """A committed data file as a cache knows it: its path relative to the table, its size in bytes, and its
    modification time (``st_mtime_ns`` on a disk; 0 on an object store, whose objects never change in place)."""

    rel: str
    size: int
    modified_ns: int = 0

    def meta(self) -> dict[str, Any]:
        """What an entry records of its file."""
        return {"file": self.rel, "size": self.size, "modified_ns": self.modified_ns}

    def named_by(self, meta: Mapping[str, Any]) -> bool:
        """Whether an entry recording ``meta`` is of this file as it is."""
        return meta.get("file") == self.rel and meta.get("size") == self.size and \
            meta.get("modified_ns", 0) == self.modified_ns


def digest_name(rel: str) -> str:
    """An entry's name for the data file ``rel``: a digest of its path (fixed length, one folder level)."""
    return hashlib.sha256(rel.encode()).hexdigest()[:32]


def store_folder(uri: str) -> str:
    """The folder of one store's caches under a machine's cache folder: readable, and unique by the URI."""
    readable = "".join(c if c.isalnum() or c in "-_." else "_" for c in uri.split("://")[-1])[-48:]
    return f"{readable}-{hashlib.sha256(uri.encode()).hexdigest()[:12]}"


class FileCache:
    """Entries (a file or a folder each) kept under ``folder``, one per committed data file, named ``name(rel)``
    plus ``suffix``; ``owner(entry)`` says which file an entry is of (None: it cannot be read). Other names in the
    folder (hidden ones, a lock file; with a suffix, names without it) are not entries."""

    def __init__(self, folder: str | Path, *, owner: Callable[[Path], str | None], suffix: str = "",
                 name: Callable[[str], str] = digest_name) -> None:
        self.folder = Path(folder)
        self.suffix = suffix
        self._owner = owner
        self._name = name
        self._prefix = os.path.join(str(self.folder), "")

    def path_of(self, rel: str) -> str:
        """Where the entry of the data file ``rel`` is."""
        return self._prefix + self._name(rel) + self.suffix

    @contextlib.contextmanager
    def writing(self, rel: str, *, folder: bool = False, keep: Callable[[], bool] | None = None) -> Iterator[Path]:
        """A temporary path (a folder with ``folder``) to write the entry of ``rel`` into; renamed into place when
        the block ends without an error, removed when it raises. An entry there already is replaced, unless
        ``keep()`` says it is whole (another process wrote it first): then the new one is dropped."""
        self.folder.mkdir(parents=True, exist_ok=True)
        partial = self.folder / f"{TEMPORARY}{uuid.uuid4().hex}"
        if folder:
            partial.mkdir()
        try:
            yield partial
            target = Path(self.path_of(rel))
            if target.parent != self.folder:
                target.parent.mkdir(parents=True, exist_ok=True)
            if not folder:
                os.replace(partial, target)
                return
            try:
                partial.rename(target)
            except OSError:  # a folder there: another process's (kept when whole), or one cut short (replaced)
                if keep is not None and keep():
                    shutil.rmtree(partial, ignore_errors=True)
                    return
                shutil.rmtree(target, ignore_errors=True)
                partial.rename(target)
        except BaseException:
            _remove(partial)
            raise

    def remove(self, rel: str) -> None:
        """Remove the entry of the data file ``rel`` (gone already is fine)."""
        _remove(Path(self.path_of(rel)))

    def entries(self) -> Iterator[Path]:
        """Every entry and temporary under the folder."""
        if not self.folder.is_dir():
            return
        for path in self.folder.iterdir():  # other hidden names (a lock file), or of another suffix, are not entries
            if path.name.startswith(TEMPORARY) or (not path.name.startswith(".") and path.name.endswith(self.suffix)):
                yield path

    def prune(self, exists: Callable[[str], bool], *, grace_s: float = TEMPORARY_GRACE_S,
              now: float | None = None) -> list[str]:
        """Remove the entries whose data file ``exists(rel)`` says is gone, and temporaries and unreadable entries
        older than ``grace_s`` (a process killed while writing one); the files whose entries went."""
        now = time.time() if now is None else now
        removed = []
        for path in list(self.entries()):
            try:
                old = path.stat().st_mtime < now - grace_s
            except FileNotFoundError:
                continue
            rel = None if path.name.startswith(TEMPORARY) else self._owner(path)
            if rel is None:
                if old:
                    _remove(path)
            elif not exists(rel):
                _remove(path)
                removed.append(rel)
        return removed

    def sized(self) -> Iterator[tuple[float, int, Path]]:
        """Each entry's modification time, bytes and path (temporaries left out: they are being written)."""
        for path in list(self.entries()):
            if path.name.startswith(TEMPORARY):
                continue
            with contextlib.suppress(FileNotFoundError):
                yield path.stat().st_mtime, _bytes(path), path


class FileCopies(FileCache):
    """An ``s3://`` store's data files copied whole to local disk, at their paths in the table (so that a reader of
    the copies sees the table's ``run_id=…/env_id=…`` partitions in their paths); a copy is read only when it has
    the committed file's size."""

    def __init__(self, folder: str | Path) -> None:
        super().__init__(folder, owner=self._relative, name=lambda rel: rel)

    def _relative(self, path: Path) -> str | None:
        return path.relative_to(self.folder).as_posix()

    def read(self, f: FileId) -> str | None:
        """The path of the copy of ``f``, or None where there is none of its size."""
        path = self.path_of(f.rel)
        try:
            return path if os.stat(path).st_size == f.size else None
        except OSError:
            return None

    def write(self, f: FileId, body: Any) -> bool:
        """Keep ``body`` (the file's bytes) as the copy of ``f``; whether it was. A failure is logged, never raised."""
        try:
            with self.writing(f.rel) as partial, open(partial, "wb") as out:
                out.write(body)
            return True
        except Exception as exc:  # noqa: BLE001 - a cache: the file is read from the store instead
            log.warning("no local copy of %s kept (%s)", f.rel, exc)
            return False

    def fill(self, f: FileId, download: Callable[[Path], None]) -> str | None:
        """The copy of ``f``, made by ``download(path)`` where there is none; None when it cannot be made."""
        found = self.read(f)
        if found is not None:
            return found
        try:
            with self.writing(f.rel) as partial:
                download(partial)
                if partial.stat().st_size != f.size:
                    raise OSError(f"{partial.stat().st_size} bytes copied, the log says {f.size}")
        except Exception as exc:  # noqa: BLE001 - a cache: the file is read from the store instead
            log.warning("no local copy of %s made (%s)", f.rel, exc)
            return None
        return self.read(f)

    def entries(self) -> Iterator[Path]:
        """Every copy (at any depth) and temporary under the folder."""
        if not self.folder.is_dir():
            return
        for root, _, names in os.walk(self.folder):
            yield from (Path(root, name) for name in names)

    def remove(self, rel: str) -> None:
        super().remove(rel)
        parent = Path(self.path_of(rel)).parent
        while parent != self.folder and parent.is_relative_to(self.folder):  # partition folders left empty
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent


class StoreCache:
    """The caches of one ``s3://`` store on this machine (under ``folder``), their bytes bounded by ``max_bytes``
    (0: no bound): past the bound, the entries written longest ago go first (:meth:`bound`); a reader copies files
    to this machine only while they take at most half of it."""

    def __init__(self, folder: str | Path, max_bytes: int) -> None:
        self.folder = Path(folder)
        self.max_bytes = max_bytes
        self.caches: list[FileCache] = []

    def add(self, cache: FileCache) -> FileCache:
        self.caches.append(cache)
        return cache

    def bound(self) -> int:
        """Remove the entries written longest ago until the caches hold at most ``max_bytes``; the bytes freed."""
        if self.max_bytes <= 0:
            return 0
        entries = sorted((e for c in self.caches for e in c.sized()), key=lambda e: e[0])
        total = sum(size for _, size, _ in entries)
        freed = 0
        for _, size, path in entries:
            if total - freed <= self.max_bytes:
                break
            _remove(path)
            freed += size
        if freed:
            log.info("%s: removed %d bytes of cached entries past the bound of %d", self.folder, freed, self.max_bytes)
        return freed


def prune_all(caches: Sequence[FileCache | None], exists: Callable[[str], bool], *,
              grace_s: float = TEMPORARY_GRACE_S) -> list[str]:
    """:meth:`FileCache.prune` of each of ``caches`` there is."""
    return [rel for c in caches if c is not None for rel in c.prune(exists, grace_s=grace_s)]


def _bytes(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
