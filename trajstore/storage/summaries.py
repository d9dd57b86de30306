"""What readers need of a committed data file without reading it, kept beside the table: its footer's schema and
its episodes' fragments.

A local store keeps, for each committed data file that a reader has summarized (:mod:`trajstore.query.summarized`
computes them), one Arrow IPC file under ``summaries/`` beside ``steps/``::

    summaries/<digest of the file's path in the table>.arrow

whose schema metadata (key ``trajstore``) names the data file (its path in the table, its size in bytes and when it
was last modified) and
holds its footer's Arrow schema (and, for a file another tool wrote, the footer's null counts and rows: what
:func:`~trajstore.storage.table.read_file_schema` reads), and whose rows are the file's *fragments*: one row per
episode (and agent) of the file, the partial aggregates the ``episodes`` view combines (rows, reward sum, first and
last step, ends, lineage at the first step, …).

A summary is a cache of what its data file says, never a second source of truth: it is read only when it names
the committed file's path, size and modification time (committed files never change: a rewrite is a new file; a
file damaged in place is read, and found damaged), written whole into a
temporary file and renamed into place (a killed process leaves at most a temporary file, which nothing reads and
:meth:`Summaries.prune` removes), and removed with its file by vacuum. One that cannot be written or read is
logged and skipped: readers aggregate the file's steps instead.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import pyarrow as pa
import pyarrow.ipc as ipc

log = logging.getLogger(__name__)

FOLDER = "summaries"
FORMAT = 1
META_KEY = b"trajstore"
SUFFIX = ".arrow"
MAPPED_BYTES = 1 << 20  # summaries this large are mapped, not read
TEMPORARY_GRACE_S = 3600.0  # a temporary file this old is a killed writer's


@dataclass(frozen=True)
class Footer:
    """What a data file's footer says that readers need: its Arrow schema (with its metadata), and for a file
    another tool wrote, its null values per column and its rows (None for trajstore's own files)."""

    schema: pa.Schema
    nulls: dict[str, int | None] | None = None
    rows: int | None = None
    key: str | None = field(default=None, compare=False)  # the schema as a summary holds it: equal for equal schemas


@dataclass(frozen=True)
class Summary:
    """One data file's summary: its footer and its episodes' fragments (see :mod:`trajstore.query.summarized`)."""

    footer: Footer
    fragments: pa.Table


class Summaries:
    """The summaries of a local store's data files, under ``folder`` (the store's ``summaries/``)."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self._prefix = os.path.join(str(self.folder), "")
        self._failed = False

    def path_of(self, rel: str) -> str:
        return self._prefix + hashlib.sha256(rel.encode()).hexdigest()[:32] + SUFFIX

    def read(self, rel: str, size: int, modified_ns: int) -> Summary | None:
        """The summary of the data file ``rel`` (its path in the table) of ``size`` bytes, last modified at
        ``modified_ns`` (its ``st_mtime_ns``), or None where there is none, or it names another file, size or time
        (a file changed in place since), or cannot be read whole."""
        path = self.path_of(rel)
        try:
            with open(path, "rb") as source:  # small: read at once; large: mapped (the page cache's own pages)
                body = source.read() if os.fstat(source.fileno()).st_size < MAPPED_BYTES else None
            reader = ipc.open_file(pa.py_buffer(body) if body is not None else pa.memory_map(path))
            meta = json.loads((reader.schema.metadata or {})[META_KEY])
            if meta.get("format") != FORMAT or meta.get("file") != rel or meta.get("size") != size or \
                    meta.get("modified_ns") != modified_ns:
                return None
            footer = Footer(ipc.read_schema(pa.py_buffer(base64.b64decode(meta["footer"]))), meta.get("nulls"),
                            meta.get("rows"), meta["footer"])
            fragments = reader.read_all()
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, pa.ArrowException) as exc:
            log.warning("the summary of %s cannot be read (%s); its steps are read instead", rel, exc)
            return None
        return Summary(footer, fragments.replace_schema_metadata(None))

    def write(self, rel: str, size: int, modified_ns: int, summary: Summary) -> bool:
        """Keep ``summary`` as that of the data file ``rel`` of ``size`` bytes modified at ``modified_ns``, written
        whole by a rename; whether it was. A failure is logged, never raised: readers summarize the file again."""
        try:
            self._write(rel, size, modified_ns, summary)
            return True
        except Exception as exc:  # noqa: BLE001 - a cache: the file's steps are read instead
            (log.debug if self._failed else log.warning)("no summary of %s kept (%s)", rel, exc)
            self._failed = True  # said once (a folder that cannot be written refuses every file)
            return False

    def _write(self, rel: str, size: int, modified_ns: int, summary: Summary) -> None:
        footer = summary.footer
        meta: dict[str, Any] = {"format": FORMAT, "file": rel, "size": size, "modified_ns": modified_ns,
                                "footer": base64.b64encode(footer.schema.serialize().to_pybytes()).decode()}
        if footer.nulls is not None:
            meta.update(nulls=footer.nulls, rows=footer.rows)
        table = summary.fragments.replace_schema_metadata({META_KEY: json.dumps(meta).encode()})
        self.folder.mkdir(parents=True, exist_ok=True)
        partial = self.folder / f".tmp-{uuid.uuid4().hex}"
        try:
            with pa.OSFile(str(partial), "wb") as sink, ipc.new_file(sink, table.schema) as out:
                out.write_table(table)
            os.replace(partial, self.path_of(rel))
        except BaseException:
            partial.unlink(missing_ok=True)
            raise

    def remove(self, rel: str) -> None:
        """Remove the summary of the data file ``rel`` (gone already is fine)."""
        Path(self.path_of(rel)).unlink(missing_ok=True)

    def prune(self, exists: Callable[[str], bool], *, grace_s: float = TEMPORARY_GRACE_S) -> list[str]:
        """Remove the summaries whose data file ``exists(rel)`` says is gone, and temporary files older than
        ``grace_s`` (a process killed while writing one); the files the summaries were of."""
        removed = []
        for path in self._files():
            if path.name.startswith(".tmp-") or not path.name.endswith(SUFFIX):
                if path.stat().st_mtime < time.time() - grace_s:
                    path.unlink(missing_ok=True)
                continue
            try:
                with pa.memory_map(str(path)) as source:
                    rel = json.loads((ipc.open_file(source).schema.metadata or {})[META_KEY])["file"]
            except (OSError, ValueError, KeyError, TypeError, pa.ArrowException):
                if path.stat().st_mtime < time.time() - grace_s:  # unreadable: damaged, or a killed write
                    path.unlink(missing_ok=True)
                continue
            if not exists(rel):
                path.unlink(missing_ok=True)
                removed.append(rel)
        return removed

    def _files(self) -> Iterator[Path]:
        if self.folder.is_dir():
            yield from (p for p in self.folder.iterdir() if p.is_file())
