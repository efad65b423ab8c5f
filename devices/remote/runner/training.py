"""The training runtimes (issue #39): a client's local step, one class per training format, the registry
``TRAINING_RUNTIMES`` (format -> class; ``runtimes.RUNTIMES`` holds them too). Each has ``installed_version()``
(without loading anything heavy; raises ImportError saying what is missing), ``load(path, threads, lr,
momentum)``, ``step(x, y)`` (one forward, backward and SGD update on the minibatch; returns the loss as the
runtime holds it), ``loss_value(loss)``, ``trained(i)`` (the flat float32 values of ``t<i>`` now) and
``version()``, and ``profile_steps(x, y, warmup, runs)`` (per-operator profiled steps, or ProfilerMissing saying why
not). torch and ExecuTorch are imported where used; ``x``, ``y`` are numpy arrays.

A torch-train step's profile (:func:`torch_step_ops`): each profiled step runs under ``torch.profiler`` (CPU events,
record_shapes off) with three marks, ``edgemask.update`` (zero_grad, the optimizer's step), ``edgemask.forward`` and
``edgemask.backward``. The forward's top-level events are the module's graph nodes in order (the unlifted program
calls ``torch.ops.aten.*`` node by node), matched by op name; each node's events carry autograd sequence numbers,
and the backward's ``autograd::engine::evaluate_function: <Node>`` events carry the number of the forward op that
made them, so every backward event goes to its forward node. An op entry is ``[name, op, us, phase]``:

* ``name``: ``<node>[<keys>]`` -- the node and the program's tensors it reads (``t<i>`` trained, ``f<i>`` frozen,
  ``g<i>`` the gate of ``t<i>``, ``c<i>`` constants, ``b<i>`` buffers), directly or through nodes that do not
  depend on the minibatch (a mask or a gated weight made from ``t<i>``); the host maps them to the manifest's
  layers (``profiling.train_predict``), since the exported step carries no module path;
* ``us``: the event's inclusive CPU time; ``phase``: ``forward`` (a node on the minibatch's path), ``param`` (a node
  on the tensors alone: masks, gates, regularizers), ``backward``, ``update`` (zero_grad, AccumulateGrad, the
  optimizer's step) or ``other`` (an event no node claims)."""

import os
import re

from .errors import ProfilerMissing, RunFailed

# the marks around a profiled step's parts (record_function names)
STEP_MARK, FORWARD_MARK, BACKWARD_MARK, UPDATE_MARK = ("edgemask.step", "edgemask.forward", "edgemask.backward",
                                                      "edgemask.update")
EVALUATE = "autograd::engine::evaluate_function: "
PTE_TRAIN_NO_PROFILE = ("a pte-train step has no per-layer profile here: ExecuTorch's training loader "
                        "(executorch.extension.training) takes no ETDump event tracer, and export writes no ETRecord "
                        "for train.pte to map its events to layers")


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


def graph_nodes(graph):
    """The operator nodes of a step's (unlifted) fx graph, in order: ``(op name as the profiler names it, entry
    name, phase)`` per ``call_function`` node whose target is an aten operator (``aten::linear``,
    ``"linear_1[t2,t3]"``, ``"forward"`` or ``"param"``); see the module's docstring for the names and phases."""
    data, keys, out = {}, {}, []
    for node in graph.nodes:
        if node.op == "placeholder":  # the minibatch (x, y)
            data[node], keys[node] = True, frozenset()
        elif node.op == "get_attr":  # the program's tensors: t<i>, f<i>, g<i>, c<i>, b<i>
            data[node], keys[node] = False, frozenset([str(node.target)])
        elif node.op == "call_function":
            ins = node.all_input_nodes
            data[node] = any(data.get(i, False) for i in ins)
            keys[node] = frozenset().union(*[keys.get(i, frozenset()) for i in ins
                                            if not (data[node] and data.get(i, False))])
            schema = getattr(node.target, "_schema", None)
            if schema is not None:
                out.append((schema.name, "%s[%s]" % (node.name, ",".join(sorted(keys[node]))),
                            "forward" if data[node] else "param"))
    return out


def _sequence_numbers(event):
    """Every autograd sequence number in an event's subtree (the op that made an autograd node records it)."""
    out, todo = [], [event]
    while todo:
        e = todo.pop()
        if getattr(e, "sequence_nr", -1) >= 0:
            out.append(e.sequence_nr)
        todo.extend(e.cpu_children)
    return out


def torch_step_ops(step, nodes):
    """One profiled step's op entries ``[name, op, us, phase]`` from its ``edgemask.step`` event (``step``: a
    ``torch.autograd.profiler_util.FunctionEvent`` whose children are the three marks) and the graph's
    :func:`graph_nodes`. The forward's top-level events are matched to the nodes in order by op name (an event that
    is not the next node's, e.g. a guard's, is ``other``); a node with no event raises ProfilerMissing. A sequence
    number goes to the LAST node whose events show it: an op that makes no autograd node shows the next number,
    which the next op that makes one takes."""
    ops, owner, matched = [], {}, 0
    for mark in step.cpu_children:
        for e in mark.cpu_children:
            us = float(e.cpu_time_total)
            if mark.name == FORWARD_MARK:
                if matched < len(nodes) and e.name == nodes[matched][0]:
                    _, name, phase = nodes[matched]
                    matched += 1
                    for seq in _sequence_numbers(e):
                        owner[seq] = name
                    ops.append([name, e.name, us, phase])
                else:
                    ops.append([e.name + "[]", e.name, us, "other"])
            elif mark.name == BACKWARD_MARK and e.name.startswith(EVALUATE):
                fn = e.name[len(EVALUATE):]
                if "AccumulateGrad" in fn:
                    ops.append(["accumulate_grad[]", fn, us, "update"])
                elif e.sequence_nr in owner:
                    ops.append([owner[e.sequence_nr], fn, us, "backward"])
                else:
                    ops.append([fn + "[]", fn, us, "other"])
            elif mark.name == UPDATE_MARK:
                ops.append([e.name + "[]", e.name, us, "update"])
            else:
                ops.append([e.name + "[]", e.name, us, "other"])
    if matched < len(nodes):
        raise ProfilerMissing("the profiled forward has no event for the step's operator %s (%s), %d of %d matched: "
                              "its events do not follow the graph's nodes in this torch"
                              % (nodes[matched][1], nodes[matched][0], matched, len(nodes)))
    return ops


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

    def profile_steps(self, x, y, warmup, runs):
        raise ProfilerMissing(PTE_TRAIN_NO_PROFILE)


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

    def profile_steps(self, x, y, warmup, runs):
        """``warmup`` then ``runs`` steps under torch's profiler (CPU events, record_shapes off), each in the marks
        of :func:`torch_step_ops`; the profile document of ``profilers`` (runs with their end-to-end ms, the
        ``edgemask.step`` event's time as ``total_us`` and the op entries). The steps go on from the state the timed
        ones left."""
        import time

        torch = self.torch
        from torch.autograd.profiler import record_function
        from torch.profiler import ProfilerActivity, profile

        nodes = graph_nodes(self.module.graph)
        opt, module = self.opt, self.module
        e2e = []
        with profile(activities=[ProfilerActivity.CPU], record_shapes=False) as prof:
            for k in range(warmup + runs):
                t0 = time.perf_counter()
                with record_function(STEP_MARK):
                    with record_function(UPDATE_MARK):
                        opt.zero_grad(set_to_none=True)
                    with record_function(FORWARD_MARK):
                        (loss,) = module(x, y)
                    with record_function(BACKWARD_MARK):
                        loss.backward()
                    with record_function(UPDATE_MARK):
                        opt.step()
                e2e.append((time.perf_counter() - t0) * 1000.0)
        steps = sorted((e for e in prof.events() if e.name == STEP_MARK), key=lambda e: e.time_range.start)
        if len(steps) != warmup + runs:
            raise ProfilerMissing("torch's profiler recorded %d profiled steps of %d" % (len(steps), warmup + runs))
        out = []
        for step, ms in list(zip(steps, e2e))[warmup:]:
            out.append({"end_to_end_ms": ms, "total_us": float(step.cpu_time_total), "ops": torch_step_ops(step, nodes)})
        return {"available": True, "profiler": "torch.profiler %s" % torch.__version__, "runs": out, "blocks": []}


# One registry: training format -> runtime class (edgemask/targets.py's FORMATS has these formats too)
TRAINING_RUNTIMES = {"pte-train": ExecuTorchTrainingRuntime, "torch-train": TorchTrainingRuntime}
