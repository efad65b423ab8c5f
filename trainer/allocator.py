"""The host's memory allocator, set for a training loop that frees and reallocates the same large tensors every
step.

PyTorch's CPU tensors come from ``malloc``. glibc serves a block above its mmap threshold with a fresh ``mmap``
and hands free memory at the heap's top back to the OS above its trim threshold; both start at 128 KiB and
adapt (the trim threshold to twice the largest block freed so far). The batched loop allocates and frees
megabytes of stacked parameters, gradients and activations each step, more at once than the adapted trim
threshold, so the heap shrinks after a step and grows again in the next. Every regrown page is a page fault,
and the kernel zeroes it: on the MLP workload of ``benchmarks/bench_batched.py`` the update that writes the
clients' first-layer weights spends most of its time in those faults, a large share of the batched round.

:func:`tune_host_allocator` sets glibc's ``M_MMAP_THRESHOLD`` to its largest value (32 MiB) and
``M_TRIM_THRESHOLD`` to 256 MiB, so freed blocks are reused rather than returned and faulted in again, as
PyTorch's caching allocator does on a GPU. The price: up to 256 MiB of freed memory stays with the process.
Both must be set: fixing one turns off glibc's adaptation of the other (then at 128 KiB).

The same settings keep what a phase of a round freed: every hole a freed block leaves inside the heap, and up to
256 MiB at its top. A round's phases (its devices' tasks, the stacked training, the uploads, the aggregate, the
evaluation) free their blocks in another order than they took them, so the holes add up from one phase to the next.
:func:`release_free_memory` hands them back (glibc's ``malloc_trim(0)``, which also releases whole free pages
inside the heap) between phases, where nothing is reused soon; a step's blocks, inside a phase, are still kept.

:func:`tune_host_allocator` changes nothing, and says why, off glibc, when the user chose the allocator's settings already
(``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``, ``glibc.malloc`` tunables in ``GLIBC_TUNABLES``, a
jemalloc or tcmalloc in ``LD_PRELOAD``), or with ``EDGEMASK_MALLOC=default``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's <malloc.h>
MMAP_THRESHOLD = 32 << 20  # glibc's largest on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)
TRIM_THRESHOLD = 256 << 20
OPT_OUT = "EDGEMASK_MALLOC"

_state: str | None = None  # what the first call did: every later call returns it


def tune_host_allocator() -> str:
    """Set glibc's thresholds once per process (see the module docstring). Returns what was done: ``"tuned"``,
    or ``"unchanged: <why>"``."""
    global _state
    if _state is None:
        _state = _tune()
    return _state


def _tune() -> str:
    if os.environ.get(OPT_OUT, "").lower() == "default":
        return f"unchanged: {OPT_OUT}=default"
    for var in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"):
        if var in os.environ:
            return f"unchanged: {var} is set"
    if "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        return "unchanged: GLIBC_TUNABLES sets glibc.malloc"
    preload = os.environ.get("LD_PRELOAD", "")
    if "jemalloc" in preload or "tcmalloc" in preload:
        return "unchanged: another allocator is preloaded"
    if not _on_glibc():
        return "unchanged: not glibc"
    mallopt = _glibc_function("mallopt")  # int mallopt(int, int): ctypes' default argument and result types
    if mallopt is None:
        return "unchanged: mallopt not found"
    if not mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD):
        return "unchanged: mallopt refused M_MMAP_THRESHOLD"
    if not mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD):
        return "unchanged: mallopt refused M_TRIM_THRESHOLD"  # (the mmap threshold is set: harmless alone)
    return "tuned"


def _on_glibc() -> bool:
    return platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def _glibc_function(name: str):
    """glibc's function ``name`` through ctypes, or None where the C library or the function cannot be found."""
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
    except (OSError, AttributeError):
        return None


_trim = None  # glibc's malloc_trim, once found; False off glibc


def release_free_memory() -> bool:
    """Return the heap's free memory to the OS (glibc's ``malloc_trim(0)``: the top above the pad and every whole
    free page inside each arena), between a round's phases (module docstring). Whether it ran: False off glibc."""
    global _trim
    if _trim is None:
        _trim = (_glibc_function("malloc_trim") if _on_glibc() else None) or False
    if not _trim:
        return False
    _trim(0)
    return True
