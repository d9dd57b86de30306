"""Writing Arrow query results for a shell: an aligned table, CSV, JSON lines or Parquet.

A table is for people: numbers to 4 significant digits (every digit in the other formats), times to the second, and
as wide as the terminal (:func:`terminal_width`). A table wider than that is wrapped: its columns are printed in
blocks that each fit, the key columns (what names a row: ``run_id``, an episode's id) repeated in every block, so
no column asked for is dropped (only a column too wide to fit even beside the keys alone has its cells cut).
"""

from __future__ import annotations

import datetime
import io
import json
import math
import os
from pathlib import Path
from typing import IO, Any, Literal, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from trajstore.errors import InputError
from trajstore.remote.wire import json_safe

OutputFormat = Literal["table", "csv", "json", "parquet"]  # what a CLI command prints its table as
FORMATS = ("table", "csv", "json", "parquet")
MAX_CELL = 40
WIDTH = 100  # a table's width where neither $COLUMNS nor the terminal says one
GAP = "  "
MIN_CLIP = 12  # a cell is never cut shorter than this to fit the width


def write(table: pa.Table, fmt: str, out: IO[str], *, output: str | None = None, width: int | None = None,
          keys: Sequence[str] = (), note: str = "", caption: str = "") -> None:
    """Write ``table`` as ``fmt`` to ``out`` (or to the file ``output``; Parquet needs a file). A table fits
    ``width`` characters (None: lines as long as they need), ``keys`` its columns repeated in every block,
    ``caption`` a line above it and ``note`` said after its row count."""
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
    text = render_table(table, width=width, keys=keys, note=note, caption=caption) if fmt == "table" else \
        {"csv": render_csv, "json": render_json}[fmt](table)
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


def terminal_width(out: IO[str]) -> int:
    """The width a table printed to ``out`` fits: ``$COLUMNS`` when set, else the terminal's when ``out`` is one,
    else ``WIDTH``."""
    given = os.environ.get("COLUMNS", "").strip()
    if given.isdigit() and int(given) > 0:
        return int(given)
    try:
        if out.isatty():
            return os.get_terminal_size(out.fileno()).columns or WIDTH
    except (AttributeError, OSError, ValueError):  # a stream without a file (captured), or closed
        pass
    return WIDTH


def number(value: float) -> str:
    """A float for people: 4 significant digits, whole numbers from 10,000 on (12346, not 1.235e+04)."""
    if not math.isfinite(value):
        return str(value)
    if 1e4 <= abs(value) < 1e15:
        return f"{value:.0f}"
    return f"{value:.4g}"


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return number(value)
    if isinstance(value, datetime.datetime):
        return _time(value)
    if isinstance(value, (list, dict)):
        return json.dumps(value, default=str)
    return str(value)


def _time(value: datetime.datetime) -> str:
    """A time to the second: ``2026-12-04 01:48:00Z`` in UTC, else with its offset."""
    text = value.strftime("%Y-%m-%d %H:%M:%S")
    offset = value.utcoffset()
    if offset is None:
        return text
    return text + ("Z" if not offset else value.strftime("%z"))


def render_table(table: pa.Table, *, width: int | None = None, keys: Sequence[str] = (), note: str = "",
                 caption: str = "") -> str:
    """Columns aligned under their names, long cells cut with an ellipsis; wider than ``width``, the columns in
    blocks that each fit, the ``keys`` columns repeated in every block (a column too wide even alone has its cells
    cut to fit); ``caption`` a line above, ``note`` after the row count."""
    names = table.column_names
    rows = [[_clip(_cell(v)) for v in row.values()] for row in table.to_pylist()]
    widths = [max([len(n)] + [len(r[i]) for r in rows]) for i, n in enumerate(names)]
    numeric = [_numeric(table, i) for i in range(len(names))]
    blocks = [list(range(len(names)))] if width is None else _blocks(widths, [n in keys for n in names], width)
    lines: list[str] = [caption] if caption else []
    for i, block in enumerate(blocks):
        if i:
            lines.append("")
        fitted = _fitted([widths[i] for i in block], width)
        lines += _aligned([names[i] for i in block], [[r[i] for i in block] for r in rows], fitted,
                          [numeric[i] for i in block])
    count = f"{table.num_rows} row{'s' if table.num_rows != 1 else ''}"
    lines.append(f"({count}{'; ' + note if note else ''})")
    return "\n".join(lines) + "\n"


def _blocks(widths: list[int], keys: list[bool], width: int) -> list[list[int]]:
    """The columns (by index) of each block of a table ``width`` wide: the key columns in every one, the others
    in order, as many as fit."""
    key_cols = [i for i, k in enumerate(keys) if k]
    blocks: list[list[int]] = []
    current: list[int] = []
    for i in (i for i, k in enumerate(keys) if not k):
        trial = sorted(key_cols + current + [i])
        if current and sum(widths[j] for j in trial) + len(GAP) * (len(trial) - 1) > width:
            blocks.append(sorted(key_cols + current))
            current = []
        current.append(i)
    blocks.append(sorted(key_cols + current))
    return blocks


def _fitted(widths: list[int], width: int | None) -> list[int]:
    """``widths`` with the widest columns narrowed (to ``MIN_CLIP`` at least) until their line fits ``width``."""
    fitted = list(widths)
    if width is None:
        return fitted
    while sum(fitted) + len(GAP) * (len(fitted) - 1) > width:
        widest = max(range(len(fitted)), key=fitted.__getitem__)
        over = sum(fitted) + len(GAP) * (len(fitted) - 1) - width
        narrower = max(MIN_CLIP, fitted[widest] - over)
        if narrower >= fitted[widest]:
            break
        fitted[widest] = narrower
    return fitted


def _aligned(names: list[str], rows: list[list[str]], widths: list[int], numeric: list[bool]) -> list[str]:
    """A header, a rule and ``rows``, each column ``widths`` wide (cut with an ellipsis where longer), numbers
    right-aligned."""
    def fit(text: str, w: int) -> str:
        return text if len(text) <= w else text[:w - 1] + "…"

    lines = [GAP.join(fit(n, w).ljust(w) for n, w in zip(names, widths)).rstrip(), GAP.join("-" * w for w in widths)]
    lines += [GAP.join(fit(c, w).rjust(w) if num else fit(c, w).ljust(w)
                       for c, w, num in zip(r, widths, numeric)).rstrip() for r in rows]
    return lines


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
