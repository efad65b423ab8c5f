"""How much memory a training run needs, estimated before its set-up (``edgemask train`` prints it, and refuses a
run that cannot fit this host before any training time is spent).

The host holds, at most (each term an upper bound of what the code keeps, not a measurement):

* the runtime: Python, torch and the libraries, :data:`RUNTIME_BYTES`;
* the data: every client's train and test tensors, as built (exact: the dataset is read before the estimate);
* the model: the server's parameters and buffers and the algorithm's shared model-sized tensors (FedMask's frozen
  weights, global mask, shared start), :data:`MODEL_COPIES` float32 copies;
* per device: what the algorithm keeps for each client between rounds (``Algorithm.client_state_bytes``: FedMask's
  masks in bits, Ditto's personal model, ...) × the devices;
* a round's work: the selected devices' results (each a copy of what it trains: the model's size) and the tasks
  built at once (:data:`TASK_PART_BYTES`, the round loop's parts);
* the stacked engine: the clients trained together in one call, at most its budget
  (:data:`edgemask.trainer.batched.CPU_MEMORY_BUDGET`; on ``cuda`` the stacked clients are on the GPU, which the
  engine sizes to half its free memory), and an evaluation chunk (:data:`~edgemask.trainer.batched.EVAL_MEMORY_BUDGET`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from edgemask.errors import EdgemaskError
from edgemask.trainer import batched
from edgemask.trainer.accounting import copy_bytes, tensor_bytes
from edgemask.trainer.algorithms.base import Algorithm
from edgemask.trainer.sampling import clients_per_round

RUNTIME_BYTES = 400 << 20  # Python + torch + numpy + pandas imported, nothing trained (measured RSS: 0.25–0.35 GB)
MODEL_COPIES = 6  # model-sized float32 tensors the server and the algorithm share across clients, at most
TASK_PART_BYTES = 256 << 20  # trainable bytes of a round's tasks built before the engine trains them (round loop)
GB = 1e9


@dataclass(frozen=True)
class Footprint:
    """A run's host memory, term by term (bytes), and where its stacked training runs."""

    runtime: int
    data: int
    model: int
    per_device: int
    devices: int
    engine: int
    device: str
    round_work: int = 0

    @property
    def host(self) -> int:
        return self.runtime + self.data + self.model + self.per_device * self.devices + self.engine + self.round_work

    def line(self) -> str:
        """One line for the terminal."""
        engine = "on the GPU" if self.device == "cuda" else _size(self.engine)
        return (f"memory estimate: {_size(self.host)} on the host (per device {_size(self.per_device)} × "
                f"{self.devices} devices = {_size(self.per_device * self.devices)}, a round's results "
                f"{_size(self.round_work)}, stacked training {engine}, data {_size(self.data)}, model and runtime "
                f"{_size(self.model + self.runtime)})")


def _size(n: int) -> str:
    return f"{n / GB:.2f} GB" if n >= GB / 10 else f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def estimate(algo: Algorithm) -> Footprint:
    """The footprint of ``algo``'s run, from its model and data, before ``algo.setup()``. The stacked engine's term
    is what every device trained in one call would take (FedMask's pruning epoch trains them all), capped by the
    engine's budget: per device its trainable copies (value, gradient, momentum, start: 4 × the model) and the
    activations of a minibatch (:func:`activation_bytes`)."""
    t = algo.cfg.training
    model = copy_bytes(algo.global_params, buffers=algo.global_buffers)
    data = sum(tensor_bytes([c.train_x, c.train_y, c.test_x, c.test_y]) for c in algo.dataset.clients)
    n = len(algo.client_ids)
    per_client = 4 * model + t.batch_size * activation_bytes(algo)
    on_gpu = t.device == "cuda" and t.batched
    engine = 0
    if not on_gpu:
        stacked = min(batched.CPU_MEMORY_BUDGET, n * per_client) if t.batched else per_client
        engine = stacked + min(batched.EVAL_MEMORY_BUDGET, n * model)
    per_round = clients_per_round(n, t.participation)
    round_work = per_round * model + min(TASK_PART_BYTES, per_round * model)
    return Footprint(RUNTIME_BYTES, data, MODEL_COPIES * model, algo.client_state_bytes(), n, engine,
                     "cuda" if on_gpu else "cpu", round_work)


def activation_bytes(algo: Algorithm) -> int:
    """Bytes autograd saves for one sample's forward through the model, parameters left out (measured: a forward
    of two samples in training mode, halved)."""
    xs = [c.train_x[:2] for c in algo.dataset.clients if c.train_x.shape[0]]
    if not xs:
        return 0
    x = torch.cat(xs)[:2]
    params = {p.data_ptr() for p in algo.model.parameters()}
    saved = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.data_ptr() not in params:
            saved[0] += t.numel() * t.element_size()
        return t

    state = {k: v.clone() for k, v in algo.model.state_dict().items()}  # batch norm's running statistics move
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            algo.model(x)
    finally:
        algo.model.load_state_dict(state)
    return saved[0] // x.shape[0]


def available_bytes() -> int | None:
    """This host's memory available to a new allocation now (``MemAvailable`` of /proc/meminfo), plus what this
    process holds already (the estimate counts it); None where it cannot be read."""
    try:
        info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
        status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
        return (int(info["MemAvailable"].split()[0]) + int(status["VmRSS"].split()[0])) * 1024
    except (OSError, KeyError, ValueError):
        return None


def check_fits(fp: Footprint, source: str, available: int | None = None) -> None:
    """Refuse (one line: what it needs, what this host has, what to change) a run whose estimate exceeds the
    memory ``available`` (default: :func:`available_bytes`)."""
    available = available if available is not None else available_bytes()
    if available is None or fp.host <= available:
        return
    state = fp.per_device * fp.devices
    bigger = ("the per-device state" if state >= max(fp.engine, fp.data) else
              "the stacked training" if fp.engine >= fp.data else "the data")
    raise EdgemaskError(
        f"{source}: this run needs about {fp.host / GB:.1f} GB of host memory and this host has "
        f"{available / GB:.1f} GB "
        f"available; most of it is {bigger} (per device {_size(fp.per_device)} × {fp.devices} devices = "
        f"{state / GB:.1f} GB; stacked training {fp.engine / GB:.1f} GB; data {fp.data / GB:.1f} GB): use fewer "
        f"devices (data.num_clients) or a smaller model ([model.args], e.g. width); training.device = \"cuda\" "
        f"moves the stacked training off the host; --no-memory-check runs it anyway")
