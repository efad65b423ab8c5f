"""The runner's reference room: sample_io.npz read and outputs checked against it, as every format's job does."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgemask.devices.remote.runner.errors import RunFailed
from edgemask.devices.remote.runner.reference import OutputCheck, read_sample_io


def test_the_check_keeps_the_largest_difference_and_the_top1_hits():
    check = OutputCheck(np.array([[0.0, 1.0], [2.0, 3.0]], np.float32), np.array([1, 0]))
    check.add(0, [[0.0, 1.5]])  # off by 0.5, argmax 1 = label 1
    check.add(1, np.array([2.0, 3.25]))  # off by 0.25, argmax 1 != label 0
    assert check.fields() == {"output_max_abs_diff": 0.5, "output_check_passed": True, "samples_checked": 2,
                              "accuracy": 0.5}
    assert check.failure(0.5) is None
    assert check.failure(0.4) == {"ok": False, "output_max_abs_diff": 0.5,
                                  "error": "output differs from sample_io by 0.5 > tolerance 0.4 on 2 samples"}


def test_a_nan_output_fails_the_check_and_a_wrong_shape_is_named():
    # a NaN after a finite sample, then another finite one: max() would have kept 0.0 and passed the check
    check = OutputCheck(np.zeros((3, 3), np.float32), None, "FP16 engine output")
    check.add(0, [0.0, 0.0, 0.0])
    check.add(1, [0.0, float("nan"), 0.0])
    check.add(2, [0.1, 0.0, 0.0])
    bad = check.failure(1.0)
    assert bad["output_max_abs_diff"] is None and bad["error"].startswith("FP16 engine output differs")
    assert check.fields()["accuracy"] is None and math.isnan(check.max_diff)
    with pytest.raises(RunFailed, match=r"^FP16 engine output shape \(1, 2\) differs from sample_io output shape "
                                        r"\(1, 3\)$"):
        check.add(0, [0.0, 1.0])


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
