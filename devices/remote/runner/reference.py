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
    """Outputs of samples 0..N-1 held to export's rule (docs/contracts.md, "Verification"), elementwise:

        |y - y_ref| <= atol + rtol*|y_ref|,   y_ref: the sample_io output; a NaN on either side fails.

    Kept: the largest |y - y_ref| of any element, the element furthest past its limit (closest to it while all
    pass), and top-1 hits where sample_io has labels. ``what`` names the output in errors ("output", "FP16 engine
    output")."""

    def __init__(self, expected, labels, atol, rtol=0.0, what="output"):
        self.expected, self.labels, self.what = expected, labels, what
        self.atol, self.rtol = float(atol), float(rtol)
        self.max_diff, self.correct, self.n = 0.0, 0, 0
        self.worst = None  # (|y - y_ref| - limit, sample, |y - y_ref|, limit) at the worst element so far

    def add(self, i, out):
        import numpy as np

        out = np.asarray(out, dtype=np.float32).reshape(1, -1)
        ref = self.expected[i].reshape(1, -1)
        if out.shape != ref.shape:
            raise RunFailed("%s shape %s differs from sample_io output shape %s" % (self.what, out.shape, ref.shape))
        # in float64: the difference of two float32 values is exact there, and so is the comparison with the limit
        with np.errstate(invalid="ignore"):  # inf - inf is NaN, which fails below
            d = np.abs(out.astype(np.float64) - ref)  # (1, n_out)
            limit = self.atol + self.rtol * np.abs(ref.astype(np.float64))
            past = d - limit
        past[np.isnan(past)] = np.inf  # a NaN on either side: the worst element
        j = int(np.argmax(past))
        if self.worst is None or past.flat[j] > self.worst[0]:
            self.worst = (float(past.flat[j]), i, float(d.flat[j]), float(limit.flat[j]))
        diff = float(np.max(d))  # NaN where the output has one
        if not math.isnan(self.max_diff) and not diff <= self.max_diff:  # not max(): max(0.0, nan) is 0.0
            self.max_diff = diff  # a NaN, once seen, stays
        if self.labels is not None and int(np.argmax(out)) == int(self.labels[i]):
            self.correct += 1
        self.n += 1

    def failure(self):
        """The job's answer when an element lies past its limit (a NaN included), else None."""
        if self.worst is None:
            return None
        _, i, diff, limit = self.worst
        if diff <= limit:  # NaN compares false: it fails
            return None
        return {"ok": False, "output_max_abs_diff": self.max_diff if math.isfinite(self.max_diff) else None,
                "error": "%s differs from sample_io by %.3g where the limit there is %.3g (%s) at sample %d of %d"
                         % (self.what, diff, limit, self.rule(), i, self.n)}

    def rule(self):
        """'atol 0.0005 + rtol 0.0001*|y_ref|'."""
        return "atol %g + rtol %g*|y_ref|" % (self.atol, self.rtol)

    def fields(self):
        """What a passed check adds to the job's result."""
        return {"output_max_abs_diff": self.max_diff, "output_check_passed": True, "samples_checked": self.n,
                "accuracy": self.correct / float(self.n) if self.labels is not None else None}
