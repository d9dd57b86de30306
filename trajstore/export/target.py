"""Where an export writes: a new hidden folder beside its destination, moved into place only when complete.

An export that fails — bad data, a full disk, Ctrl-C — leaves nothing behind: not a half dataset under the
destination's name (which other tools would then take for a dataset, or refuse to write over), not the parent
folders it made. A destination that cannot be used is refused before any work, in one line naming it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import uuid
from pathlib import Path
from typing import Callable, Iterator

from trajstore.errors import InputError


def check_new(final: Path, *, field: str) -> None:
    """Refuse ``final`` unless it is a new path or an empty folder, under a folder that can be made."""
    if final.is_dir():
        if any(final.iterdir()):
            raise InputError(f"{field}: {final} exists and is not empty; choose a new folder")
    elif final.exists() or final.is_symlink():
        raise InputError(f"{field}: {final} exists and is not a folder; choose a new folder")
    ancestor = final.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise InputError(f"{field}: cannot make {final}: {ancestor} is a file, not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise InputError(f"{field}: cannot write in {ancestor} (permission denied); choose another place")


@contextlib.contextmanager
def staged(final: Path, *, field: str, stage_in: Path | None = None,
           before_move: Callable[[], Callable[[], None] | None] | None = None) -> Iterator[Path]:
    """A new hidden folder (in ``stage_in``, else beside ``final``) to write the export into; when the block
    ends without an error it becomes ``final`` (one rename), else it is removed, as are the folders made
    for it. ``before_move`` runs just before the rename and must make ``final``'s parent when ``stage_in`` is
    given (e.g. by registering a namespace); it may return the call that undoes it should the rename fail."""
    where = stage_in or final.parent
    made = _make_parents(where, field=field)
    stage = where / f".{final.name}.trajstore-export-{uuid.uuid4().hex[:12]}"
    try:
        stage.mkdir()
    except OSError as exc:
        _remove_made(made)
        raise InputError(f"{field}: cannot write in {stage.parent}: {exc.strerror or exc}") from None
    undo: Callable[[], None] | None = None
    try:
        yield stage
        undo = before_move() if before_move is not None else None
        _move(stage, final, field=field)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        if undo is not None:
            undo()
        _remove_made(made)
        raise


def _move(stage: Path, final: Path, *, field: str) -> None:
    try:
        os.rename(stage, final)  # replaces an empty folder; fails on anything else
    except OSError as exc:
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
            raise InputError(f"{field}: {final} was created by someone else meanwhile; nothing was written "
                             "there") from None
        raise


def _make_parents(folder: Path, *, field: str) -> list[Path]:
    """Make ``folder`` and its missing parents; the ones made, deepest last."""
    missing = []
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    made: list[Path] = []
    for path in reversed(missing):
        try:
            path.mkdir()
        except FileExistsError:
            continue
        except OSError as exc:
            _remove_made(made)
            raise InputError(f"{field}: cannot make {path}: {exc.strerror or exc}") from None
        made.append(path)
    return made


def _remove_made(made: list[Path]) -> None:
    for path in reversed(made):
        with contextlib.suppress(OSError):
            path.rmdir()  # only if still empty
