"""The host allocator's settings: freed training tensors are reused, not returned to the OS and faulted in again."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from edgemask.trainer import allocator

ROOT = Path(__file__).resolve().parents[2]

# A training step's pattern through glibc's malloc, which PyTorch's CPU tensors come from: blocks of 1-3 MiB
# written, then all freed; page faults per step, after one step to grow the heap.
FAULTS = """
import ctypes, resource
from edgemask.trainer.allocator import tune_host_allocator
state = tune_host_allocator()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes, libc.memset.argtypes = [ctypes.c_void_p], [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
def step():
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    blocks = []
    for size in (1 << 20, 3 << 20, 3 << 20, 2 << 20, 1 << 20):
        blocks.append(libc.malloc(size))
        libc.memset(blocks[-1], 1, size)
    for b in blocks:
        libc.free(b)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
step()
print(state)
print(max(step() for _ in range(5)))
"""


def faults_per_round(**env: str) -> tuple[str, float]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "EDGEMASK_MALLOC"))}
    out = subprocess.run([sys.executable, "-c", FAULTS], capture_output=True, text=True, check=True, cwd=ROOT,
                         env={**clean, "PYTHONPATH": str(ROOT), **env}).stdout.split("\n")
    return out[0], float(out[1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the settings are glibc's")
def test_tuned_allocator_reuses_a_steps_memory_where_glibcs_defaults_fault_it_in_again():
    state, tuned = faults_per_round()
    assert state == "tuned"
    assert tuned < 10  # the freed blocks are reused (measured: 0)
    state, default = faults_per_round(EDGEMASK_MALLOC="default")
    assert state == "unchanged: EDGEMASK_MALLOC=default"
    assert default > 2000  # the heap is trimmed and grown again: 10 MiB of pages (measured: 2,528)


@pytest.mark.parametrize("env, why", [({"MALLOC_TRIM_THRESHOLD_": "1000000"}, "MALLOC_TRIM_THRESHOLD_ is set"),
                                      ({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1"},
                                       "GLIBC_TUNABLES sets glibc.malloc"),
                                      ({"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}, "another allocator is preloaded"),
                                      ({"EDGEMASK_MALLOC": "DEFAULT"}, "EDGEMASK_MALLOC=default")])
def test_a_users_own_allocator_settings_are_left_alone(monkeypatch, env, why):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert allocator._tune() == f"unchanged: {why}"


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the settings are glibc's")
def test_mallopt_refusing_a_value_is_reported_not_claimed(monkeypatch):
    for var in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES", "LD_PRELOAD", "EDGEMASK_MALLOC"):
        monkeypatch.delenv(var, raising=False)
    calls = []

    class Libc:  # glibc before 2.26 refused an mmap threshold above 32 MiB; 2.36 takes any
        def __init__(self, refuse: int) -> None:
            self.refuse = refuse

        def mallopt(self, option: int, value: int) -> int:
            calls.append((option, value))
            return int(option != self.refuse)

    for refuse, name in ((allocator.M_MMAP_THRESHOLD, "M_MMAP_THRESHOLD"), (allocator.M_TRIM_THRESHOLD,
                                                                              "M_TRIM_THRESHOLD")):
        monkeypatch.setattr(allocator.ctypes, "CDLL", lambda path, refuse=refuse: Libc(refuse))
        assert allocator._tune() == f"unchanged: mallopt refused {name}"
    assert calls == [(-3, 32 << 20), (-3, 32 << 20), (-1, 256 << 20)]  # the mmap threshold first, then the trim


# A phase's pattern: 64 blocks of 2 MiB written, every other one freed (the kept ones hold the heap's top in place),
# then RSS before and after release_free_memory, in MiB
HOLES = """
import ctypes
from edgemask.trainer.allocator import release_free_memory, tune_host_allocator
tune_host_allocator()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes, libc.memset.argtypes = [ctypes.c_void_p], [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20
blocks = []
for _ in range(64):
    blocks.append(libc.malloc(2 << 20))
    libc.memset(blocks[-1], 1, 2 << 20)
for b in blocks[::2]:
    libc.free(b)
before = rss()
if RELEASE:
    release_free_memory()
print(before, rss())
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_release_free_memory_returns_the_holes_a_phase_leaves_in_the_heap():
    def run(release: bool) -> tuple[float, float]:
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "EDGEMASK_MALLOC"))}
        out = subprocess.run([sys.executable, "-c", f"RELEASE = {release}\n" + HOLES], capture_output=True, text=True,
                             check=True, cwd=ROOT, env={**clean, "PYTHONPATH": str(ROOT)}).stdout.split()
        return float(out[0]), float(out[1])

    before, after = run(False)
    assert after > before - 4  # the tuned allocator keeps the 32 freed blocks' 64 MiB resident
    before, after = run(True)
    assert after < before - 56  # handed back: the 64 MiB of holes, less what their chunk headers keep
