"""The stand-in's emulated power sensor (no fleet needed): what a sampler inside the throttled cgroup reads."""

from __future__ import annotations

import numpy as np

from fleet.powermodel import UsageWindow, power_w


def _read_during_bursts(window_s: float, phase: float) -> float:
    """A device with a quarter-CPU quota, always runnable: it runs 25 ms at the start of every 100 ms CFS period
    (shifted by ``phase``). The model updates every 50 ms; a sampler inside the cgroup reads the sensor every 5 ms,
    but only while the device runs. Returns the mean power it reads over 2 s (idle 2 W, busy 6 W)."""
    def usage(t: float) -> float:  # cumulative CPU seconds
        k, r = divmod(t - phase, 0.1)
        return k * 0.025 + min(r, 0.025)

    win = UsageWindow(window_s, 0.0, usage(0.0))
    value, reads, tick = 2.0, [], 0.05
    for t in np.arange(0.0, 2.0, 0.005):
        while tick <= t:
            value = power_w(*win.add(tick, usage(tick)), cores=0.25, idle_w=2.0, busy_w=6.0)
            tick += 0.05
        if t >= 0.2 and (t - phase) % 0.1 < 0.025:  # past the first window; the sampler runs only in a burst
            reads.append(value)
    return float(np.mean(reads))


def test_a_whole_cfs_period_window_reads_a_busy_device_as_busy_at_any_phase():
    phases = np.linspace(0.0, 0.1, 20, endpoint=False)
    whole = [_read_during_bursts(0.1, p) for p in phases]
    assert min(whole) > 5.5 and max(whole) - min(whole) < 0.5  # fully using its quota: ~6 W at any phase
    # the old model, usage over the 50 ms between updates: 2.9-5.7 W by phase alone (the fleet test's bound on
    # the timed window is idle + 0.5 W, and idle reads 2.2-2.9 W)
    short = [_read_during_bursts(0.05, p) for p in phases]
    assert min(short) < 3.0 and max(short) > 5.5


def test_the_window_keeps_the_newest_reading_a_window_old():
    win = UsageWindow(1.0, 0.0, 0.0)
    assert win.add(0.5, 0.25) == (0.25, 0.5)
    assert win.add(1.0, 0.5) == (0.5, 1.0)
    assert win.add(1.5, 1.25) == (1.0, 1.0)  # the oldest reading still ≥ 1 s old: the one at 0.5 s
    assert win.add(3.0, 2.0) == (0.75, 1.5)  # a late update: the previous reading is the window's start
