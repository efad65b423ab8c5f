"""The training runtimes (issue #39): a client's local step, one class per training format, the registry
``TRAINING_RUNTIMES`` (format -> class; ``runtimes.RUNTIMES`` holds them too). Each has ``installed_version()``
(without loading anything heavy; raises ImportError saying what is missing), ``load(path, threads, lr,
momentum)``, ``step(x, y)`` (one forward, backward and SGD update on the minibatch; returns the loss as the
runtime holds it), ``loss_value(loss)``, ``trained(i)`` (the flat float32 values of ``t<i>`` now) and
``version()``. torch and ExecuTorch are imported where used; ``x``, ``y`` are numpy arrays."""

import os
import re

from .errors import RunFailed


def _find_spec(name):
    """importlib's spec of ``name``, or None (a parent that fails to import counts as missing)."""
    import importlib.util
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None


def _package_dir(name):
    spec = _find_spec(name)
    if spec is None:
        raise ImportError("no module named %r" % name)
    locations = list(spec.submodule_search_locations or [])
    return locations[0] if locations else os.path.dirname(spec.origin or "")


def torch_version_without_import():
    """torch's version read from its version.py (importing torch takes seconds), or raises ImportError."""
    where = _package_dir("torch")
    try:
        with open(os.path.join(where, "version.py")) as f:
            m = re.search(r"""^__version__\s*(?::\s*\w+\s*)?=\s*['"]([^'"]+)['"]""", f.read(), re.M)
    except (IOError, OSError):
        m = None
    return m.group(1) if m else "unknown"


class ExecuTorchTrainingRuntime(object):
    """Format ``pte-train``: ExecuTorch's joint forward-backward program, run by
    ``executorch.extension.training`` (``forward_backward`` fills the gradients, its SGD steps the parameters in
    place; the optimizer is made after the first ``forward_backward``, which is when the parameters exist)."""

    runtime = "executorch"
    training = True

    @staticmethod
    def installed_version():
        where = _package_dir("executorch.extension.training")  # imports executorch.extension only, not torch
        lib = os.path.join(where, "pybindings")
        if not any(n.startswith("_training_lib") for n in (os.listdir(lib) if os.path.isdir(lib) else ())):
            raise ImportError("executorch.extension.training has no _training_lib in %s" % lib)
        torch_version_without_import()  # its runtime imports torch
        try:
            from executorch.version import __version__
        except ImportError:
            __version__ = "unknown"
        return "executorch " + __version__

    def __init__(self):
        import torch
        from executorch.extension.training import _load_for_executorch_for_training, get_sgd_optimizer
        self.torch = torch
        self._load = _load_for_executorch_for_training
        self._sgd = get_sgd_optimizer
        self.mod = self.opt = None

    def version(self):
        return ExecuTorchTrainingRuntime.installed_version()

    def load(self, path, threads, lr, momentum):
        try:
            from executorch.extension.pybindings import portable_lib
            portable_lib._unsafe_reset_threadpool(threads)
        except (ImportError, AttributeError):
            pass
        self.lr, self.momentum = float(lr), float(momentum)
        # from the path (the runtime reads the file itself): a module loaded from a bytes buffer reads it in place
        # and dies when the buffer goes first
        self.mod = self._load(path)
        self.opt = None

    def step(self, x, y):
        out = self.mod.forward_backward("forward", (x, y))
        if self.opt is None:
            self.opt = self._sgd(self.mod.named_parameters(), self.lr, self.momentum)
        self.opt.step(self.mod.named_gradients())
        return out[0]

    def tensors(self, x, y):
        """The minibatch as this runtime's inputs (converted once, outside the timed steps)."""
        return self.torch.from_numpy(x), self.torch.from_numpy(y)

    @staticmethod
    def loss_value(loss):
        return float(loss)

    def trained(self, i):
        return self.mod.named_parameters()["t%d" % i].detach().numpy().reshape(-1)


class TorchTrainingRuntime(object):
    """Format ``torch-train``: the step as a ``torch.export`` program, ``torch.export.load(...).module()``, its
    parameters ``t0, t1, ...`` stepped by ``torch.optim.SGD`` after ``loss.backward()``."""

    runtime = "torch"
    training = True

    @staticmethod
    def installed_version():
        version = torch_version_without_import()
        release = tuple(int(n) for n in re.findall(r"\d+", version.split("+")[0])[:2])
        if version != "unknown" and release < (2, 1):
            raise ImportError("torch %s has no torch.export (needs torch >= 2.1)" % version)
        return "torch " + version

    def __init__(self):
        import torch
        self.torch = torch
        if not hasattr(torch, "export"):
            raise ImportError("torch %s has no torch.export (needs torch >= 2.1)" % torch.__version__)
        self.module = self.opt = None

    def version(self):
        return "torch " + self.torch.__version__

    def load(self, path, threads, lr, momentum):
        torch = self.torch
        torch.set_num_threads(threads)
        self.module = torch.export.load(path).module()
        params = dict(self.module.named_parameters())
        self.params = []
        i = 0
        while "t%d" % i in params:
            self.params.append(params["t%d" % i])
            i += 1
        if not self.params:
            raise RunFailed("%s has no trained parameters t0, t1, ... (has %s)" % (path, ", ".join(sorted(params))))
        self.opt = torch.optim.SGD(self.params, lr=float(lr), momentum=float(momentum))

    def tensors(self, x, y):
        return self.torch.from_numpy(x), self.torch.from_numpy(y)

    def step(self, x, y):
        self.opt.zero_grad(set_to_none=True)
        (loss,) = self.module(x, y)
        loss.backward()
        self.opt.step()
        return loss

    @staticmethod
    def loss_value(loss):
        return float(loss.detach())

    def trained(self, i):
        return self.params[i].detach().numpy().reshape(-1)


# One registry: training format -> runtime class (edgemask/targets.py's FORMATS has these formats too)
TRAINING_RUNTIMES = {"pte-train": ExecuTorchTrainingRuntime, "torch-train": TorchTrainingRuntime}
