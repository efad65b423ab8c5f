"""The batched engine's per-client rows: one chunk's trained tensors stay one stacked tensor per name
(:class:`StackedRows`), and each client's result and upload hold a :class:`Row` of it, made into a dict only when
read (:class:`MadeOnRead`). FedAvg's aggregate reads the stack itself (:func:`stacked_uploads`), so no per-client
dict is made in a round that needs none."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from trainer.accounting import tensor_bytes

if TYPE_CHECKING:  # annotations only: the records hold rows, this module reads them back
    from trainer.records import ClientUpdate


class StackedRows:
    """One batched chunk's trained tensors, ``{name: (C, *shape)}`` (detached, on the CPU), for its C clients'
    :class:`LocalResult` and :class:`ClientUpdate` to hold a :class:`Row` of until their dict is asked for. The
    per-client views are made together, once, on the first request for one (C × the tensors, a visible share
    of a small model's round); FedAvg's aggregate asks for none and reads the stack itself
    (:meth:`Algorithm.average_params`)."""

    __slots__ = ("tensors", "count", "row_bytes", "_views")

    def __init__(self, tensors: dict[str, torch.Tensor], count: int) -> None:
        self.tensors, self.count = tensors, count
        self.row_bytes = tensor_bytes(tensors) // max(count, 1)  # one client's, on the wire
        self._views: list[tuple[torch.Tensor, ...]] | None = None

    def row(self, i: int) -> dict[str, torch.Tensor]:
        """Client ``i``'s tensors: views of its rows (a new dict each call, the same tensors)."""
        if self._views is None:
            self._views = list(zip(*[v.unbind(0) for v in self.tensors.values()])) if self.tensors else \
                [()] * self.count
        return dict(zip(self.tensors, self._views[i]))


class Row:
    """A dict not made yet: row ``index`` of ``stack``'s tensors, then ``rest`` (a result's ``trained``; an
    upload's ``payload``, the weights then the buffers)."""

    __slots__ = ("stack", "index", "rest")

    def __init__(self, stack: StackedRows, index: int, rest: dict[str, torch.Tensor] | None = None) -> None:
        self.stack, self.index, self.rest = stack, index, rest or {}

    def made(self) -> dict[str, torch.Tensor]:
        return {**self.stack.row(self.index), **self.rest} if self.rest else self.stack.row(self.index)


class MadeOnRead:
    """A dict attribute that may hold an unmade :class:`Row` (kept in the slot ``_<name>``): made on first
    read, the dict from then on; :meth:`row` of the owner gives the Row while it is not made."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.slot = f"_{name}"

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        value = getattr(obj, self.slot)
        if type(value) is Row:
            value = value.made()
            setattr(obj, self.slot, value)
        return value

    def __set__(self, obj: Any, value: dict[str, torch.Tensor]) -> None:
        setattr(obj, self.slot, value)

    def unmade(self, obj: Any) -> Row | None:
        value = getattr(obj, self.slot)
        return value if type(value) is Row else None


def stacked_uploads(updates: list[ClientUpdate]) -> StackedRows | None:
    """The stack whose rows 0, 1, …, in order, the updates' unread payloads are (the batched loop's one chunk of
    FedAvg uploads; the buffers after the rows, under other names), else ``None``: the server may read its
    tensors for the uploads' (a payload once read may have been changed)."""
    first = updates[0].row() if updates else None
    if first is None or first.stack.count != len(updates):
        return None
    stack = first.stack
    for i, u in enumerate(updates):
        row = u.row()
        if row is None or row.stack is not stack or row.index != i or not stack.tensors.keys().isdisjoint(row.rest):
            return None
    return stack
