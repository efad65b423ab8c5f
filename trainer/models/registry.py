"""The model registry: a name -> builder ``(input_shape, num_classes, **args) -> nn.Module``.

Every model is a plain ``nn.Module`` with named-attribute layers (not numbered ``nn.Sequential`` children:
ExecuTorch's XNNPACK lowering trips on those) and these optional attributes:

* ``head``: module paths of the classifier head (personal in LG-FedAvg, FedPer, FedRep, PerFedMask),
* ``mask_exclude``: layers never masked,
* ``norm_after``: layer path -> the batch norm right after it — an *override*, checked against the trace, never
  needed: :func:`norms_after` finds each masked layer's batch norm in the ``torch.fx`` graph of the model.

A dead unit (mask row all zero) must output exactly zero, so the batch norm that reads it is gated too
(γ = β = 0 for that channel; :func:`edgemask.trainer.models.masking.effective_params`): ungated, the unit would still
emit ``β − γ·μ/σ``, and compaction could not remove it. To register a model of your own::

    @MODELS.register("my_net")
    def my_net(input_shape, num_classes, **args) -> nn.Module:
        return MyNet(input_shape[0], num_classes, **args)

Its keyword parameters are what ``[model.args]`` may hold: a config is checked against the builder's signature
(names, and types where annotated; :func:`check_model_args`), so give them annotations and defaults. Its layers
are found by type (``nn.Linear``, ``nn.Conv1d``/``nn.Conv2d``, ``nn.LSTM``), their batch norms by
tracing; where ``torch.fx`` cannot trace the forward (data-dependent control flow), declare ``norm_after`` and
export names the layers whose norms it could not find.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from edgemask.errors import EdgemaskError
from edgemask.registry import Registry
from edgemask.schema import check_call
from edgemask.trainer.models.masking import MaskSite, find_sites

ModelBuilder = Callable[..., nn.Module]
MODELS: Registry[ModelBuilder] = Registry("model")


def check_model_args(name: str, args: dict[str, Any], source: str) -> None:
    """``[model.args]`` of ``source`` checked against model ``name``'s builder: its keyword parameters after
    ``(input_shape, num_classes)`` are the valid names (a builder taking ``**kwargs`` accepts any other), their
    annotations the types; a mistake is one line, ``<source>: [model.args] key: what is wrong; what to do``."""
    check_call(source, "model.args", args, MODELS.get(name), skip=2)


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int, **args: Any) -> nn.Module:
    """Build and initialize: Kaiming-normal (fan-in, ReLU gain) conv and linear weights, zero biases. ``args``
    are checked first (:func:`check_model_args`): a wrong name is a config error, not a ``TypeError``.

    The scale matters for mask learning (FedMask, FedPeWS): with PyTorch's default uniform init a masked
    network's logits start near zero and mask gradients, which are scaled by W (FedMask Eq. 4), vanish."""
    check_model_args(name, args, f"model {name!r}")
    model = MODELS.get(name)(tuple(input_shape), num_classes, **args)
    for mod in model.modules():
        if isinstance(mod, (nn.Linear, nn.Conv1d, nn.Conv2d)):
            nn.init.kaiming_normal_(mod.weight, mode="fan_in", nonlinearity="relu")
            if mod.bias is not None:
                nn.init.zeros_(mod.bias)
    return model


class NormMapError(EdgemaskError):
    """A model's ``norm_after`` override disagrees with its traced graph."""


# single-input ops a unit passes through with 0 -> 0, channel by channel: a batch norm after them still reads only
# the layer's unit (conv -> ReLU -> BN is "the batch norm right after" the conv as much as conv -> BN)
_PASS_MODULES = (nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.Hardtanh, nn.Dropout, nn.Identity)
_PASS_FUNCTIONS = {torch.relu, torch.nn.functional.relu, torch.nn.functional.relu6, torch.nn.functional.leaky_relu,
                   torch.nn.functional.hardtanh, torch.nn.functional.dropout}
_PASS_METHODS = {"relu", "relu_"}
_LAYERS = (nn.Linear, nn.Conv1d, nn.Conv2d)


def traced_norms(model: nn.Module) -> dict[str, str] | str:
    """Layer path -> the batch norm right after it, read off the ``torch.fx`` graph of ``model``; or, where
    ``torch.fx`` cannot trace it, the one-line reason (a string).

    "Right after": the batch norm's input is the layer's output, directly or through single-input activations that
    map 0 to 0 channel by channel (ReLU, ReLU6, LeakyReLU, Hardtanh, dropout, identity), and nothing else reads
    that output on the way. Only affine batch norms count (γ and β are what the gate zeroes). A batch norm fed by a
    sum or concatenation of several layers is nobody's: a unit dead in one of them is not zero there."""
    import torch.fx

    class Tracer(torch.fx.Tracer):
        # a user's subclass of nn.Conv2d / nn.BatchNorm2d (defined outside torch.nn) stays one call_module node
        def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
            return isinstance(m, (*_LAYERS, nn.modules.batchnorm._BatchNorm)) or super().is_leaf_module(m, qualname)

    try:
        graph = Tracer().trace(model)
    except Exception as exc:  # noqa: BLE001 - any tracing failure means: no trace, say why
        first = (str(exc).strip().splitlines() or [""])[0]
        return f"torch.fx cannot trace {type(model).__name__}.forward ({type(exc).__name__}: {first[:160]})"
    mods = dict(model.named_modules())

    def passes(node) -> bool:
        if node.op == "call_module":
            return isinstance(mods.get(node.target), _PASS_MODULES)
        if node.op == "call_function":
            return node.target in _PASS_FUNCTIONS
        return node.op == "call_method" and node.target in _PASS_METHODS

    found: dict[str, str] = {}
    for node in graph.nodes:
        if node.op != "call_module" or not isinstance(mods.get(node.target), _LAYERS):
            continue
        cur = node
        while len(cur.users) == 1:
            (nxt,) = cur.users
            if not nxt.args or nxt.args[0] is not cur:
                break
            bn = mods.get(nxt.target) if nxt.op == "call_module" else None
            if isinstance(bn, nn.modules.batchnorm._BatchNorm):
                if bn.affine:
                    found[node.target] = nxt.target
                break
            if not passes(nxt):
                break
            cur = nxt
    return found


def norms_after(model: nn.Module) -> tuple[dict[str, str], str | None]:
    """``(layer path -> batch norm right after it, None)`` from the trace (:func:`traced_norms`), with the
    model's ``norm_after`` entries checked against it: an entry the trace contradicts raises
    :class:`NormMapError`. Where the model cannot be traced: ``(norm_after as declared, the reason)``."""
    declared = dict(getattr(model, "norm_after", None) or {})
    traced = traced_norms(model)
    cls = type(model).__name__
    if isinstance(traced, str):
        mods = dict(model.named_modules())
        for layer, bn in declared.items():
            if not isinstance(mods.get(layer), _LAYERS) or not isinstance(mods.get(bn),
                                                                           nn.modules.batchnorm._BatchNorm):
                raise NormMapError(f"{cls}.norm_after[{layer!r}] = {bn!r}: needs a Linear/Conv layer and a "
                                   f"batch norm module; fix or remove the entry")
        return declared, traced
    for layer, bn in declared.items():
        if traced.get(layer) != bn:
            seen = repr(traced[layer]) if layer in traced else "no batch norm"
            raise NormMapError(f"{cls}.norm_after[{layer!r}] = {bn!r}, but the traced graph has {seen} right after "
                               f"{layer!r}; fix or remove the entry (the trace finds batch norms by itself)")
    return traced, None


def model_sites(model: nn.Module) -> tuple[MaskSite, ...]:
    """The model's mask sites, each with the batch norm right after it (:func:`norms_after`)."""
    return find_sites(model, norms_after(model)[0], tuple(getattr(model, "mask_exclude", ())))


def head_names(model: nn.Module) -> tuple[str, ...]:
    """Parameter names that belong to the classifier head."""
    prefixes = tuple(getattr(model, "head", ()))
    return tuple(n for n, _ in model.named_parameters() if n.split(".")[0] in prefixes or
                 any(n.startswith(p + ".") for p in prefixes))


def one_value_norms(name: str, input_shape: tuple[int, ...], num_classes: int,
                    args: dict[str, Any] | None = None) -> tuple[str, ...]:
    """The batch norms of model ``name`` that see one value per channel in a one-sample minibatch (batch × the
    spatial positions = 1: VGG16's conv11–13 on 28×28 inputs are 1×1; any ``BatchNorm1d`` on ``(B, C)``). In
    training mode torch refuses them ("Expected more than 1 value per channel"); what a run does about it is
    ``training.one_sample_batch`` (:func:`edgemask.trainer.sampling.drop_one_sample_batches`). Found by one forward
    of a ``(1, *input_shape)`` input on the ``meta`` device: shapes only, no memory, no arithmetic; a model without
    batch norm, or whose forward the meta device cannot run, has none."""
    with torch.device("meta"):
        model = MODELS.get(name)(tuple(input_shape), num_classes, **(args or {}))
        found: list[str] = []

        def hook(path: str):
            def seen(_mod: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
                x = inputs[0]
                if x.dim() >= 2 and x.numel() == x.shape[1]:  # (1, C, 1, ...) or (1, C)
                    found.append(path)
            return seen

        norms = [(path, mod) for path, mod in model.named_modules()
                 if isinstance(mod, nn.modules.batchnorm._BatchNorm)]
        if not norms:  # nothing to look for (an LSTM's integer inputs never reach a forward here)
            return ()
        for path, mod in norms:
            mod.register_forward_pre_hook(hook(path))
        model.eval()  # the shapes, without the training-mode check this looks for
        try:
            with torch.no_grad():
                model(torch.zeros((1, *input_shape)))
        except Exception:  # noqa: BLE001 - a forward the meta device cannot run: nothing known, nothing dropped
            return ()
    return tuple(dict.fromkeys(found))
