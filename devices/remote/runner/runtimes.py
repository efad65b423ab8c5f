"""Runtimes, one registry: format -> class with installed_version(), load(path, threads, profile_dir), run(x) ->
output array, version(), collect_profile(...); the training formats' classes (``training.py``) step instead. numpy and each runtime are imported where used."""

import os

from .errors import ProfilerMissing
from .profilers import TFLITE_NO_PROFILER, executorch_profile, onnxruntime_profile
from .training import TRAINING_RUNTIMES
from .trt import TensorRtRuntime


def _has_module(name):
    import importlib.util
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


class OnnxRuntime(object):
    runtime = "onnxruntime"

    @staticmethod
    def installed_version():
        """Version string without loading a model, or raises ImportError."""
        import onnxruntime
        return "onnxruntime " + onnxruntime.__version__

    def __init__(self):
        import onnxruntime  # noqa: F401  (imported before the RSS baseline)
        self.ort = onnxruntime

    def version(self):
        return "onnxruntime " + self.ort.__version__

    def load(self, path, threads, profile_dir=None):
        opts = self.ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = self.ort.ExecutionMode.ORT_SEQUENTIAL
        if profile_dir is not None:
            opts.enable_profiling = True
            opts.profile_file_prefix = os.path.join(profile_dir, "onnxruntime_profile")
        self.sess = self.ort.InferenceSession(path, sess_options=opts, providers=["CPUExecutionProvider"])
        self.input_name = self.sess.get_inputs()[0].name

    def run(self, x):
        return self.sess.run(None, {self.input_name: x})[0]

    def collect_profile(self, warmup, end_to_end_ms, profile_dir):
        return onnxruntime_profile(self.sess.end_profiling(), warmup, end_to_end_ms)


class ExecuTorchRuntime(object):
    runtime = "executorch"

    @staticmethod
    def installed_version():
        # Importing the runtime loads libtorch (seconds): look for the modules instead.
        for mod in ("executorch.runtime", "torch"):
            if not _has_module(mod):
                raise ImportError("no module named %r" % mod)
        return ExecuTorchRuntime.version(None)

    def __init__(self):
        import torch
        from executorch.runtime import Runtime
        self.torch = torch
        self.et = Runtime.get()

    def version(self):
        try:
            from executorch.version import __version__
        except ImportError:
            __version__ = "unknown"
        return "executorch " + __version__

    def load(self, path, threads, profile_dir=None):
        try:
            from executorch.extension.pybindings import portable_lib
            portable_lib._unsafe_reset_threadpool(threads)
        except (ImportError, AttributeError):
            pass
        if profile_dir is None:
            self.program = self.et.load_program(path)
        else:
            try:
                # no debug buffer: with one, the ETDump also logs every intermediate output, and a run that
                # fills it aborts the process (etdump_flatcc.cpp log_evalue assert, ExecuTorch 1.5.1)
                self.program = self.et.load_program(path, enable_etdump=True)
            except TypeError:
                raise ProfilerMissing("this executorch.runtime has no enable_etdump (ExecuTorch < 0.7)")
        self.method = self.program.load_method("forward")

    def run(self, x):
        out = self.method.execute([self.torch.from_numpy(x)])[0]
        return out.numpy()

    def collect_profile(self, warmup, end_to_end_ms, profile_dir):
        return executorch_profile(self.program, warmup, end_to_end_ms, profile_dir)


class TfliteRuntime(object):
    runtime = "tflite"

    @staticmethod
    def installed_version():
        for name in ("tflite_runtime", "ai_edge_litert"):
            if _has_module(name + ".interpreter"):
                mod = __import__(name)
                return "%s %s" % (name, getattr(mod, "__version__", "unknown"))
        raise ImportError("neither tflite_runtime nor ai_edge_litert is installed")

    def __init__(self):
        try:
            from tflite_runtime.interpreter import Interpreter
            import tflite_runtime as mod
        except ImportError:
            from ai_edge_litert.interpreter import Interpreter
            import ai_edge_litert as mod
        self.Interpreter = Interpreter
        self.mod = mod

    def version(self):
        return "%s %s" % (self.mod.__name__, getattr(self.mod, "__version__", "unknown"))

    def load(self, path, threads, profile_dir=None):
        if profile_dir is not None:
            raise ProfilerMissing(TFLITE_NO_PROFILER)
        self.interp = self.Interpreter(model_path=path, num_threads=threads)
        self.interp.allocate_tensors()
        self.inp = self.interp.get_input_details()[0]
        self.out = self.interp.get_output_details()[0]
        # an int8 file's input and output are integer tensors: q = round(x / s) + z in, (q - z) * s out
        self.quantized = _is_quantized(self.inp) or _is_quantized(self.out)

    def run(self, x):
        if self.quantized:
            x = _tflite_quantize(x, self.inp)
        self.interp.set_tensor(self.inp["index"], x)
        self.interp.invoke()
        y = self.interp.get_tensor(self.out["index"])
        return _tflite_dequantize(y, self.out) if self.quantized else y


def _is_quantized(detail):
    import numpy as np

    return np.dtype(detail["dtype"]).kind != "f" and detail["quantization"][0] != 0


def _tflite_quantize(x, detail):
    import numpy as np

    if not _is_quantized(detail):
        return x.astype(detail["dtype"])
    scale, zero = detail["quantization"]
    info = np.iinfo(detail["dtype"])
    return np.clip(np.round(x / scale) + zero, info.min, info.max).astype(detail["dtype"])


def _tflite_dequantize(q, detail):
    import numpy as np

    if not _is_quantized(detail):
        return q
    scale, zero = detail["quantization"]
    return ((q.astype(np.float32) - zero) * scale).astype(np.float32)


# One registry: format -> runtime class (edgemask/targets.py holds the host's copy of this table; a test compares).
# The training formats' classes (``training``: a local step, not a model) are the training room's.
RUNTIMES = {"onnx": OnnxRuntime, "pte": ExecuTorchRuntime, "tflite": TfliteRuntime, "trt": TensorRtRuntime}
RUNTIMES.update(TRAINING_RUNTIMES)
