"""``torch.func.functional_call`` for the trainer's hot path: a model run on tensors it is handed.

Every local step of every client calls the model on tensors that are not its own (the client's, or under ``vmap``
all clients' stacked), and ``functional_call`` spends Python time on each call comparable to a small MLP's
forward: it walks the module tree for tied tensors and resolves every dotted name again, every call. Here each model's
parameter and buffer slots are resolved once, and a call puts the tensors in those slots and puts the module's
own back afterwards (also when the forward raises), which is what ``functional_call`` does for a model without
tied tensors. A model with tied tensors (one tensor under two names), or a name that is not one of the model's
parameters or buffers, goes to ``functional_call`` itself.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import nn
from torch.func import functional_call

# model -> {"fc1.weight": (the slot dict, i.e. the submodule's _parameters or _buffers, "weight")}, or None
# when the model ties tensors (functional_call's tie_weights handles those)
_SLOTS: weakref.WeakKeyDictionary[nn.Module, dict[str, tuple[dict, str]] | None] = weakref.WeakKeyDictionary()


def _slots(model: nn.Module) -> dict[str, tuple[dict, str]] | None:
    slots = _SLOTS.get(model, False)
    if slots is not False:
        return slots  # type: ignore[return-value]
    slots, seen = {}, set()
    for prefix, mod in model.named_modules(remove_duplicate=False):
        for kind in ("_parameters", "_buffers"):
            d = getattr(mod, kind)
            for local, t in d.items():
                if t is None:
                    continue
                if id(t) in seen:  # tied: one tensor under two names
                    _SLOTS[model] = None
                    return None
                seen.add(id(t))
                slots[f"{prefix}.{local}" if prefix else local] = (d, local)
    _SLOTS[model] = slots
    return slots


def stateless_call(model: nn.Module, tensors: dict[str, torch.Tensor], args: tuple[Any, ...]) -> Any:
    """``model(*args)`` computed with ``tensors`` (a name → tensor subset of its parameters and buffers) in
    place of its own, as ``torch.func.functional_call(model, tensors, args)``; the model's own tensors are back
    in place when this returns or raises. Works under ``vmap`` and ``grad`` like ``functional_call``. The slots
    are resolved once per model, so the module tree must not change after the first call."""
    slots = _slots(model)
    if slots is None or not all(name in slots for name in tensors):
        return functional_call(model, tensors, args)
    saved = []
    try:
        for name, t in tensors.items():
            d, local = slots[name]
            saved.append((d, local, d[local]))
            d[local] = t
        return model(*args)
    finally:
        for d, local, own in reversed(saved):
            d[local] = own
