"""The functions a :class:`~edgemask.trainer.records.LocalTask` names: its forward, regularizers, loss and projection
are registered entries, named in the task by a :class:`Fn` (a name and plain settings), not callables the engines must
compare. A task is then tensors + settings + names: plain data that crosses a network (:mod:`edgemask.trainer.flower`)
and is rebuilt where it trains, and two tasks are one kind (stacked by the batched engine) iff their names, settings,
model and tensor layouts agree.

A registered entry is a *factory*: ``factory(model: ModelContext, **settings) -> function``, called once per
(:class:`Fn`, :class:`ModelSpec`) in a process (:func:`resolve`). The :class:`ModelContext` is the task's model,
built from its :class:`ModelSpec` (registry name, input shape, classes, arguments and the seed its initial weights
come from — what the run's config says), so a function captures the architecture and nothing that differs between
clients; everything per client rides in the task's tensors.

The function kinds and their signatures (tensors by name, a batch ``x (B, *input_shape)``):

* forward ``(trainable, constants, x, buffers) -> logits (B, classes)`` (``buffers`` updated in place: batch norm);
* regularizer ``(trainable, constants) -> scalar`` (added to the step's loss);
* loss ``(trainable, constants, x, y, buffers) -> scalar`` (the step's data loss; ``x``, ``y`` tuples of k
  minibatches when the task has ``batches_per_step`` k > 1);
* project ``(trainable) -> {name: tensor}`` (after each optimizer step, the returned tensors replace those named).

An algorithm registers its own functions in its module (``@task_function("fedmask.forward")``), as it registers
itself; importing :mod:`edgemask.trainer.algorithms` registers them all. Functions every algorithm may use live here
(``model``, ``model.frozen``) and in :mod:`edgemask.trainer.losses` (``proximal``).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from edgemask.errors import UnknownNameError
from edgemask.registry import Registry
from edgemask.trainer.models import build_model, head_names, model_sites
from edgemask.trainer.models.masking import MaskSite
from edgemask.trainer.models.stateless import stateless_call

Tensors = dict[str, torch.Tensor]
Settings = tuple[tuple[str, Any], ...]


def freeze(value: Any) -> Any:
    """A settings value as a hashable one: lists become tuples, dicts sorted tuples of pairs (recursively)."""
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((str(k), freeze(v)) for k, v in value.items()))
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"a task function's setting must be plain data (bool, int, float, str, list, dict), got "
                    f"{type(value).__name__} {value!r}")


def _settings(kw: dict[str, Any]) -> Settings:
    return tuple(sorted((k, freeze(v)) for k, v in kw.items()))


def _plain(value: Any) -> Any:
    """A frozen value back as JSON-able data (tuples become lists)."""
    return [_plain(v) for v in value] if isinstance(value, tuple) else value


@dataclass(frozen=True)
class Fn:
    """A registered task function by name, with its settings (plain values, e.g. FedProx's ``mu``). Equal names
    and settings are the same function: tasks holding them are one kind of task."""

    name: str
    settings: Settings = ()

    @classmethod
    def of(cls, name: str, **settings: Any) -> "Fn":
        return cls(name, _settings(settings))

    def kwargs(self) -> dict[str, Any]:
        return {k: _plain(v) for k, v in self.settings}

    def to_data(self) -> dict[str, Any]:
        """``{"name": ..., "settings": {...}}`` (JSON-able); :meth:`from_data` reads it back."""
        return {"name": self.name, "settings": self.kwargs()}

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> "Fn":
        return cls.of(str(data["name"]), **dict(data.get("settings", {})))


@dataclass(frozen=True)
class ModelSpec:
    """The architecture a task's functions run: :func:`~edgemask.trainer.models.build_model`'s arguments and the seed of
    the initial weights (``torch.manual_seed(seed)`` before the build, as
    :class:`~edgemask.trainer.algorithms.base.Algorithm` builds its model), so a node builds the very model the server
    holds from these plain values."""

    name: str
    input_shape: tuple[int, ...]
    num_classes: int
    args: Settings = ()
    seed: int = 0

    @classmethod
    def of(cls, name: str, input_shape: tuple[int, ...], num_classes: int, args: dict[str, Any] | None = None,
           seed: int = 0) -> "ModelSpec":
        return cls(name, tuple(int(s) for s in input_shape), int(num_classes), _settings(args or {}), int(seed))

    def to_data(self) -> dict[str, Any]:
        return {"name": self.name, "input_shape": list(self.input_shape), "num_classes": self.num_classes,
                "args": {k: _plain(v) for k, v in self.args}, "seed": self.seed}

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> "ModelSpec":
        return cls.of(str(data["name"]), tuple(data["input_shape"]), int(data["num_classes"]),
                      dict(data.get("args", {})), int(data.get("seed", 0)))

    def build(self) -> nn.Module:
        """The model with its seeded initial weights; the caller's random state is left as it was."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            return build_model(self.name, self.input_shape, self.num_classes,
                               **{k: _plain(v) for k, v in self.args})


class ModelContext:
    """What a task function is built from: the model (:attr:`model`), its mask sites (:attr:`sites`), its
    parameter names in order (:attr:`param_names`) and shapes (:attr:`shapes`), and its classifier head's
    parameter names (:attr:`head`). :attr:`cache` keeps what is resolved on it (functions, programs)."""

    def __init__(self, spec: ModelSpec, model: nn.Module) -> None:
        self.spec, self.model = spec, model
        self.sites: tuple[MaskSite, ...] = model_sites(model)
        self.param_names = tuple(n for n, _ in model.named_parameters())
        self.shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
        self.head = head_names(model)
        self.cache: dict[Any, Any] = {}

    def call(self, params: Tensors, buffers: Tensors, x: torch.Tensor) -> torch.Tensor:
        """The model on ``params`` and ``buffers`` (:func:`~edgemask.trainer.models.stateless.stateless_call`)."""
        return stateless_call(self.model, {**params, **buffers}, (x,))


_CONTEXTS: dict[ModelSpec, ModelContext] = {}
MAX_CONTEXTS = 8  # models kept per process (a process runs one config at a time; tests run many)


def model_context(spec: ModelSpec, model: nn.Module | None = None) -> ModelContext:
    """The process's :class:`ModelContext` of ``spec``, built once. ``model``: the caller's own instance of the
    spec (an algorithm's model), lent to the tasks from now on: the functions then run the very module the
    algorithm holds, in the mode it sets (the round loop trains in training mode and evaluates in eval mode, in
    which Per-FedAvg's evaluation takes its adaptation step)."""
    ctx = _CONTEXTS.get(spec)
    if ctx is None or (model is not None and ctx.model is not model):
        if len(_CONTEXTS) >= MAX_CONTEXTS:
            del _CONTEXTS[next(iter(_CONTEXTS))]  # the oldest
        ctx = _CONTEXTS[spec] = ModelContext(spec, model if model is not None else spec.build())
    return ctx


def forget_context(spec: ModelSpec, model: nn.Module) -> None:
    """Drop the process's context of ``spec`` if ``model`` is the one lent to it (a meta-device model the memory
    estimate built: :func:`~edgemask.trainer.footprint.of_shapes`), so the next use builds its own."""
    ctx = _CONTEXTS.get(spec)
    if ctx is not None and ctx.model is model:
        del _CONTEXTS[spec]


TASK_FUNCTIONS: Registry[Callable[..., Callable]] = Registry("task function")


def task_function(name: str) -> Callable[[Callable], Callable]:
    """Register ``factory(model: ModelContext, **settings) -> function`` under ``name``."""
    return TASK_FUNCTIONS.register(name)


def resolve(fn: Fn, spec: ModelSpec) -> Callable:
    """The function ``fn`` names for the model ``spec``: one object per (fn, model context), so a kind of task
    keeps one function while its model does. An unknown name, or settings its factory does not take, raise
    :class:`~edgemask.errors.UnknownNameError` naming the valid ones."""
    ctx = model_context(spec)
    out = ctx.cache.get(fn)
    if out is None:
        out = ctx.cache[fn] = _make(fn, ctx)
    return out


def _make(fn: Fn, ctx: ModelContext) -> Callable:
    try:
        factory = TASK_FUNCTIONS.get(fn.name)
    except UnknownNameError as e:
        raise UnknownNameError(f"{e} (a task names a function no imported module registers: import "
                               f"trainer.algorithms, which registers every algorithm's)") from None
    try:
        inspect.signature(factory).bind(None, **fn.kwargs())
    except TypeError as e:
        raise UnknownNameError(f"task function {fn.name!r}: settings {fn.kwargs()} do not fit it ({e})") from None
    return factory(ctx, **fn.kwargs())


# -- functions every algorithm may name ------------------------------------------------------------------------
@task_function("model")
def model_forward(m: ModelContext) -> Callable:
    """The plain forward: the model on the trainable tensors and the buffers."""

    def forward(trainable: Tensors, constants: Tensors, x: torch.Tensor, buffers: Tensors) -> torch.Tensor:
        return m.call(trainable, buffers, x)

    return forward


@task_function("model.frozen")
def frozen_rest_forward(m: ModelContext, prefix: str = "frozen:") -> Callable:
    """The model on the constants named ``prefix`` + parameter (the frozen rest, e.g. FedBABU's body while its
    head is fine-tuned) with the trainable tensors over them."""
    n = len(prefix)

    def forward(trainable: Tensors, constants: Tensors, x: torch.Tensor, buffers: Tensors) -> torch.Tensor:
        rest = {k[n:]: v for k, v in constants.items() if k.startswith(prefix)}
        return m.call({**rest, **trainable}, buffers, x)

    return forward
