"""How much host memory a training run needs, estimated from its config and its dataset's sizes before anything of
that size exists: ``edgemask train`` prints it and refuses a run that cannot fit this host before it partitions the
data or builds a model (:func:`edgemask.trainer.simulation.train`).

Nothing is built to be measured: the model is built on the ``meta`` device (shapes, no memory: :func:`of_shapes`),
the data's sizes come from the dataset's size function (:func:`~edgemask.trainer.data.base.data_sizes`: the config,
the dataset's fixed sizes, a file's header or length), and a client's local step is the engine's own probe run on
meta tensors (:func:`edgemask.trainer.batched._probe`).

The host holds, at most:

* the runtime, **measured**: this process's resident memory once the modules a run imports are imported
  (:func:`runtime_bytes`);
* the data: every client's train and test samples and a global test set (bounds from the sizes), and each client's
  objects (:data:`CLIENT_BYTES`);
* the model: the server's parameters and buffers and the algorithm's shared model-sized tensors (FedMask's frozen
  weights, global mask, shared start), :data:`MODEL_COPIES` copies;
* per device: what the algorithm keeps for each client between rounds (``Algorithm.client_state_bytes``: FedMask's
  masks in bits, Ditto's personal model, ...), in the device store on disk (:mod:`edgemask.trainer.device_store`);
  the host holds it for the devices a round trains or a part of an evaluation reads at once (:attr:`Footprint.held`);
* the history: one row a round × client × metric (:func:`history_bytes`);
* the work of one phase at a time, the largest (:meth:`Footprint.work`): reading the data (the builder's arrays),
  the set-up (``Algorithm.setup_bytes``: FedMask's ClientPruning), a round (the engine's stacked training, the
  round's results and tasks) or an evaluation (a chunk of stacked models and their activations);
* what the tuned allocator keeps of the freed work (:mod:`edgemask.trainer.allocator`: up to its trim threshold).

On ``cuda`` the stacked training and the evaluation run on the GPU, which the engine sizes to half its free memory
(an evaluation chunk to a quarter: ``batched.eval_memory_budget``); the host then holds none of that work.
"""

from __future__ import annotations

import importlib
import resource
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from edgemask.errors import EdgemaskError
from edgemask.trainer import batched
from edgemask.trainer.accounting import copy_bytes
from edgemask.trainer.algorithms import ALGORITHMS
from edgemask.trainer.algorithms.base import Algorithm
from edgemask.trainer.config import TrainConfig
from edgemask.trainer.data.base import DataSizes, FederatedDataset, data_sizes
from edgemask.trainer.device_store import EVAL_PART_BYTES
from edgemask.trainer.records import ClientState, LocalTask
from edgemask.trainer.sampling import clients_per_round
from edgemask.trainer.task_functions import forget_context

# What a run imports after its estimate, imported before the runtime is measured: torch.func's transforms import
# torch._dynamo (and sympy with it), the run directory's history needs pandas and pyarrow (70 + 70 MB measured).
RUN_IMPORTS = ("torch._dynamo", "pandas", "pyarrow.parquet")
MODEL_COPIES = 6  # model-sized tensors the server and the algorithm share across clients, at most
TASK_PART_BYTES = 256 << 20  # trainable bytes of a round's tasks built before the engine trains them (round loop)
# Per client stacked by the engine, its trainable tensors: the value, the gradient, the momentum, the update's
# direction and the first step's out-of-place copy (trainer.batched._train_stacked).
ENGINE_COPIES = 5
CLIENT_BYTES = 8 << 10  # a client's objects besides its samples (4.8 kB measured: 1,700 digits clients, FedAvg)
# Code pages of the libraries' kernels a run touches beyond the warm-up's, and their first-use buffers: the
# digits configs peak 10-25 MB above the warmed-up runtime with their own terms counted (benchmarks/bench_footprint.py).
LAZY_PAGES = 32 << 20
HISTORY_ROW_COPIES = 3  # a history row as a dict, then in the DataFrame and the Arrow table written from it
GB = 1e9


@dataclass(frozen=True)
class Footprint:
    """A run's host memory, term by term (bytes), and where its stacked training runs. ``phases``: each phase's
    work, ``(what, bytes)``; one phase runs at a time, so only the largest counts (:meth:`work`)."""

    runtime: int
    data: int
    model: int
    per_device: int
    devices: int
    phases: tuple[tuple[str, int], ...] = ()
    device: str = "cpu"
    history: int = 0
    retained: int = 0
    held: int | None = None  # devices whose state the host holds at once (None: every device)

    def work(self) -> tuple[str, int]:
        """The largest phase, ``(what, bytes)``."""
        return max(self.phases, key=lambda p: p[1], default=("no work", 0))

    @property
    def host(self) -> int:
        return (self.runtime + self.data + self.model + self.per_device * self.held_devices + self.history
                + self.work()[1] + self.retained)

    @property
    def held_devices(self) -> int:
        return self.devices if self.held is None else min(self.held, self.devices)

    def line(self) -> str:
        """One line for the terminal."""
        what, work = self.work()
        state = (f"per device {_size(self.per_device)} × {self.devices} devices = "
                 f"{_size(self.per_device * self.devices)}" if self.held is None else
                 f"device state {_size(self.per_device)} × {self.held_devices} of {self.devices} devices at once, "
                 f"{_size(self.per_device * self.devices)} on disk")
        return (f"memory estimate: {_size(self.host)} on the host ({state}, {what} {_size(work)}"
                f"{' (stacked training on the GPU)' if self.device == 'cuda' else ''}, data {_size(self.data)}, "
                f"model and runtime {_size(self.model + self.runtime)})")


def _size(n: int) -> str:
    return f"{n / GB:.2f} GB" if n >= GB / 10 else f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def estimate(cfg: TrainConfig) -> Footprint:
    """The footprint of ``cfg``'s run from its config and its dataset's sizes alone: nothing of the run's size is
    allocated (the model on the meta device), so an estimate of 360 GB takes a second and a few MB."""
    runtime = runtime_bytes()
    sizes = data_sizes(cfg.data, cfg.run.seed)
    algo = of_shapes(cfg, sizes.input_shape, sizes.num_classes, sizes.input_dtype)
    try:
        return _estimate(cfg, sizes, algo, runtime)
    finally:
        forget_context(algo.model_spec, algo.model)


def of_shapes(cfg: TrainConfig, input_shape: tuple[int, ...], num_classes: int,
              input_dtype: str = "float32") -> Algorithm:
    """``cfg``'s algorithm with its model on the ``meta`` device (every tensor a shape, no memory) and a dataset of
    no clients: what the estimate asks of it (the model's bytes, ``client_state_bytes``, ``setup_bytes``, a local
    task's tensors) before any data or weight exists. Set up, trained or evaluated it cannot be. Its model is lent
    to the process's model context (the task functions it names resolve on it) until the estimate forgets it
    (:func:`~edgemask.trainer.task_functions.forget_context`); the caller's random state is left as it was."""
    dataset = FederatedDataset(cfg.data.name, tuple(input_shape), num_classes, (), input_dtype=input_dtype)
    with torch.random.fork_rng(devices=[]):
        return ALGORITHMS.get(cfg.algorithm.name)(cfg, dataset, meta=True)


def _estimate(cfg: TrainConfig, sizes: DataSizes, algo: Algorithm, runtime: int) -> Footprint:
    t, d = cfg.training, cfg.data
    n = sizes.clients
    model = copy_bytes(algo.global_params, buffers=algo.global_buffers)
    sample = sizes.sample_bytes
    data = sizes.held(d) * sample + n * CLIENT_BYTES
    largest = sizes.largest_train(d)
    on_gpu = t.device == "cuda" and t.batched
    step = LocalStep.of(algo, sizes, min(t.batch_size, max(largest, 1)), t.batched)

    def engine_pass(k: int) -> int:
        """The engine's stacked training of ``k`` clients (with the clients' padded samples it keeps)."""
        if on_gpu:
            return 0
        padded = min(batched.PADDED_CACHE_BYTES, k * largest * sample)
        return step.chunk_bytes(k) + padded

    phases = [("reading the data", sizes.read)]
    setup = algo.setup_bytes(n, engine_pass)
    if setup:
        phases.append(("the set-up", setup))
    per_round = n if type(algo).round_clients is not Algorithm.round_clients else clients_per_round(n, t.participation)
    if cfg.system is not None:  # a round over-commits: it trains more devices than it aggregates
        per_round = max(per_round, cfg.system.selected(clients_per_round(n, t.participation), n))
    # a round: its tasks built a part at a time, the engine's chunks, the earlier chunks' trained tensors (a
    # part's, when the part's results become its uploads as soon as it has trained: Algorithm.uploads_alone)
    results, uploads = per_round, 0
    if algo.uploads_alone:  # every upload held to the aggregate: a bool per trained float32 (FedMask's masks)
        results = min(per_round, -(-TASK_PART_BYTES // max(step.trainable, 1)))
        uploads = per_round * step.trainable // 4
    earlier = max(0, results - step.chunk) * step.trainable + uploads
    phases.append(("a round's training", engine_pass(per_round) + earlier
                   + min(TASK_PART_BYTES, per_round * step.task)))
    if not on_gpu:
        phases.append(("an evaluation", evaluation_bytes(model, step.inference, n, largest, sample)))
    per_device = algo.client_state_bytes()
    # the device store holds every device's state; the host a round's devices' or an evaluation part's at once
    held = max(per_round, EVAL_PART_BYTES // max(per_device, 1))
    return Footprint(runtime, data, MODEL_COPIES * model, per_device, n, tuple(phases),
                     "cuda" if on_gpu else "cpu", history_bytes(cfg, n), held=held)


@dataclass(frozen=True)
class LocalStep:
    """One client's local step, from its task's shapes: ``trainable`` bytes, its ``task`` bytes (trainable, its
    own constants and gradient keep masks), what the engine stacks per client (:meth:`chunk_bytes`) and the
    ``activation`` bytes a sample's forward saves through the plain model."""

    trainable: int
    task: int
    per_client: int  # bytes a stacked client holds in a step, at most
    chunk: int  # clients the engine stacks at once
    activation: int
    inference: int  # bytes a sample's forward holds at once without autograd (evaluation)

    @classmethod
    def of(cls, algo: Algorithm, sizes: DataSizes, batch: int, together: bool) -> "LocalStep":
        """The algorithm's task as a device would run it, rebuilt from the model's shapes
        (``Algorithm.device_task`` for the dense baseline: FedMask's ClientPruning step), or FedAvg's with a keep
        mask where the algorithm cannot rebuild it without its set-up (PerFedMask); the bytes autograd saves in
        its step, by the engine's own probe on meta tensors; the clients a chunk stacks, by the engine's own
        rule (:func:`edgemask.trainer.batched.clients_per_chunk`)."""
        act = activation_bytes(algo.model, sizes.input_shape, sizes.input_dtype)
        with torch.device("meta"):
            task = _device_task(algo)
            x = torch.empty((max(sizes.largest_train(algo.cfg.data), 1), *sizes.input_shape),
                            dtype=getattr(torch, sizes.input_dtype))
            y = torch.empty(x.shape[0], dtype=torch.int64)
            probe = batched._probe(task, (x, y), batch, torch.device("meta"))
            fresh = batched._probe(task, (x, y), batch, torch.device("meta"), fresh_only=True)
        shared = frozenset(k for k in task.constants if k.startswith("frozen:"))  # every client's same tensor
        trainable = _nbytes(task.trainable)
        own = _nbytes({k: v for k, v in task.constants.items() if k not in shared})
        keep = _nbytes(task.grad_keep)
        saved = fresh[0] if not isinstance(fresh, str) else batch * act  # no batched rule: the loop's step
        samples = x.shape[0] * sizes.sample_bytes
        per_client = ENGINE_COPIES * trainable + own + keep + 2 * _nbytes(task.buffers) + samples + saved
        chunk = 1
        if together and not isinstance(probe, str):  # as many as the engine stacks, by its own count
            chunk = batched.clients_per_chunk(task, x.shape[0], x[:1], probe[0], torch.device("cpu"), None, shared)
        return cls(trainable, trainable + own + keep, per_client, chunk, act,
                   inference_bytes(algo.model, sizes.input_shape, sizes.input_dtype))

    def chunk_bytes(self, clients: int) -> int:
        """The engine's stacked training of ``clients`` clients: a chunk at a time (the earlier chunks' results
        are the round's, counted there)."""
        return min(clients, self.chunk) * self.per_client


def _device_task(algo: Algorithm) -> LocalTask:
    try:
        task = algo.device_task(None, ClientState())
    except (EdgemaskError, IndexError, KeyError, ValueError, RuntimeError, NotImplementedError):
        # a task rebuilt from what its set-up computes over the clients (PerFedMask's P^mask from its budgets,
        # one per client: checked against no clients here, against the run's at its set-up)
        task = None
    if task is None:
        task = Algorithm.local_task(algo, "dense", 0)
        task.grad_keep = {k: torch.empty_like(v) for k, v in task.trainable.items()}
    return task


def _nbytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(v.numel() * v.element_size() for v in tensors.values())


def activation_bytes(model: torch.nn.Module, input_shape: tuple[int, ...], input_dtype: str = "float32") -> int:
    """Bytes autograd saves for one sample's forward through ``model``, parameters left out: a forward of two
    samples in training mode on the meta device (``model``'s own, or a model built there), halved. Batch norm's
    running statistics move on a meta model only."""
    x = torch.zeros((2, *input_shape), dtype=getattr(torch, input_dtype), device="meta")
    if next(iter(model.parameters()), torch.empty(0, device="meta")).device.type != "meta":
        raise ValueError("activation_bytes measures a model on the meta device (of_shapes builds one)")
    params = {p.untyped_storage()._cdata for p in model.parameters()}  # a parameter's views share its storage
    saved, lstm = [0], {}  # lstm: module -> [its input's shape, the bytes it saved on meta]
    current: list[torch.nn.Module] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage()._cdata not in params:
            saved[0] += t.numel() * t.element_size()
            if current:
                lstm[current[-1]][1] += t.numel() * t.element_size()
        return t

    def enter(module: torch.nn.Module, args: tuple) -> None:
        lstm[module] = [tuple(args[0].shape), 0]
        current.append(module)

    def leave(*_) -> None:  # a forward hook that returned something would replace the output
        current.pop()

    handles = [h for m in model.modules() if isinstance(m, torch.nn.LSTM)
               for h in (m.register_forward_pre_hook(enter), m.register_forward_hook(leave))]
    training = model.training
    model.train()
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(x)
    finally:
        model.train(training)
        for h in handles:
            h.remove()
    for module, (shape, on_meta) in lstm.items():  # the CPU's fused LSTM saves more than meta's step by step
        saved[0] += _cpu_lstm_saved(module, shape) - on_meta
    return saved[0] // 2


LSTM_PROBE_BYTES = 256 << 20  # an LSTM whose weights are larger is counted as meta counts it, twice


def _cpu_lstm_saved(module: torch.nn.LSTM, shape: tuple[int, ...]) -> int:
    """What a CPU copy of ``module`` (its sizes, its weights' values unread) saves in a forward of an input of
    ``shape``: the CPU's fused kernel keeps a workspace that the meta device's decomposition does not."""
    weights = sum(p.numel() * p.element_size() for p in module.parameters())
    if weights > LSTM_PROBE_BYTES:
        return 2 * _meta_lstm_saved(module, shape)
    real = torch.nn.LSTM(module.input_size, module.hidden_size, module.num_layers, module.bias, module.batch_first,
                         module.dropout, module.bidirectional, module.proj_size)
    mine = {p.untyped_storage()._cdata for p in real.parameters()}
    saved = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal saved
        if t.untyped_storage()._cdata not in mine:
            saved += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        real(torch.zeros(shape))
    return saved


def _meta_lstm_saved(module: torch.nn.LSTM, shape: tuple[int, ...]) -> int:
    saved = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal saved
        saved += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(torch.zeros(shape, device="meta"))
    return saved


def inference_bytes(model: torch.nn.Module, input_shape: tuple[int, ...], input_dtype: str = "float32") -> int:
    """Bytes one sample's forward holds at once without autograd, at most: over the model's modules, the largest
    input and output alive together, twice (a residual branch's input waits beside them), from a forward of two
    samples on the meta device, halved."""
    x = torch.zeros((2, *input_shape), dtype=getattr(torch, input_dtype), device="meta")
    widest = [0]

    def hook(module: torch.nn.Module, args: tuple, out) -> None:
        tensors = [t for t in (*args, *(out if isinstance(out, tuple) else (out,))) if isinstance(t, torch.Tensor)]
        widest[0] = max(widest[0], sum(t.numel() * t.element_size() for t in tensors))

    handles = [m.register_forward_hook(hook) for m in model.modules() if not list(m.children())]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in handles:
            h.remove()
    return widest[0]  # (in + out) of two samples, halved, twice


def evaluation_bytes(model: int, inference: int, clients: int, largest: int, sample: int) -> int:
    """An evaluation's chunk of stacked models and their forward (:func:`edgemask.trainer.batched.evaluate_many`):
    per model its own tensors (a masked model's unpacked mask and masked weights: twice the model, at most) and a
    block of test samples' forward (``inference`` a sample), as many models as its budgets allow, and the
    clients' padded test sets."""
    block = max(1, min(512, largest))
    own = 2 * model
    chunk = max(1, min(batched.EVAL_SAMPLES_PER_CALL // block, batched.EVAL_MEMORY_BUDGET // max(own, 1)))
    padded = min(batched.PADDED_CACHE_BYTES, clients * largest * sample)
    return min(clients, chunk) * (own + block * inference) + padded


def history_bytes(cfg: TrainConfig, clients: int) -> int:
    """The history's rows (:func:`history_rows`), each a dict of a round, a client, a metric and a value (its
    size measured here), kept until the run directory writes it through pandas and Arrow."""
    row = {"round": 1 << 20, "client": "client-000", "metric": "accuracy", "value": 0.5}
    each = sys.getsizeof(row) + sys.getsizeof(row["round"]) + sys.getsizeof(row["value"]) + 8  # + its list slot
    return HISTORY_ROW_COPIES * each * history_rows(cfg, clients)


def history_rows(cfg: TrainConfig, clients: int) -> int:
    """The history's rows, at most: per round about 12 metrics a trained client and 2 an evaluated one, and a
    few of the server's (the run directory's room check counts the same)."""
    per_round = clients_per_round(clients, cfg.training.participation)
    return cfg.training.rounds * (per_round * 12 + 2 * clients + 4)


def runtime_bytes() -> int:
    """This process's resident memory (``VmRSS``) once :data:`RUN_IMPORTS` are imported and what a run starts
    on first use is started (:func:`warm_up`): Python, torch and every library the run will hold, measured, not
    assumed, plus :data:`LAZY_PAGES`. Where /proc cannot be read, the peak so far (``getrusage``)."""
    for name in RUN_IMPORTS:
        importlib.import_module(name)
    warm_up()
    rss = _status_kb("VmRSS")
    return LAZY_PAGES + (rss * 1024 if rss is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


def warm_up() -> None:
    """What a run starts on its first use, started on a few numbers: torch's thread pool and autograd (a matmul's
    backward), oneDNN's convolution, torch.func's vmap over grad (the batched engine's), a Parquet table written
    to memory (the history's). 27 MB measured on this project's host, 0.1 s."""
    import io

    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq
    from torch.func import grad, vmap

    w = torch.ones(4, 8, 8, requires_grad=True)
    (w @ w).relu().sum().backward()
    vmap(grad(lambda v, a: (a @ v).relu().sum()), in_dims=(0, None))(w.detach(), torch.ones(2, 8))
    torch.nn.functional.conv2d(torch.ones(1, 2, 6, 6, requires_grad=True), torch.ones(2, 2, 3, 3), padding=1).sum() \
        .backward()
    table = pd.DataFrame({"round": [0], "client": ["client-000"], "metric": ["accuracy"], "value": [0.5]})
    pq.write_table(pa.Table.from_pandas(table), io.BytesIO())


def _status_kb(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def available_bytes() -> int | None:
    """This host's memory available to a new allocation now (``MemAvailable`` of /proc/meminfo), plus what this
    process holds already (the estimate counts it); None where it cannot be read."""
    try:
        info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
        rss = _status_kb("VmRSS")
        return (int(info["MemAvailable"].split()[0]) + (rss or 0)) * 1024
    except (OSError, KeyError, ValueError):
        return None


def check_fits(fp: Footprint, source: str, available: int | None = None) -> None:
    """Refuse (one line: what it needs, what this host has, what to change) a run whose estimate exceeds the
    memory ``available`` (default: :func:`available_bytes`)."""
    available = available if available is not None else available_bytes()
    if available is None or fp.host <= available:
        return
    state = fp.per_device * fp.held_devices
    what, work = fp.work()
    bigger = max((("the per-device state", state), ("the model", fp.model), (what, work), ("the data", fp.data),
                  ("the history", fp.history)), key=lambda p: p[1])[0]
    change = ("use fewer rounds (training.rounds) or devices (data.num_clients)" if bigger == "the history" else
              "use fewer devices (data.num_clients) or a smaller model ([model.args], e.g. width)")
    raise EdgemaskError(
        f"{source}: this run needs about {fp.host / GB:.1f} GB of host memory and this host has "
        f"{available / GB:.1f} GB "
        f"available; most of it is {bigger} (per device {_size(fp.per_device)} × {fp.held_devices} devices held = "
        f"{state / GB:.1f} GB; model {fp.model / GB:.1f} GB; {what} {work / GB:.1f} GB; data {fp.data / GB:.1f} "
        f"GB; history {fp.history / GB:.1f} GB): {change}; "
        f"training.device = \"cuda\" moves the stacked training off the host; --no-memory-check runs it anyway")
