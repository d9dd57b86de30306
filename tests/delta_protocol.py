"""What other engines write into a store's Delta log, for the tests of the protocol trajstore reads: rows deleted
through a deletion vector (Spark's and Databricks' DELETE once ``delta.enableDeletionVectors`` is set), and protocols
that need reader features.

No engine here writes deletion vectors (deltalake 1.6.6 rewrites files on DELETE even with the property set; Spark has
no Delta jars offline), so the entries are written by hand as Delta's PROTOCOL.md specifies ("Deletion Vectors",
"Deletion Vector Format"): an ``add`` of the same file with a ``deletionVector`` stored inline (``storageType`` ``i``:
the Z85 text of the magic number 1681511377 and the row positions as a portable 64-bit RoaringBitmap), beside the
``remove`` of its old entry. deltalake reads them as the protocol says (:func:`deltalake_episodes`: its DataFusion
scan leaves the rows out), which is what tells these entries are right.
"""

from __future__ import annotations

import json
import struct
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable

LOG = "_delta_log"
Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
MAGIC = 1681511377  # PROTOCOL.md, "Deletion Vector Format"
NO_RUN_CONTAINER = 12346  # a 32-bit RoaringBitmap's cookie without run containers (RoaringFormatSpec)


def z85(data: bytes) -> str:
    """``data`` (a multiple of 4 bytes) in ZeroMQ's Base85 (RFC 32), the text of an inline deletion vector."""
    out = []
    for i in range(0, len(data), 4):
        value, chunk = int.from_bytes(data[i:i + 4], "big"), ""
        for _ in range(5):
            value, digit = divmod(value, 85)
            chunk = Z85[digit] + chunk
        out.append(chunk)
    return "".join(out)


def bitmap(rows: list[int]) -> bytes:
    """Row positions ``rows`` (below 65536) as a deletion vector's bytes: the magic number, then a portable 64-bit
    RoaringBitmap of one bucket (key 0) holding one array container."""
    rows = sorted(set(rows))
    assert rows and rows[-1] < 1 << 16, "one array container holds positions below 65536"
    header = struct.pack("<IIHHI", NO_RUN_CONTAINER, 1, 0, len(rows) - 1, 16)  # one container at offset 16
    return struct.pack("<IQI", MAGIC, 1, 0) + header + struct.pack(f"<{len(rows)}H", *rows)


def inline_deletion_vector(rows: list[int]) -> dict[str, Any]:
    """The ``deletionVector`` of an ``add`` that deletes ``rows`` (positions in its file), stored in the log."""
    raw = bitmap(rows)
    return {"storageType": "i", "pathOrInlineDv": z85(raw + b"\0" * (-len(raw) % 4)), "sizeInBytes": len(raw),
            "cardinality": len(set(rows))}


def entries(table: Path) -> list[list[dict[str, Any]]]:
    """Every version's actions, oldest first (the tests' logs keep every JSON entry)."""
    paths = sorted((table / LOG).glob("[0-9]" * 20 + ".json"))
    return [[json.loads(line) for line in p.read_text().splitlines() if line.strip()] for p in paths]


def live_adds(table: Path) -> dict[str, dict[str, Any]]:
    """The ``add`` action of every committed file (relative path -> action), replayed from the JSON entries."""
    live: dict[str, dict[str, Any]] = {}
    for actions in entries(table):
        for action in actions:
            if "remove" in action:
                live.pop(action["remove"]["path"], None)
            if "add" in action:
                live[action["add"]["path"]] = action["add"]
    return live


def commit(table: Path, actions: list[dict[str, Any]], operation: str) -> int:
    """Write ``actions`` as the next version of the log, as another engine does; returns its number."""
    version = len(entries(table))
    info = {"commitInfo": {"timestamp": int(time.time() * 1000), "operation": operation,
                           "readVersion": version - 1, "engineInfo": "tests/delta_protocol.py"}}
    path = table / LOG / f"{version:020d}.json"
    with open(path, "x") as out:  # put if absent, as every Delta writer commits
        out.write("\n".join(json.dumps(a) for a in [info, *actions]) + "\n")
    return version


def enable_deletion_vectors(table: Path) -> int:
    """Set ``delta.enableDeletionVectors`` with deltalake, which upgrades the protocol to reader version 3 with the
    reader features ``deletionVectors`` (and ``variantType``); returns the new version."""
    DeltaTable(str(table)).alter.set_table_properties({"delta.enableDeletionVectors": "true"})
    return DeltaTable(str(table)).version()


def delete_episode(table: Path, episode_id: int) -> int:
    """Delete the rows of episode ``episode_id`` from the committed file that holds them as Spark does with deletion
    vectors: the file stays, its ``add`` now carries an inline deletion vector of their positions. Returns the new
    version."""
    for rel, add in live_adds(table).items():
        ids = pq.read_table(table / rel, columns=["episode_id"])["episode_id"].to_pylist()
        rows = [i for i, e in enumerate(ids) if e == episode_id]
        if rows:
            remove = {"path": rel, "dataChange": True, "deletionTimestamp": int(time.time() * 1000),
                      "extendedFileMetadata": True, "partitionValues": add["partitionValues"], "size": add["size"]}
            marked = {**add, "deletionVector": inline_deletion_vector(rows)}
            return commit(table, [{"remove": remove}, {"add": marked}], "DELETE")
    raise AssertionError(f"no committed file holds episode {episode_id}")


def purge(table: Path) -> int:
    """Rewrite each committed file that carries a deletion vector without the rows it deletes, as Spark's ``REORG
    TABLE … APPLY (PURGE)`` does: a new file of the rows deltalake keeps (the masks of its ``deletion_vectors()``),
    without trajstore's footer (a rewrite drops it), and the old entry removed; the protocol keeps listing
    ``deletionVectors``. Returns the new version."""
    live = {unquote(rel): add for rel, add in live_adds(table).items()}
    actions: list[dict[str, Any]] = []
    for marked in pa.table(DeltaTable(str(table)).deletion_vectors()).to_pylist():
        rel = next(r for r in live if unquote(marked["filepath"]).endswith("/" + r))
        add, rows = live[rel], pq.read_table(table / rel)
        keep = marked["selection_vector"] + [True] * (rows.num_rows - len(marked["selection_vector"]))
        rows = rows.filter(pa.array(keep)).replace_schema_metadata(None)
        new = f"{rel.rsplit('/', 1)[0]}/part-purged-{uuid.uuid4().hex}.parquet"
        pq.write_table(rows, table / new)
        ids = rows["episode_id"].to_pylist()
        stats = {"numRecords": rows.num_rows, "minValues": {"episode_id": min(ids)},
                 "maxValues": {"episode_id": max(ids)}, "nullCount": {"episode_id": 0}}
        now, part = int(time.time() * 1000), add["partitionValues"]
        actions += [{"remove": {"path": add["path"], "dataChange": False, "deletionVector": add["deletionVector"],
                                "deletionTimestamp": now, "partitionValues": part, "size": add["size"]}},
                    {"add": {"path": new, "partitionValues": part, "size": (table / new).stat().st_size,
                             "modificationTime": now, "dataChange": False, "stats": json.dumps(stats)}}]
    return commit(table, actions, "REORG")


def set_protocol(table: Path, reader: int, features: list[str] | None = None,
                 properties: dict[str, str] | None = None) -> int:
    """Commit a ``protocol`` action with reader version ``reader`` (at 3, its reader features ``features``; writer
    version 7 listing them too, or 5 for reader version 2) and, with ``properties``, the table's ``metaData`` with those
    properties set; returns the new version."""
    writer = 5 if reader == 2 else 7
    protocol: dict[str, Any] = {"minReaderVersion": reader, "minWriterVersion": writer}
    if reader == 3:  # each list exists only at its version 3 / 7 (PROTOCOL.md, "Protocol Evolution")
        protocol["readerFeatures"] = features or []
    if writer == 7:
        protocol["writerFeatures"] = features or []
    actions: list[dict[str, Any]] = [{"protocol": protocol}]
    if properties:
        metadata = [a["metaData"] for version in entries(table) for a in version if "metaData" in a][-1]
        metadata = {**metadata, "configuration": {**metadata.get("configuration", {}), **properties}}
        if properties.get("delta.columnMapping.mode", "none") != "none":
            metadata = mapped(metadata)
        actions.append({"metaData": metadata})
    return commit(table, actions, "SET TBLPROPERTIES")


def mapped(metadata: dict[str, Any]) -> dict[str, Any]:
    """``metaData`` with column mapping's annotations on every column (an id and a physical name of its own, as Spark
    gives them when it turns column mapping on; the files keep the names they were written with)."""
    schema = json.loads(metadata["schemaString"])
    for i, column in enumerate(schema["fields"], start=1):
        column["metadata"] = {**column.get("metadata", {}), "delta.columnMapping.id": i,
                              "delta.columnMapping.physicalName": f"col-{uuid.uuid4()}"}
    configuration = {**metadata["configuration"], "delta.columnMapping.maxColumnId": str(len(schema["fields"]))}
    return {**metadata, "schemaString": json.dumps(schema), "configuration": configuration}


def deltalake_episodes(table: Path) -> set[int]:
    """The episode ids deltalake's own reader gives (its DataFusion scan, which applies deletion vectors)."""
    return set(pa.table(DeltaTable(str(table)).scan(columns=["episode_id"]))["episode_id"].to_pylist())
