"""Names that become paths, and the one-writer lock (docs/architecture.md, 'Rules every stage keeps')."""

from __future__ import annotations

import time

import pytest

from edgemask.errors import ConfigError, EdgemaskError
from edgemask.fileio import exclusive_lock
from edgemask.workspace import check_name
from lock_holder import hold_lock


@pytest.mark.parametrize("name", ["demo-fedmask", "client-007", "run_1.2", "a"])
def test_plain_names_pass(name):
    assert check_name(name, "run_id") == name


@pytest.mark.parametrize("name", ["../artifacts", "..", ".", "/etc", "a/b", "a\\b", "", ".hidden", " x", "x\0y", 3])
def test_names_that_would_leave_the_workspace_are_refused(name):
    with pytest.raises(ConfigError, match="run_id in t.toml"):
        check_name(name, "run_id in t.toml")


def test_second_holder_is_refused_with_one_line_then_gets_it_after_release(tmp_path):
    lock = tmp_path / ".lock"
    p, release = hold_lock(lock)
    try:
        t0 = time.monotonic()
        with pytest.raises(EdgemaskError, match="the thing is in use by another edgemask process") as e:
            with exclusive_lock(lock, "the thing", wait_s=0.3):
                pass
        assert time.monotonic() - t0 >= 0.3
        assert "\n" not in str(e.value)
    finally:
        release.set()
        p.join(10)
    with exclusive_lock(lock, "the thing", wait_s=1.0):
        pass


def test_a_killed_holder_leaves_no_stale_lock(tmp_path):
    lock = tmp_path / ".lock"
    p, _ = hold_lock(lock)
    p.kill()
    p.join(10)
    with exclusive_lock(lock, "the thing"):
        assert lock.exists()


def test_atomic_writes_get_the_mode_open_would_give(tmp_path):
    import os

    from edgemask.fileio import write_text_atomic

    old = os.umask(0o022)
    try:
        write_text_atomic(tmp_path / "report.md", "x")
    finally:
        os.umask(old)
    assert (tmp_path / "report.md").stat().st_mode & 0o777 == 0o644


def test_atomic_dirs_get_the_mode_mkdir_would_give(tmp_path):
    import os

    from edgemask.fileio import atomic_dir

    old = os.umask(0o022)
    try:
        with atomic_dir(tmp_path / "run", lambda p: True, "run") as d:
            (d / "x").write_text("x")
    finally:
        os.umask(old)
    assert (tmp_path / "run").stat().st_mode & 0o777 == 0o755
