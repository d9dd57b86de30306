"""How many rows of steps one answer that is not streamed may hold: as many as fit in ``max_page_bytes``.

A JSON page of steps takes ~25 times its rows' Arrow size in the server (a Python object per value, then the
text), so a page of image observations at the ``max_page_size`` of rows would take gigabytes. Pages of wide
rows hold fewer rows instead (the answer says which ``limit`` applied), and an answer that must be whole
(every step of one episode) is refused past it, naming the streams that have no such limit.
"""

from __future__ import annotations

from typing import Sequence

import pyarrow as pa

from trajstore.errors import ResultTooLargeError, size_text
from trajstore.query.scan import row_bytes as stored_row_bytes
from trajstore.store import Store

VARYING_BYTES = 16  # the least a value of a string (or varying list) column is counted: a short string


def row_bytes(store: Store, columns: Sequence[str], env_ids: Sequence[str] | None = None) -> int:
    """The most bytes one step of ``columns`` (every stored column if empty) takes decoded, over the store's
    environments (or ``env_ids``): fixed-width types exactly, others (strings, lists of varying length) as
    their files' footers say, and at least :data:`VARYING_BYTES` each. At least 1."""
    files = store.maintain.files()
    widest = 0
    for env_id in sorted({f.env_id for f in files if env_ids is None or f.env_id in env_ids}):
        schema = store.schema(env_id)
        names = [n for n in (columns or schema.names) if n in schema.names]
        fixed = [n for n in names if _fixed_bytes(schema.field(n).type) is not None]
        size = sum(_fixed_bytes(schema.field(n).type) or 0 for n in fixed)
        varying = [n for n in names if n not in fixed]
        if varying:  # a dictionary-encoded column's footer counts its indices: a short string at least
            size += max(int(stored_row_bytes([f for f in files if f.env_id == env_id], varying)),
                        VARYING_BYTES * len(varying))
        widest = max(widest, size)
    return max(1, widest)


def _fixed_bytes(kind: pa.DataType) -> int | None:
    """The bytes one value of ``kind`` takes, if all its values take the same (None otherwise)."""
    if pa.types.is_fixed_size_list(kind):
        inner = _fixed_bytes(kind.value_type)
        return None if inner is None else kind.list_size * inner
    if pa.types.is_struct(kind):
        sizes = [_fixed_bytes(kind.field(i).type) for i in range(kind.num_fields)]
        return None if None in sizes else sum(s or 0 for s in sizes)
    if pa.types.is_boolean(kind):
        return 1
    if pa.types.is_dictionary(kind):  # decoded, as JSON writes it
        return None
    try:
        return max(1, kind.bit_width // 8)
    except ValueError:  # strings, lists: no fixed width
        return None


def page_rows(store: Store, columns: Sequence[str], max_page_bytes: int,
              env_ids: Sequence[str] | None = None) -> int:
    """How many steps of ``columns`` (of the environments ``env_ids``, or all) fit in ``max_page_bytes`` (at
    least one)."""
    return max(1, max_page_bytes // row_bytes(store, columns, env_ids))


def too_large(episode_id: int, rows: int, max_page_bytes: int) -> ResultTooLargeError:
    """The error for an episode whose steps do not fit in one answer (more than ``rows`` of them)."""
    return ResultTooLargeError(
        f"episode_id {episode_id}: has more than {rows} steps, over the {size_text(max_page_bytes)} one answer "
        f"may hold (max_page_bytes); page them with GET /steps?format=json&episode_id={episode_id} or stream "
        f"them with GET /steps?episode_id={episode_id}")
