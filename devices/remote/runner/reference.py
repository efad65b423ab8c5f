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


def read_train_io(path):
    """train_io.npz (a training job's reference, written by export.training.write_train_io) -> dict: ``x`` (B, ...)
    float32, ``y`` (B,) int64, ``lr``, ``momentum``, ``loss`` (floats: the host's first-step loss), ``names``
    (the task's names of t0, t1, ...), ``checks`` [(i, flat indices, the host's values of t<i> there after one
    SGD step from the file's state)]."""
    import numpy as np

    with np.load(path, allow_pickle=False) as npz:
        missing = [k for k in ("x", "y", "lr", "momentum", "loss", "names", "index_0", "after_0")
                   if k not in npz.files]
        if missing:
            raise RunFailed("%s has no array %s (has %s); export the artifact again"
                            % (path, ", ".join(repr(k) for k in missing), ", ".join(sorted(npz.files))))
        io = {"x": np.ascontiguousarray(npz["x"], dtype=np.float32),
              "y": np.ascontiguousarray(npz["y"], dtype=np.int64),
              "lr": float(npz["lr"]), "momentum": float(npz["momentum"]), "loss": float(npz["loss"]),
              "names": [str(n) for n in npz["names"]], "checks": []}
        i = 0
        while "index_%d" % i in npz.files:
            if "after_%d" % i not in npz.files:
                raise RunFailed("%s has index_%d but no after_%d; export the artifact again" % (path, i, i))
            idx = np.asarray(npz["index_%d" % i], dtype=np.int64)
            after = np.asarray(npz["after_%d" % i], dtype=np.float32)
            if idx.shape != after.shape:
                raise RunFailed("%s: index_%d has shape %s but after_%d %s" % (path, i, idx.shape, i, after.shape))
            io["checks"].append((i, idx, after))
            i += 1
    if io["x"].shape[0] == 0 or io["x"].shape[0] != io["y"].shape[0]:
        raise RunFailed("%s: x holds %d samples and y %d" % (path, io["x"].shape[0], io["y"].shape[0]))
    return io


class StepCheck(object):
    """One training step from the file's state held to the host's (export's rule, docs/contracts.md), elementwise
    on the tensors train_io.npz holds:

        |t - t_ref| <= atol + rtol*|t_ref|   and the loss   |loss - loss_ref| <= atol + rtol*|loss_ref|

    (t_ref: the host's ``after_<i>`` at ``index_<i>``; a NaN on either side fails). ``failure()`` names the first
    quantity past its limit."""

    def __init__(self, io, atol, rtol=0.0):
        self.io, self.atol, self.rtol = io, float(atol), float(rtol)
        self.max_diff = 0.0
        self.failed = None

    def _name(self, i):
        names = self.io["names"]
        return "t%d (%r)" % (i, names[i]) if i < len(names) else "t%d" % i

    def check(self, loss, trained):
        """``loss``: the step's loss (float); ``trained(i)``: t<i> after the step, flat. Sets ``failed``."""
        import numpy as np

        ref = self.io["loss"]
        d = abs(loss - ref)
        limit = self.atol + self.rtol * abs(ref)
        if not d <= limit:
            self.failed = ("the step's loss %.6g differs from the host's %.6g by %.3g where the limit is %.3g (%s)"
                           % (loss, ref, d, limit, self.rule()))
            return
        for i, idx, after in self.io["checks"]:
            try:
                t = trained(i)
            except (KeyError, IndexError):
                self.failed = "the program has no trained tensor %s that train_io.npz checks" % self._name(i)
                return
            if idx.size and (int(idx.max()) >= t.size or int(idx.min()) < 0):
                self.failed = ("%s holds %d elements; train_io.npz checks index %d"
                               % (self._name(i), t.size, int(idx.max())))
                return
            got = t[idx].astype(np.float64)
            with np.errstate(invalid="ignore"):
                diff = np.abs(got - after)
                past = diff - (self.atol + self.rtol * np.abs(after.astype(np.float64)))
            past[np.isnan(past)] = np.inf
            j = int(np.argmax(past)) if past.size else 0
            worst = float(np.max(diff)) if diff.size else 0.0
            if not worst <= self.max_diff:
                self.max_diff = worst
            if past.size and past[j] > 0:
                self.failed = ("after one step, %s differs from the host's by %.3g at element %d where the limit is "
                               "%.3g (%s)" % (self._name(i), float(diff[j]), int(idx[j]),
                                              self.atol + self.rtol * abs(float(after[j])), self.rule()))
                return

    def rule(self):
        return "atol %g + rtol %g*|t_ref|" % (self.atol, self.rtol)

    def failure(self):
        if self.failed is None:
            return None
        return {"ok": False, "output_max_abs_diff": self.max_diff if math.isfinite(self.max_diff) else None,
                "error": "training step check failed: " + self.failed}
