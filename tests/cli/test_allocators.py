"""``trajstore serve``'s allocators (trajstore/cli/allocators.py), seen from a process of their own: Arrow's pool, and
glibc's arenas and mmap threshold as glibc itself reports them (``malloc_info``, ``mallinfo2``)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

# Eight threads hold a 4 KiB block at once (a new thread gets an arena of its own while glibc's limit allows). Then the
# service's pattern: a 256 KiB buffer freed (which raises glibc's mmap threshold past it), then 200 request bodies of
# 256 KiB, each followed by a small block that stays, and the bodies freed. Prints the arenas, the bodies that got a
# mapping of their own, and the MiB the process still holds once they are freed: bodies carved from an arena leave
# holes that the blocks between them keep resident.
PROBE = """
import ctypes, sys, tempfile, threading
if sys.argv[1] == "tuned":
    from trajstore.cli.allocators import tune_glibc_malloc
    tune_glibc_malloc()
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                                               "uordblks", "fordblks", "keepcost")]
libc.mallinfo2.restype = MallInfo2
barrier = threading.Barrier(8)
def hold():
    block = libc.malloc(4096)
    barrier.wait()
    libc.free(block)
threads = [threading.Thread(target=hold) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
libc.fopen.restype, libc.fopen.argtypes = ctypes.c_void_p, [ctypes.c_char_p, ctypes.c_char_p]
libc.malloc_info.argtypes, libc.fclose.argtypes = [ctypes.c_int, ctypes.c_void_p], [ctypes.c_void_p]
with tempfile.NamedTemporaryFile("r") as info:
    out = libc.fopen(info.name.encode(), b"w")
    libc.malloc_info(0, out)
    libc.fclose(out)
    arenas = info.read().count("<heap nr=")
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
def resident() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096
libc.free(libc.malloc(256 * 1024))
before, mapped, bodies, kept = resident(), libc.mallinfo2().hblks, [], []
for _ in range(200):
    bodies.append(libc.malloc(256 * 1024))
    libc.memset(bodies[-1], 1, 256 * 1024)
    kept.append(libc.malloc(2000))
mapped = libc.mallinfo2().hblks - mapped
for body in bodies:
    libc.free(body)
print(arenas, mapped, (resident() - before) >> 20)
"""

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")


def probe(how: str, **env: str) -> tuple[int, int, int]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", PROBE, how], env={**clean, **env}, capture_output=True, text=True,
                         timeout=60)
    arenas, mapped, held = out.stdout.split()
    return int(arenas), int(mapped), int(held)


@glibc
def test_the_service_keeps_two_arenas_and_gives_request_bodies_back() -> None:
    arenas, mapped, held = probe("plain")  # glibc's default: an arena a thread, the bodies carved from one
    assert arenas > 2 and mapped == 0 and held >= 40, (arenas, mapped, held)
    arenas, mapped, held = probe("tuned")  # each body a mapping of its own (one may fit a hole), returned when freed
    assert arenas == 2 and mapped >= 190 and held < 5, (arenas, mapped, held)


@glibc
def test_a_malloc_setting_the_user_chose_is_kept() -> None:
    arenas, mapped, _ = probe("tuned", MALLOC_ARENA_MAX="4")
    assert arenas == 4 and mapped >= 190
    arenas, mapped, _ = probe("tuned", MALLOC_MMAP_THRESHOLD_=str(1 << 20))  # 256 KiB under the user's threshold
    assert arenas == 2 and mapped == 0


@pytest.mark.parametrize("chosen, used", [(None, "jemalloc"), ("system", "system")])
def test_serve_has_arrow_allocate_with_jemalloc_unless_a_pool_was_chosen(chosen: str | None, used: str) -> None:
    """Arrow's default allocator (mimalloc) kept what each of the service's request threads freed (its RSS grew
    ~20 MiB a wave of 1,024 ingest requests, docs/benchmarks.md): ``serve`` picks jemalloc before pyarrow loads."""
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    if chosen is not None:
        env["ARROW_DEFAULT_MEMORY_POOL"] = chosen
    code = ("from trajstore.cli.allocators import serving_allocators; serving_allocators(); import pyarrow as pa; "
            "print(pa.default_memory_pool().backend_name)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == used, out.stderr
