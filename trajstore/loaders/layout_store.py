"""Loader layouts kept in the store: built once, found by every later process and machine, removed by vacuum.

A layout (:mod:`~trajstore.loaders.layout`) depends on nothing but the committed files it was read from, the
episodes selected among them, its columns and its derived columns (``return_to_go`` with its ``gamma``). Those
make its key (:class:`LayoutKey`); a later loader over the same files, selection and columns finds it by key,
whatever process, machine or store version asks (a commit to another run leaves a run's layout valid).

In the store, beside ``steps/``::

    layouts/<key>.json          the manifest: what the layout is, which data folder holds it; written last
    layouts/data/<build>/       its files: episode_id.i64, length.i64 (the index), 0.bin, 1.bin, … (columns)
    layouts/locks/<key>.lock    (local stores) held while a process builds that key

A build writes a fresh data folder (named by a random build id), flushes it to disk, then writes the manifest
in one step (a rename on a disk, one PUT on S3). A reader trusts a manifest only, and checks the sizes of the
files it names: a killed build leaves a data folder no manifest names, which no reader uses and vacuum removes.
On one machine, builders of one key take turns on a lock file: the second finds the first one's manifest and
builds nothing. Builders on different machines (an ``s3://`` store) may both build; each writes a complete
folder and a manifest naming it, the last manifest wins, and the other folder is vacuumed later.

On ``s3://`` the files live in the bucket and are mapped from a copy on local disk (``layout_cache``, one folder
per store): a machine that has no copy downloads the data folder its manifest names (the columns' bytes, at the
bucket's speed; one process of the machine, the others wait on the lock) into a temporary folder, flushes it to
disk, renames it into place and only then writes its local manifest. A copy whose files have other sizes than its
manifest says (cut short), or that no local manifest names (a copy killed before its manifest), is copied again,
never read. A local store whose folder cannot be written (read-only) builds its layouts in temporary folders, for
the process alone, as before.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import posixpath
import shutil
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, Callable, Sequence

import pyarrow.fs as pafs

from trajstore.loaders.layout import BrokenLayoutError, Layout, OpenLayouts
from trajstore.storage.cache import FileCache, store_folder
from trajstore.storage.location import Location
from trajstore.storage.table import fsync_file

log = logging.getLogger(__name__)

FOLDER = "layouts"
DATA = "data"
LOCKS = "locks"
FORMAT = 1  # of the files and the manifest; part of every key, so a new format never reads an old layout
UNREFERENCED_GRACE_S = 3600.0  # a data folder no manifest names stays this long: it may be a build in progress


@dataclass(frozen=True)
class LayoutKey:
    """What a layout holds: the committed files read (a digest of their paths relative to the table), the
    episodes selected among them (a digest; None for all), its stored columns with their types, and its derived
    columns."""

    files: str
    episodes: str | None
    columns: tuple[str, ...]
    types: tuple[str, ...]
    derived: tuple[Any, ...] | None = None

    def digest(self) -> str:
        text = json.dumps({"format": FORMAT, **asdict(self)}, sort_keys=True, default=repr)
        return hashlib.sha256(text.encode()).hexdigest()[:40]


@dataclass(frozen=True)
class Basis:
    """How vacuum decides whether a retained version still needs a layout: the version it was built at and
    the selection it was built for (runs and envs, or ``episodes`` when episode-level conditions chose them,
    which any commit may change) with the digest of the files that selection named then."""

    version: int
    run_id: list[str] | None = None
    env_id: list[str] | None = None
    episodes: bool = False
    files: str = ""
    selection: str = ""  # a digest of the selection as the loader was asked for it (run_id, env_id, where, filter)

    def selects(self, run_id: str, env_id: str) -> bool:
        """Whether a file of ``run_id``/``env_id`` belongs to what this selection is read over."""
        if self.episodes:
            return True
        return (self.run_id is None or run_id in self.run_id) and (self.env_id is None or env_id in self.env_id)


def files_digest(paths: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(sorted(paths)).encode()).hexdigest()[:40]


@dataclass
class Manifest:
    """A saved layout: its key's digest, its data folder (relative to ``layouts/``), what :meth:`Layout.load`
    needs, the basis vacuum judges it by, and when it was written."""

    key: str
    data: str
    layout: dict[str, Any]
    basis: dict[str, Any]
    lineage: str = ""  # the same selection and columns: a layout of a later version supersedes this one
    created: float = field(default_factory=time.time)
    format: int = FORMAT

    def encode(self) -> bytes:
        return (json.dumps(asdict(self), sort_keys=True) + "\n").encode()

    @classmethod
    def decode(cls, body: bytes) -> Manifest:
        return cls(**json.loads(body))


class LayoutStore:
    """The layouts of one store: found, built and shared (see the module's description), with the last few
    opened kept in memory for the next epoch.

    ``location`` is the store's; ``cache`` the local folder for copies of an ``s3://`` store's layouts;
    ``shared`` False builds every layout in a temporary folder for the process alone (as loaders did before
    layouts were kept in stores); ``keep`` is how many opened layouts stay in memory."""

    def __init__(self, location: Location, *, cache: str | Path, shared: bool = True, keep: int = 1) -> None:
        self.location = location
        self.shared = shared
        self.opened = OpenLayouts(keep)
        self.cache = Path(os.path.expanduser(str(cache))) / store_folder(location.uri)
        self.local = Path(location.path(FOLDER)) if location.is_local else self.cache
        # this machine's manifests (by key) and, for an s3:// store, copied data folders (by build): written whole,
        # pruned by the one rule of storage/cache.py
        self._manifests = FileCache(self.local, owner=_manifest_key, suffix=".json", name=lambda key: key)
        self._copies = FileCache(self.local / DATA, owner=lambda folder: None, name=_build)

    def get(self, key: LayoutKey, make: Callable[[Path | None], Layout],
            basis: Basis) -> tuple[Layout, Callable[[], None]]:
        """The layout of ``key``: kept in memory, found in the store, or built by ``make(folder)`` into an
        empty folder and saved; and the call that releases it."""
        digest = key.digest()
        if not self.shared:
            return self.opened.get(digest, lambda: self._built(make, None))
        return self.opened.get(digest, lambda: self._find_or_build(key, make, basis))

    # --- finding -----------------------------------------------------------------------------------------

    def _find_or_build(self, key: LayoutKey, make: Callable[[Path | None], Layout], basis: Basis) -> Layout:
        digest = key.digest()
        found = self._find(digest)
        if found is not None:
            return found
        lock = self._lock(digest)
        if lock is None:  # a store (or a cache) we may read but not write
            return self._built(make, None)
        try:  # one process of this machine copies or builds it; the others wait, then find it
            found = self._find(digest)
            if found is None:
                found = self._copy(digest)
            return found if found is not None else self._build(key, digest, make, basis)
        finally:
            lock.close()  # releases the lock

    def _find(self, digest: str) -> Layout | None:
        """The saved layout of ``digest`` on this machine (in the store's folder, or a copy of an ``s3://``
        store's layout), or None."""
        manifest = _read_manifest(self.local / f"{digest}.json")
        return None if manifest is None else self._load(manifest, self.local)

    def _copy(self, digest: str) -> Layout | None:
        """An ``s3://`` store's layout of ``digest`` copied from the bucket, or None."""
        if self.location.is_local:
            return None
        manifest = self._remote_manifest(digest)
        return None if manifest is None else self._download(manifest)

    def _load(self, manifest: Manifest, root: Path) -> Layout | None:
        try:
            return Layout.load(root / manifest.data, manifest.layout)
        except (BrokenLayoutError, OSError) as exc:
            log.warning("loader layout %s is unusable (%s); building it again", manifest.key, exc)
            return None

    # --- building ------------------------------------------------------------------------------------

    def _built(self, make: Callable[[Path | None], Layout], folder: Path | None) -> Layout:
        layout = make(folder)
        if folder is None:  # a kept one says where it went once saved (_build)
            log.info("built loader layout (%d steps) in a temporary folder, for this process alone", layout.steps)
        return layout

    def _build(self, key: LayoutKey, digest: str, make: Callable[[Path | None], Layout], basis: Basis) -> Layout:
        name = f"{DATA}/{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:12]}"
        folder = self.local / name
        folder.mkdir(parents=True)
        try:
            layout = self._built(make, folder)
            layout.save(sync=True)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        lineage = LayoutKey(basis.selection, None, key.columns, key.types, key.derived).digest()
        manifest = Manifest(digest, name, layout.describe(), asdict(basis), lineage)
        if not self.location.is_local:
            try:
                self._upload(folder, name)
                with self.location.fs.open_output_stream(self._remote(f"{digest}.json")) as out:
                    out.write(manifest.encode())  # one PUT: the layout is there for every machine
            except OSError as exc:  # e.g. read-only credentials: this machine keeps its copy
                log.warning("could not save loader layout %s in %s (%s); it stays on this machine only",
                            digest, self.location.uri, exc)
        self._keep_manifest(manifest)
        log.info("built loader layout %s (%d steps) in %s", digest, layout.steps, folder)
        self._supersede(manifest)
        return layout

    def _supersede(self, new: Manifest) -> None:
        """Remove the layouts of ``new``'s lineage (its selection and columns) built at earlier versions: a store
        read version after version (an online learner, a growing dataset) keeps one layout of each, not one per
        version until a vacuum. They are caches of data the store keeps: a process that maps one reads on, and
        a reader of an older version builds it again. Removing one is never an error."""
        version = int(new.basis.get("version", -1))
        try:
            gone = unneeded(self.location, None, grace_s=0.0, lineage=(new.lineage, version))
            for info in gone:
                with contextlib.suppress(OSError):
                    self.location.fs.delete_file(info.path)
            remove_empty_folders(self.location, gone)
            self.prune_copies()
        except OSError as exc:
            log.warning("could not remove the layouts %s supersedes (%s); vacuum will", new.key, exc)

    def _lock(self, digest: str) -> IO[bytes] | None:
        """A lock file held (until closed) while this machine builds ``digest``: other processes here wait for
        it, then find the layout. None when the folder cannot be written (a read-only store)."""
        import fcntl

        try:
            (self.local / LOCKS).mkdir(parents=True, exist_ok=True)
            f = open(self.local / LOCKS / f"{digest}.lock", "a+b")
        except OSError as exc:
            if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise
            log.warning("cannot keep loader layouts in %s (%s); building one for this process alone",
                        self.local, exc)
            return None
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        return f

    # --- s3 -----------------------------------------------------------------------------------------------

    def _remote(self, *parts: str) -> str:
        return self.location.path(FOLDER, *parts)

    def _remote_manifest(self, digest: str) -> Manifest | None:
        def read() -> bytes:
            with self.location.fs.open_input_stream(self._remote(f"{digest}.json")) as stream:
                return stream.read()

        return _decode_manifest(read, digest)

    def _upload(self, folder: Path, name: str) -> None:
        pafs.copy_files(str(folder), self._remote(name), source_filesystem=pafs.LocalFileSystem(),
                        destination_filesystem=self.location.fs, use_threads=True)

    def _download(self, manifest: Manifest) -> Layout | None:
        """The bucket's layout copied to this machine: its data folder into a temporary folder renamed into
        place, then the manifest; None if the bucket's copy is incomplete (a vacuum removed it meanwhile)."""
        try:  # no usable manifest of it here (we hold the lock): a copy there is cut short or damaged, replaced
            with self._copies.writing(manifest.data, folder=True) as partial:
                pafs.copy_files(self._remote(manifest.data), str(partial), source_filesystem=self.location.fs,
                                destination_filesystem=pafs.LocalFileSystem(), use_threads=True)
                for path in partial.iterdir():
                    fsync_file(path)  # on disk before the manifest names it: a crash leaves no copy with holes
        except FileNotFoundError:
            return None
        log.info("copied loader layout %s from %s", manifest.key, self.location.uri)
        layout = self._load(manifest, self.local)
        if layout is not None:
            self._keep_manifest(manifest)
            self.prune_copies()  # a new copy here: the ones the bucket no longer has go
        return layout

    def prune_copies(self, *, grace_s: float = UNREFERENCED_GRACE_S) -> None:
        """Remove this machine's copies of an ``s3://`` store's layouts whose manifest the bucket no longer has
        (a vacuum removed them), and copied data folders no kept manifest names once older than ``grace_s``."""
        if self.location.is_local or not self.local.exists():
            return
        listing = self.location.fs.get_file_info(pafs.FileSelector(self._remote(), allow_not_found=True))
        listed = {posixpath.basename(i.path) for i in listing if i.path.endswith(".json")}
        self._manifests.prune(lambda key: f"{key}.json" in listed, grace_s=0.0)  # unreadable ones too
        named = {m.data for m in map(_read_manifest, self.local.glob("*.json")) if m is not None}
        # a data folder no manifest names is a build in progress, or left: like a temporary, removed once old
        copies = FileCache(self.local / DATA, name=_build,
                           owner=lambda folder: folder.name if f"{DATA}/{folder.name}" in named else None)
        copies.prune(lambda build: True, grace_s=grace_s)

    def _keep_manifest(self, manifest: Manifest) -> None:
        """``manifest`` kept on this machine, whole (written, flushed, then renamed into place)."""
        with self._manifests.writing(manifest.key) as partial, open(partial, "wb") as f:
            f.write(manifest.encode())
            f.flush()
            os.fsync(f.fileno())


def _build(data: str) -> str:
    """A data folder's name under ``data/`` (a manifest names it ``data/<build>``)."""
    return data.split("/")[-1]


def _manifest_key(path: Path) -> str | None:
    """The key of the manifest at ``path``, or None where it cannot be read."""
    manifest = _read_manifest(path)
    return None if manifest is None else manifest.key


def _read_manifest(path: Path) -> Manifest | None:
    return _decode_manifest(path.read_bytes, path)


def _decode_manifest(read: Callable[[], bytes], where: object) -> Manifest | None:
    """The manifest ``read()`` returns; None where there is none, or (warned) where it cannot be decoded."""
    try:
        return Manifest.decode(read())
    except FileNotFoundError:
        return None
    except (ValueError, TypeError) as exc:
        log.warning("loader layout manifest %s is unreadable (%s); building it again", where, exc)
        return None


# --- vacuum --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Horizon:
    """The oldest version a vacuum keeps readable (the one that was current ``older_than`` ago) and its files:
    ``(path relative to the table, run_id, env_id)`` each."""

    version: int
    files: list[tuple[str, str, str]]

    def needs(self, manifest: Manifest) -> bool:
        """Whether this version, or a later one, reads what ``manifest``'s layout holds. The versions that read
        a layout's files form one run of versions (a file removed never comes back, a file added is new), so
        the layout is needed when it was built at this version or later, or when this version's files of its
        selection are still the ones it was built from."""
        if manifest.format != FORMAT:
            return True  # another trajstore's: not ours to judge
        basis = Basis(**manifest.basis)
        if basis.version >= self.version:
            return True
        return files_digest([p for p, run, env in self.files if basis.selects(run, env)]) == basis.files


def unneeded(location: Location, horizon: Horizon | None, *, grace_s: float, now: float | None = None,
             lineage: tuple[str, int] | None = None) -> list[pafs.FileInfo]:
    """The files under the store's ``layouts/`` that no version from ``horizon`` on needs, manifests first (so
    no manifest ever names a removed file): the layouts ``horizon`` does not need (none without a horizon: every
    version is kept), data folders no kept manifest names once older than ``grace_s`` (killed builds, races
    lost), and leftover lock and temporary files as old. With ``lineage`` (a lineage and a version), only the
    layouts of that lineage built before that version, and their data folders."""
    now = time.time() if now is None else now
    root = location.path(FOLDER)
    listing = [i for i in location.fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
               if i.type == pafs.FileType.File]
    old = {i.path for i in listing if i.mtime is None or i.mtime.timestamp() < now - grace_s}
    manifests, data, other = _classify(root, listing)
    kept: set[str] = set()
    kept_keys: set[str] = set()
    released: set[str] = set()  # the data folders of the manifests removed now
    gone: list[pafs.FileInfo] = []
    for info in manifests:
        manifest = _manifest_at(location, info.path)
        if manifest is None:
            gone += [info] if lineage is None and info.path in old else []
        elif lineage is not None:
            if manifest.lineage == lineage[0] and int(manifest.basis.get("version", -1)) < lineage[1]:
                gone.append(info)
                released.add(manifest.data)
            else:
                kept.add(manifest.data)
                kept_keys.add(posixpath.basename(info.path).removesuffix(".json"))
        elif horizon is None or horizon.needs(manifest):
            kept.add(manifest.data)
            kept_keys.add(posixpath.basename(info.path).removesuffix(".json"))
        else:
            gone.append(info)
            released.add(manifest.data)
    for build, infos in sorted(data.items()):
        if build not in kept and (build in released or (lineage is None and all(i.path in old for i in infos))):
            gone += infos
    if lineage is not None:
        return gone
    for info in other:  # lock files of keys no kept manifest has, temporary files: once old
        stem = posixpath.basename(info.path).removesuffix(".lock")
        if info.path in old and stem not in kept_keys:
            gone.append(info)
    return gone


def remove_empty_folders(location: Location, removed: list[pafs.FileInfo]) -> None:
    """The data folders of a local store that the files ``removed`` left empty (on S3 folders are only names)."""
    if not location.is_local:
        return
    for folder in sorted({posixpath.dirname(i.path) for i in removed}, reverse=True):
        with contextlib.suppress(OSError):  # not empty (a file written meanwhile), or gone
            if posixpath.basename(posixpath.dirname(folder)) == DATA:
                os.rmdir(folder)


def _classify(root: str, listing: list[pafs.FileInfo]) -> tuple[list[pafs.FileInfo], dict[str, list[pafs.FileInfo]],
                                                                  list[pafs.FileInfo]]:
    """Manifests (``<key>.json``), data files by build folder (``data/<build>``), and the rest."""
    data: dict[str, list[pafs.FileInfo]]
    manifests, data, other = [], {}, []
    for info in listing:
        parts = posixpath.relpath(info.path, root).split("/")
        if len(parts) == 1 and parts[0].endswith(".json") and not parts[0].startswith("."):
            manifests.append(info)
        elif len(parts) >= 3 and parts[0] == DATA:
            data.setdefault(f"{DATA}/{parts[1]}", []).append(info)
        else:
            other.append(info)
    return manifests, data, other


def _manifest_at(location: Location, path: str) -> Manifest | None:
    try:
        with location.fs.open_input_stream(path) as stream:
            return Manifest.decode(stream.read())
    except (OSError, ValueError, TypeError):
        return None
