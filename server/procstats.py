"""Figures of this process for health checks and leak tests: RSS, open files, heap trimming.

Linux only (``/proc`` and glibc); elsewhere the figures are None and trimming does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from collections.abc import Callable

PROC_SELF = "/proc/self"


def rss_bytes() -> int | None:
    """Resident set size of this process (bytes), or None where /proc is missing."""
    try:
        with open(f"{PROC_SELF}/statm") as fh:
            resident_pages = int(fh.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


def open_fds() -> int | None:
    """Open file descriptors of this process (sockets included), or None where unknown."""
    try:
        entries = os.listdir(f"{PROC_SELF}/fd")
    except OSError:
        return None
    return len(entries) - 1  # listing the folder holds one descriptor open itself


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        trim: Callable[[int], int] = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    return trim


def trim_heap() -> bool:
    """Give the C allocator's free memory back to the system (glibc ``malloc_trim(0)``).

    Closed sessions leave tens of MB the allocator keeps for reuse; this returns them, so RSS
    tracks what is live. Returns False where the allocator has no such call. Blocks for a few
    ms on a large heap (ctypes releases the GIL during the call).
    """
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
