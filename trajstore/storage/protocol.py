"""The Delta protocol trajstore reads, and the refusal of a table version that needs more.

trajstore reads a version of the ``steps`` table as deltalake lists its committed files (deltalake replays the log:
JSON entries, classic checkpoints) and then reads those Parquet files as they are, by column name, with DuckDB and
pyarrow. A version's ``protocol`` action says what a reader must do beyond that (Delta's PROTOCOL.md, "Protocol
Evolution" and "Table Features"): ``minReaderVersion`` 1 asks nothing, 2 is column mapping, 3 lists the
``readerFeatures`` a reader must implement, and a reader that lacks one must refuse the table, or it returns other
data than the table holds (rows another engine deleted, nulls for renamed columns). What each reader feature means
for reading the file list and the Parquet files, and what trajstore does with it (:data:`READ`):

- ``deletionVectors``: a file's rows that another engine deleted without rewriting the file, marked in a deletion
  vector on its ``add`` action. trajstore applies none, so it reads the feature only where it is unused: a table
  that supports it (Spark and Databricks enable it on new tables; deltalake lists it once
  ``delta.enableDeletionVectors`` is set, and after a ``REORG … APPLY (PURGE)`` it stays) is read while no
  committed file carries a deletion vector; one that does is refused (:func:`deletion_vector_error`), protocol or
  not (the log layer looks at every version's files).
- ``timestampNtz``: a column type (timestamps without a time zone) that Parquet stores as such: read as it is.
- ``variantType`` (and ``variantType-preview``): a column type stored unshredded as a struct of binary ``metadata``
  and ``value``, which a reader may expose as that struct (the protocol's "Reader Requirements for Variant Data
  Type"). deltalake 1.6 lists it whenever it upgrades a table to reader version 3.
- ``columnMapping`` (and reader version 2): files name their columns by physical names or field ids. Read while
  ``delta.columnMapping.mode`` is ``none`` (the files then use the schema's names), refused in ``name`` or ``id``
  mode.
- Everything else is refused: ``typeWidening`` (older files hold narrower types a reader must convert),
  ``v2Checkpoint`` (file lists in UUID-named checkpoints and their sidecars, which deltalake 1.6 does not write and
  which nothing here could test), ``vacuumProtocolCheck`` (it asks nothing of readers but that every vacuum check the
  table's writer features first, which trajstore's vacuum, deleting the files no version lists, does not; and
  deltalake 1.6 refuses such a table for everything but listing its files, deletion vectors included),
  ``variantShredding``, ``catalogManaged``, and any name trajstore does not know; so is a ``minReaderVersion``
  above 3. A version deltalake cannot even open for its protocol is refused alike, from the protocol action of the
  log's entries.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from trajstore.errors import UnsupportedTableError

__all__ = ["READ", "READER_VERSION", "MAPPING_MODE", "refused", "feature_error", "deletion_vector_error"]

READER_VERSION = 3  # the highest minReaderVersion trajstore reads (with the reader features of READ)
READER_VERSION_NAME = "minReaderVersion"
MAPPING_MODE = "delta.columnMapping.mode"  # the table property that turns column mapping on (name, id) or off (none)
DELETION_VECTORS = "deletionVectors"
COLUMN_MAPPING = "columnMapping"
READ = frozenset({DELETION_VECTORS, "timestampNtz", "variantType", "variantType-preview",
                  COLUMN_MAPPING})  # read as this module says: deletion vectors and column mapping while unused
MAX_NAMED = 3  # files named in a message


def refused(reader_version: int, reader_features: Sequence[str] | None,
            properties: Mapping[str, str]) -> dict[str, str]:
    """What a version's protocol (``minReaderVersion``, ``readerFeatures``) and table ``properties`` ask of readers
    that trajstore does not implement: each feature's name -> what about it is refused (``""``: the feature itself);
    empty when trajstore reads the version."""
    out: dict[str, str] = {}
    if reader_version > READER_VERSION:
        out[READER_VERSION_NAME] = f"{reader_version} (trajstore reads up to {READER_VERSION})"
    features = set(reader_features or ())
    if reader_version == 2:  # reader version 2 is column mapping, without a list of features
        features.add(COLUMN_MAPPING)
    mode = str(properties.get(MAPPING_MODE) or "none").lower()
    if COLUMN_MAPPING in features and mode != "none":
        out[COLUMN_MAPPING] = f"{MAPPING_MODE} = {mode}"
    out.update((name, "") for name in sorted(features - READ))
    return out


def feature_error(uri: str, version: int, reader_version: int, features: Mapping[str, str]) -> UnsupportedTableError:
    """The error for version ``version`` of the table at ``uri``, whose protocol (``minReaderVersion``
    ``reader_version``) needs ``features`` (:func:`refused`)."""
    named = [f"{name} ({why})" if why else name for name, why in features.items() if name != READER_VERSION_NAME]
    needs = [f"the reader feature(s) {', '.join(named)}"] if named else []
    if READER_VERSION_NAME in features:
        needs.append(f"{READER_VERSION_NAME} {features[READER_VERSION_NAME]}")
    drop = next((name for name in features if name != READER_VERSION_NAME), None)
    remedy = f"remove it with the engine that added it (Spark: ALTER TABLE delta.`{uri}` DROP FEATURE {drop})" \
        if drop else "downgrade its protocol with the engine that upgraded it"
    return UnsupportedTableError(
        f"{uri} at version {version}: the Delta table needs {' and '.join(needs)}, which trajstore does not "
        "implement: it reads the committed Parquet files as they are, so it refuses the table rather than read "
        "other data than the table holds. Read a version from before (`trajstore history` lists them; then "
        f"version=N), or {remedy}", features=list(features), version=version)


def deletion_vector_error(uri: str, version: int, files: Sequence[str], *,
                          cause: str | None = None) -> UnsupportedTableError:
    """The error for version ``version`` of the table at ``uri``, whose committed ``files`` carry deletion vectors
    (``cause``: why deltalake could not list them, then ``files`` is empty)."""
    which = (f"rows of it were deleted through deletion vectors (the Delta reader feature {DELETION_VECTORS}: another "
             f"engine marked them deleted without rewriting their file); {len(files)} committed file(s) carry one, "
             f"first {', '.join(files[:MAX_NAMED])}") if files else \
        f"whether rows of it were deleted through deletion vectors cannot be told: deltalake cannot list them ({cause})"
    return UnsupportedTableError(
        f"{uri} at version {version}: {which}. trajstore "
        "reads the files as they are and does not apply deletion vectors, so it refuses the table rather than serve "
        "the deleted rows. Rewrite those files without deletion vectors with the engine that deleted them (Spark: "
        f"REORG TABLE delta.`{uri}` APPLY (PURGE)), after which trajstore reads the table; or read a version from "
        "before the delete (`trajstore history` lists them; then version=N)",
        features=[DELETION_VECTORS], version=version)
