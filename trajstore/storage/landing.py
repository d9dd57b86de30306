"""Whether a commit landed: the one answer every commit path gives when sending a commit to the log raised.

A commit can land and still raise. An object store may take the PUT of the log entry and lose its answer (the
client times out, or retries and hears that the entry exists); deltalake may write the version and then fail in
what it runs after it (a checkpoint that meets a full disk). Deleting the files of such a commit, or committing
its rows again, would lose or duplicate data that readers already see.

So every commit trajstore sends carries a marker of its own, a random id in its commit info
(``commitInfo.trajstore.commit``), and names the version it was planned on (its *base*). When sending it raised,
:func:`settle` reads the versions after the base, one log entry each: the commit landed exactly when one of them
carries its marker. A later compaction or delete that removed its files does not hide it (the entry stays), so a
retried append is known to be committed whatever happened to its files since. A commit that landed is reported
as done (with a warning when what failed came after it); one that did not raises its own error, and its files
may be cleaned up (:meth:`~trajstore.storage.table.StepsTable.discard`); when the log cannot be read either,
:class:`~trajstore.errors.CommitUnknownError` says that the change may have been applied and how to see it, and
nothing is deleted.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol

from trajstore.errors import CommitUnknownError, first_line
from trajstore.storage.location import Location

logger = logging.getLogger(__name__)

MARKER = "commit"  # the key of a commit's marker in its commit info's "trajstore" object


class Log(Protocol):
    """What a search for a commit reads of a table's log (:class:`~trajstore.storage.log.Log` is one): the marker
    of one version's entry and the latest version. Named here rather than imported, so that the log, which settles
    its commits here, and this module do not import each other."""

    location: Location

    @property
    def uri(self) -> str: ...

    def marker(self, number: int) -> str | None: ...

    def latest_number(self) -> int: ...


@dataclass
class Attempt:
    """One commit as sent: the latest version when it was planned (``base``, -1 before the first) and its marker.
    A retry of the same change (an append sent again) keeps both, so one search finds whichever try landed.
    ``checked``: the versions up to which the log is known not to hold it (an entry never changes), so that a
    search after the next lost race reads only the versions since."""

    base: int
    marker: str = field(default_factory=lambda: uuid.uuid4().hex)
    checked: int = -2  # -2: none yet (the base)

    def __post_init__(self) -> None:
        self.checked = max(self.checked, self.base)

    def metadata(self, own: dict[str, Any]) -> dict[str, Any]:
        """The commit info's custom metadata: ``own`` (what :mod:`~trajstore.storage.history` shows) and the
        marker, under ``"trajstore"``."""
        return {"trajstore": {**own, MARKER: self.marker}}


def find(log: Log, attempt: Attempt) -> int | None:
    """The version that carries ``attempt``'s marker, or None when no version after its base does (read: each
    entry after the versions already checked, one GET each, up to the first that does not exist yet).

    Raises :class:`CommitUnknownError` when the log cannot be read (whatever the error), or when an entry after the
    base is gone (cleaned up after a checkpoint) while later versions exist: then nothing can tell."""
    version = attempt.checked + 1
    while True:
        marker = _marker(log, attempt, version)
        if marker is None:  # no entry for this version: past the latest, unless it was cleaned up
            if not _later_versions(log, attempt, version):
                return None
            marker = _marker(log, attempt, version)  # written meanwhile, by a writer racing this search?
            if marker is None:
                raise unknown(log, attempt, f"the log entry of version {version} is gone")
        if marker == attempt.marker:
            return version
        attempt.checked = version
        version += 1


def _marker(log: Log, attempt: Attempt, version: int) -> str | None:
    try:
        return log.marker(version)
    except Exception as exc:  # whatever keeps the log from being read: the commit's fate is unknown
        raise unknown(log, attempt, exc) from exc


def _later_versions(log: Log, attempt: Attempt, version: int) -> bool:
    try:
        return log.latest_number() > version
    except Exception as exc:  # as for a marker
        raise unknown(log, attempt, exc) from exc


def settle(log: Log, attempt: Attempt, exc: BaseException, what: str, *, race: bool) -> int | None:
    """After sending ``attempt`` (``what``: the change, for messages) raised ``exc``: the version it landed as,
    or None when it did not land (the caller raises its own error, and may clean up). A landed commit whose
    failure was not a lost race (``race``: the log said another commit took the version) is logged as a warning:
    the change is done, only its answer or what followed it failed."""
    if not isinstance(exc, Exception):  # interrupted (KeyboardInterrupt, SystemExit): no more reads now
        return None
    version = find(log, attempt)
    if version is not None and not race:
        logger.warning("%s: %s was committed as version %d, though the call failed (%s): its answer was lost, or "
                    "what ran after the commit failed (a checkpoint is written again later); the change is done",
                    log.uri, what, version, first_line(exc))
    return version


def unknown(log: Log, attempt: Attempt, cause: object) -> CommitUnknownError:
    """The error for a commit whose fate the log cannot tell."""
    store = log.location.uri.rsplit("/", 1)[0]
    said = first_line(cause) if isinstance(cause, BaseException) else str(cause)
    return CommitUnknownError(
        f"{log.uri}: a commit was sent but whether it landed cannot be told ({said}); the change "
        f"may have been applied, so none of its files were deleted. Once the store answers, `trajstore history "
        f"--store {store}` shows it as a version after {attempt.base} if it was (its commit id is "
        f"{attempt.marker}); `trajstore check` lists the files of one that was not")
