"""The runner's reference room: sample_io.npz read and outputs checked against it, as every format's job does."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgemask.devices.remote.runner.errors import RunFailed
from edgemask.devices.remote.runner.reference import OutputCheck, read_sample_io


def test_the_check_keeps_the_largest_difference_and_the_top1_hits():
    expected, labels = np.array([[0.0, 1.0], [2.0, 3.0]], np.float32), np.array([1, 0])

    def checked(atol, rtol=0.0):
        check = OutputCheck(expected, labels, atol, rtol)
        check.add(0, [[0.0, 1.5]])  # off by 0.5 where |y_ref| = 1, argmax 1 = label 1
        check.add(1, np.array([2.0, 3.25]))  # off by 0.25 where |y_ref| = 3, argmax 1 != label 0
        return check

    assert checked(0.5).fields() == {"output_max_abs_diff": 0.5, "output_check_passed": True, "samples_checked": 2,
                                     "accuracy": 0.5}
    assert checked(0.5).failure() is None
    assert checked(0.4).failure() == {
        "ok": False, "output_max_abs_diff": 0.5,
        "error": "output differs from sample_io by 0.5 where the limit there is 0.4 (atol 0.4 + rtol 0*|y_ref|) at "
                 "sample 0 of 2"}
    # elementwise: sample 0 needs atol + rtol·1 >= 0.5, sample 1 atol + rtol·3 >= 0.25
    assert checked(0.3, 0.2).failure() is None  # limits 0.5 and 0.9
    assert checked(0.1, 0.3).failure()["error"].startswith(  # limits 0.4 and 1.0: sample 0 is past by 0.1
        "output differs from sample_io by 0.5 where the limit there is 0.4 (atol 0.1 + rtol 0.3*|y_ref|) at sample 0")
    assert checked(0.2, 0.0).failure()["error"].endswith("by 0.5 where the limit there is 0.2 (atol 0.2 + rtol "
                                                         "0*|y_ref|) at sample 0 of 2")  # the furthest past


def test_the_limit_follows_each_reference_elements_size():
    """A large output may part by rtol of itself, a small one only by atol: the element past its own limit is named,
    not the one with the largest difference."""
    expected = np.array([[100.0, 0.001]], np.float32)
    check = OutputCheck(expected, None, 5e-4, 1e-4)  # limits 0.0105 and 0.0005001
    check.add(0, [100.009, 0.001])  # 9e-3 off, under 0.0105
    assert check.failure() is None and check.max_diff == pytest.approx(9e-3, rel=1e-3)
    check.add(0, [100.0, 0.0016])  # 6e-4 off where the limit is 5.001e-4
    bad = check.failure()
    assert bad["output_max_abs_diff"] == pytest.approx(9e-3, rel=1e-3)  # the largest |Δ| stays what it was
    assert "by 0.0006 where the limit there is 0.0005 (atol 0.0005 + rtol 0.0001*|y_ref|) at sample 0" in bad["error"]


def test_a_nan_output_fails_the_check_and_a_wrong_shape_is_named():
    # a NaN after a finite sample, then another finite one: max() would have kept 0.0 and passed the check
    check = OutputCheck(np.zeros((3, 3), np.float32), None, 1.0, 1.0, "FP16 engine output")
    check.add(0, [0.0, 0.0, 0.0])
    check.add(1, [0.0, float("nan"), 0.0])
    check.add(2, [0.1, 0.0, 0.0])
    bad = check.failure()
    assert bad["output_max_abs_diff"] is None
    assert bad["error"].startswith("FP16 engine output differs from sample_io by nan where the limit there is 1 ")
    assert bad["error"].endswith("at sample 1 of 3")
    assert check.fields()["accuracy"] is None and math.isnan(check.max_diff)
    with pytest.raises(RunFailed, match=r"^FP16 engine output shape \(1, 2\) differs from sample_io output shape "
                                        r"\(1, 3\)$"):
        check.add(0, [0.0, 1.0])


def test_a_nan_in_the_reference_fails_too():
    check = OutputCheck(np.array([[1.0, float("nan")]], np.float32), None, 1.0, 1.0)
    check.add(0, [1.0, 0.0])
    bad = check.failure()
    assert bad["output_max_abs_diff"] is None and "by nan where the limit there is nan" in bad["error"]


def test_sample_io_without_outputs_or_samples_is_refused(tmp_path):
    np.savez(tmp_path / "a.npz", input=np.zeros((2, 4)))
    with pytest.raises(RunFailed, match=r"a\.npz has no array 'output' \(has input\)$"):
        read_sample_io(str(tmp_path / "a.npz"))
    np.savez(tmp_path / "b.npz", input=np.zeros((0, 4)), output=np.zeros((0, 2)))
    with pytest.raises(RunFailed, match="holds no samples"):
        read_sample_io(str(tmp_path / "b.npz"))
    np.savez(tmp_path / "c.npz", input=np.ones((2, 4), np.float64), output=np.zeros((2, 2)), label=np.array([0, 1]))
    x, y, labels = read_sample_io(str(tmp_path / "c.npz"))
    assert x.dtype == y.dtype == np.float32 and x.flags.c_contiguous and labels.tolist() == [0, 1]
