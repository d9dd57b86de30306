"""How ``trajstore serve`` allocates memory: the choices that keep a long-running service's RSS flat.

A service answers from many threads (one per request being decoded, the group committer, upkeep), and allocators
that keep memory per thread keep what each of those threads freed. Two choices, each made only where the user has
not made it (docs/benchmarks.md has the runs that led to them):

- Arrow allocates with jemalloc, not its default mimalloc (``ARROW_DEFAULT_MEMORY_POOL``).
- The C library's ``malloc`` (glibc: Python's larger objects, numpy's buffers, DuckDB) keeps two arenas, not eight per
  core, and gives buffers of 128 KiB or more their own mappings, returned to the system when freed
  (``MALLOC_ARENA_MAX``, ``MALLOC_MMAP_THRESHOLD_``).
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys

ARENAS = 2
MMAP_THRESHOLD = 128 * 1024  # glibc's own starting threshold, kept fixed instead of rising with each freed buffer
_M_MMAP_THRESHOLD, _M_ARENA_MAX = -3, -8  # mallopt's parameters (glibc's malloc.h)


def serving_allocators() -> None:
    """Make both choices for this process; call it before pyarrow is first imported (Arrow reads its variable once,
    as it loads: :func:`pyarrow.set_memory_pool` afterwards leaves Arrow's C++ readers and writers on mimalloc).

    With Arrow's mimalloc, ``trajstore serve`` grew ~20 MiB a wave of 1,024 ingest requests (574 -> 821 MiB over 12
    waves of 256 actors); with jemalloc, 404 -> 472 MiB, while glibc's arenas still grew (55 -> 75 MiB over 9 waves,
    three quarters of it freed but held; 51 -> 58 MiB over 15 with the settings here). A pyarrow built without
    jemalloc says so once and keeps its default."""
    if "pyarrow" not in sys.modules:
        os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")
    tune_glibc_malloc()


def tune_glibc_malloc() -> None:
    """Two arenas and a fixed 128 KiB mmap threshold for glibc's ``malloc`` in this process, each unless its
    variable was set (glibc read it as the process started); nothing where the C library is not glibc.

    glibc gives each new thread an arena of its own, up to eight per core, and a freed chunk stays in its arena;
    and after a large buffer is freed it raises the size from which buffers get their own mapping, so later request
    bodies are carved from the arenas and leave holes there. Both choices only change where memory comes from."""
    if platform.libc_ver()[0] != "glibc":
        return
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if "MALLOC_ARENA_MAX" not in os.environ:
        mallopt(_M_ARENA_MAX, ARENAS)
    if "MALLOC_MMAP_THRESHOLD_" not in os.environ:
        mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
