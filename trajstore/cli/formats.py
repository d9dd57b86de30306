"""Writing Arrow query results for a shell: an aligned table, CSV, JSON lines or Parquet."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import IO, Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq

from trajstore.errors import InputError
from trajstore.remote.wire import json_safe

OutputFormat = Literal["table", "csv", "json", "parquet"]  # what a CLI command prints its table as
FORMATS = ("table", "csv", "json", "parquet")
MAX_CELL = 40


def write(table: pa.Table, fmt: str, out: IO[str], *, output: str | None = None) -> None:
    """Write ``table`` as ``fmt`` to ``out`` (or to the file ``output``; Parquet needs a file)."""
    if fmt not in FORMATS:
        raise InputError(f"format must be one of {list(FORMATS)}, got {fmt!r}")
    if fmt == "parquet":
        if not output:
            raise InputError("format parquet writes a file: give --output PATH")
        try:
            pq.write_table(table, output, compression="zstd")
        except OSError as exc:
            raise _unwritable(output, exc) from None
        return
    text = {"table": render_table, "csv": render_csv, "json": render_json}[fmt](table)
    if output:
        try:
            Path(output).write_text(text)
        except OSError as exc:
            raise _unwritable(output, exc) from None
    else:
        out.write(text)


def _unwritable(output: str, exc: OSError) -> InputError:
    """The error for an ``--output`` that cannot be written: the flag, the path and why, in words."""
    reason = exc.strerror or str(exc).split("] ", 1)[-1]
    return InputError(f"--output: cannot write {output}: {reason.lower() if exc.strerror else reason}")


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}" if math.isfinite(value) else str(value)
    if isinstance(value, (list, dict)):
        return json.dumps(value, default=str)
    return str(value)


def render_table(table: pa.Table) -> str:
    """Columns aligned under their names; long cells cut with an ellipsis."""
    names = table.column_names
    rows = [[_clip(_cell(v)) for v in row.values()] for row in table.to_pylist()]
    widths = [max([len(n)] + [len(r[i]) for r in rows]) for i, n in enumerate(names)]
    lines = ["  ".join(n.ljust(w) for n, w in zip(names, widths)).rstrip(),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.rjust(w) if _numeric(table, i) else c.ljust(w)
                        for i, (c, w) in enumerate(zip(r, widths))).rstrip() for r in rows]
    lines.append(f"({table.num_rows} row{'s' if table.num_rows != 1 else ''})")
    return "\n".join(lines) + "\n"


def _clip(text: str) -> str:
    return text if len(text) <= MAX_CELL else text[:MAX_CELL - 1] + "…"


def _numeric(table: pa.Table, i: int) -> bool:
    t = table.schema.field(i).type
    return pa.types.is_integer(t) or pa.types.is_floating(t)


def render_csv(table: pa.Table) -> str:
    """CSV with a header; list and struct cells as JSON text."""
    import csv

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(table.column_names)
    for row in table.to_pylist():
        w.writerow([_csv_cell(v) for v in row.values()])
    return buf.getvalue()


def _csv_cell(value: Any) -> Any:
    if isinstance(value, (list, dict)):
        return json.dumps(value, default=str)
    return "" if value is None else value


def render_json(table: pa.Table) -> str:
    """One JSON object per row (JSON lines); NaN and infinities as null."""
    return "".join(json.dumps(json_safe(row), default=str) + "\n" for row in table.to_pylist())
