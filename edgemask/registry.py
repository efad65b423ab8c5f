"""A small name -> object registry whose unknown-name error lists the valid names."""

from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar

from edgemask.errors import UnknownNameError

T = TypeVar("T")


class Registry(Generic[T]):
    """Holds named entries of one kind (algorithms, models, formats, sensors, ...).

    >>> r = Registry("format")
    >>> @r.register("onnx")
    ... class Onnx: ...
    >>> r.get("onnx") is Onnx
    True
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def add(obj: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._entries[name] = obj
            return obj

        return add

    def add(self, name: str, obj: T) -> T:
        return self.register(name)(obj)

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            valid = ", ".join(sorted(self._entries)) or "(none registered)"
            raise UnknownNameError(f"unknown {self.kind} {name!r}; valid names: {valid}") from None

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
