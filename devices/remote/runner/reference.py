"""The host's reference: sample_io.npz read, and a job's outputs checked against it, sample by sample, batch 1.

Every format's job does the same check before it times anything, so a runner never reports the latency of a model
that computes something else than what the host exported."""

import math

from .errors import RunFailed


def read_sample_io(path):
    """-> inputs (N, *input_shape[1:]) float32, expected outputs (N, n_out) float32, labels (N,) or None."""
    import numpy as np

    with np.load(path, allow_pickle=False) as npz:
        for key in ("input", "output"):
            if key not in npz.files:
                raise RunFailed("%s has no array %r (has %s)" % (path, key, ", ".join(npz.files)))
        inputs = np.ascontiguousarray(npz["input"], dtype=np.float32)
        expected = np.asarray(npz["output"], dtype=np.float32)
        labels = npz["label"] if "label" in npz.files else None
    if inputs.shape[0] == 0:
        raise RunFailed("%s holds no samples" % path)
    return inputs, expected, labels


class OutputCheck(object):
    """Outputs of samples 0..N-1 compared with the host's: the largest absolute difference, and top-1 hits where
    sample_io has labels. ``what`` names the output in errors ("output", "engine output")."""

    def __init__(self, expected, labels, what="output"):
        self.expected, self.labels, self.what = expected, labels, what
        self.max_diff, self.correct, self.n = 0.0, 0, 0

    def add(self, i, out):
        import numpy as np

        out = np.asarray(out, dtype=np.float32).reshape(1, -1)
        ref = self.expected[i].reshape(1, -1)
        if out.shape != ref.shape:
            raise RunFailed("%s shape %s differs from sample_io output shape %s" % (self.what, out.shape, ref.shape))
        diff = float(np.max(np.abs(out - ref)))  # NaN where the output has one
        if not math.isnan(self.max_diff) and not diff <= self.max_diff:  # not max(): max(0.0, nan) is 0.0
            self.max_diff = diff  # a NaN, once seen, stays and fails the check
        if self.labels is not None and int(np.argmax(out)) == int(self.labels[i]):
            self.correct += 1
        self.n += 1

    def failure(self, tolerance):
        """The job's answer when the outputs differ by more than ``tolerance`` (NaN included), else None."""
        if self.max_diff <= tolerance:
            return None
        return {"ok": False, "output_max_abs_diff": self.max_diff if math.isfinite(self.max_diff) else None,
                "error": "%s differs from sample_io by %.3g > tolerance %.3g on %d samples"
                         % (self.what, self.max_diff, tolerance, self.n)}

    def fields(self):
        """What a passed check adds to the job's result."""
        return {"output_max_abs_diff": self.max_diff, "output_check_passed": True, "samples_checked": self.n,
                "accuracy": self.correct / float(self.n) if self.labels is not None else None}
