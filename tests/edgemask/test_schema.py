"""edgemask.schema: a table checked against its declared fields, every mistake in one wording
``<file>: [table] field: what is wrong; what to do``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from edgemask.errors import ConfigError
from edgemask.registry import Registry
from edgemask.schema import (ANY, Field, Table, check_call, did_you_mean, kind_of, read_dataclass,
                             schema_of, setting, signature_schema)

FORMATS: Registry[str] = Registry("format")
for _name in ("onnx", "pte", "tflite"):
    FORMATS.add(_name, _name)

SCHEMA = {
    "name": Field(str),
    "repetitions": Field(int, 1, minimum=1),
    "timeout_s": Field(float, 600.0, above=0),
    "port": Field(int, 22, minimum=1, maximum=65535),
    "formats": Field(list, ["onnx"], items=str, choices=FORMATS, what="format", nonempty=True, unique=True),
    "dense": Field(bool, True),
    "kind": Field(str, "rpi4", choices=("rpi4", "jetson-tx2"), what="kind"),
    "workdir": Field(str, None, check=lambda v: "'..' leaves the login directory; give a path inside it"
                     if ".." in v else None),
}


def table(**data) -> Table:
    return Table("c.toml", "campaign", data, SCHEMA)


def error(key: str, **data) -> str:
    with pytest.raises(ConfigError) as e:
        table(**data)[key]
    return str(e.value)


def test_values_defaults_and_numbers():
    t = table(name="x", timeout_s=5, formats=["pte", "onnx"])
    assert (t["name"], t["repetitions"], t["formats"], t["dense"]) == ("x", 1, ["pte", "onnx"], True)
    assert t["workdir"] is None
    assert t["timeout_s"] == 5.0 and isinstance(t["timeout_s"], float)  # an integer is a number
    assert t.values() == {"name": "x", "timeout_s": 5.0, "formats": ["pte", "onnx"]}


def test_unknown_field_is_refused_with_a_did_you_mean():
    with pytest.raises(ConfigError) as e:
        table(name="x", formts=["onnx"])
    assert str(e.value) == ("c.toml: [campaign] formts: unknown field; did you mean 'formats'? valid fields: dense, "
                            "formats, kind, name, port, repetitions, timeout_s, workdir")
    with pytest.raises(ConfigError) as e:
        table(zzz=1)
    assert str(e.value).startswith("c.toml: [campaign] zzz: unknown field; valid fields: dense, formats,")
    assert did_you_mean("repetitons", SCHEMA) == " did you mean 'repetitions'?"


@pytest.mark.parametrize("key, data, message", [
    ("name", {}, "name: missing field; add name = … (a string)"),
    ("kind", {"kind": "tx2"}, "kind: unknown kind 'tx2'; valid names: jetson-tx2, rpi4"),
    ("repetitions", {"repetitions": "two"}, "repetitions: must be an integer, not 'two'; write a whole number, "
     "without quotes"),
    ("repetitions", {"repetitions": True}, "repetitions: must be an integer, not True; write a whole number, "
     "without quotes"),  # TOML's true is no count
    ("repetitions", {"repetitions": 0}, "repetitions: 0 is out of range; use a value >= 1"),
    ("repetitions", {"repetitions": 1.5}, "repetitions: must be an integer, not 1.5; write a whole number, "
     "without quotes"),
    ("timeout_s", {"timeout_s": 0}, "timeout_s: 0 is out of range; use a value > 0"),
    ("port", {"port": 70000}, "port: 70000 is out of range; use a value between 1 and 65535"),
    ("dense", {"dense": "yes"}, "dense: must be true or false, not 'yes'; write true or false, without quotes"),
    ("formats", {"formats": []}, "formats: is empty; name at least one format"),
    ("formats", {"formats": ["onnx", "tfjs"]}, "formats: unknown format 'tfjs'; valid names: onnx, pte, tflite"),
    ("formats", {"formats": ["onnx", "onnx"]}, "formats: names 'onnx' twice; list each once"),
    ("formats", {"formats": ["onnx", 3]}, "formats: must be a list of strings, not ['onnx', 3]; write it in double "
     "quotes, for each item"),
    ("formats", {"formats": "onnx"}, "formats: must be a list, not 'onnx'; write a list in [ ]"),
    ("workdir", {"workdir": "../x"}, "workdir: '..' leaves the login directory; give a path inside it"),
])
def test_each_mistake_in_one_wording(key, data, message):
    assert error(key, **data) == "c.toml: [campaign] " + message


def test_a_table_that_is_not_one_and_a_check_of_its_own():
    with pytest.raises(ConfigError) as e:
        Table("c.toml", "runner", 3, SCHEMA)
    assert str(e.value) == "c.toml: [runner] is 3, not a table; write it as [runner]"
    err = table(name="x").error("name", "'x' is taken", "pick another name")
    assert str(err) == "c.toml: [campaign] name: 'x' is taken; pick another name"


def test_an_exclusive_upper_bound():
    f = {"share": Field(float, above=0, below=1), "rate": Field(float, minimum=0, below=1)}
    t = Table("c.toml", "t", {"share": 1.0, "rate": 1}, f)
    for key, text in (("share", "1.0 is out of range; use a value between 0 and 1, both excluded"),
                      ("rate", "1 is out of range; use a value >= 0 and < 1")):
        with pytest.raises(ConfigError) as e:
            t[key]
        assert str(e.value) == f"c.toml: [t] {key}: {text}"
    assert Table("c.toml", "t", {"share": 0.999, "rate": 0}, f).values() == {"share": 0.999, "rate": 0.0}


def test_a_table_without_fields_says_so():
    with pytest.raises(ConfigError) as e:
        Table("c.toml", "algorithm.args", {"mu": 0.1}, {})
    assert str(e.value) == "c.toml: [algorithm.args] mu: unknown field; [algorithm.args] takes no fields; remove it"


# -- one declaration: the dataclass (or the signature) is the schema ---------------------------------------------
@dataclass(frozen=True)
class Knobs:
    rounds: int = setting(20, minimum=1)
    lr: float = setting(0.05, above=0)
    share: float = setting(0.25, above=0, below=1)
    mode: str = setting("keep", choices=("keep", "drop"), what="mode")
    quiet: bool = True
    cap: int | None = setting(None, minimum=1)
    widths: tuple[int, ...] = (16, 32)
    rates: list[float] | None = None
    options: dict[str, Any] = field(default_factory=dict)
    anything: Any = None


def test_schema_of_reads_type_default_and_limits_off_the_dataclass():
    s = schema_of(Knobs)
    assert list(s) == ["rounds", "lr", "share", "mode", "quiet", "cap", "widths", "rates", "options", "anything"]
    assert s["rounds"] == Field(int, 20, minimum=1)
    assert s["lr"] == Field(float, 0.05, above=0)
    assert s["share"] == Field(float, 0.25, above=0, below=1)
    assert s["mode"] == Field(str, "keep", choices=("keep", "drop"), what="mode")
    assert s["quiet"] == Field(bool, True)
    assert s["cap"] == Field(int, None, minimum=1)  # "int | None": an int where given, None is "not set"
    assert s["widths"] == Field(list, (16, 32), items=int)
    assert s["rates"] == Field(list, None, items=float)
    assert s["options"] == Field(dict, {})
    assert s["anything"] == Field(ANY, None)


def test_a_dataclass_table_is_read_and_refused_in_the_one_wording():
    k = read_dataclass("c.toml", "knobs", {"rounds": 3, "lr": 1, "widths": [8], "cap": None}, Knobs)
    assert k == Knobs(rounds=3, lr=1.0, widths=[8])  # lr made a float; cap None: not set, the default
    assert isinstance(k.lr, float)
    for data, text in (({"rounds": 0}, "rounds: 0 is out of range; use a value >= 1"),
                       ({"rounds": True}, "rounds: must be an integer, not True; write a whole number, without "
                                          "quotes"),
                       ({"mode": "toss"}, "mode: unknown mode 'toss'; valid names: drop, keep"),
                       ({"share": 1}, "share: 1 is out of range; use a value between 0 and 1, both excluded"),
                       ({"rates": [1.0, "x"]}, "rates: must be a list of numbers, not [1.0, 'x']; write a number, "
                                               "without quotes, for each item"),
                       ({"cap": 0}, "cap: 0 is out of range; use a value >= 1"),
                       ({"rouds": 3}, "rouds: unknown field; did you mean 'rounds'? valid fields: anything, cap, "
                                      "lr, mode, options, quiet, rates, rounds, share, widths")):
        with pytest.raises(ConfigError) as e:
            read_dataclass("c.toml", "knobs", data, Knobs)
        assert str(e.value) == f"c.toml: [knobs] {text}"


def test_setting_refuses_a_check_that_does_not_exist():
    with pytest.raises(TypeError, match="unknown check.*minumum"):
        setting(1, minumum=0)


@pytest.mark.parametrize("annotation, kind, items", [
    (int, int, None), (float, float, None), (bool, bool, None), (str, str, None),
    (int | None, int, None), (tuple[int, ...], list, int), (tuple[int, int], list, int),
    (list[float], list, float), (Sequence[str], list, str), (list, list, None), (tuple[int, str], list, None),
    (dict[str, Any], dict, None), (int | str, (int, str), None), (Any, ANY, None), (None, ANY, None),
])
def test_kind_of_annotations(annotation, kind, items):
    assert kind_of(annotation) == (kind, items)


def _builder(input_shape, num_classes, hidden: tuple[int, ...] = (128, 64), width: float = 1.0, tag="x"):
    return input_shape, num_classes, hidden, width, tag


def _needs_width(input_shape, num_classes, width: float):
    return width


def _open_builder(input_shape, num_classes, depth: int = 2, **kwargs):
    return depth, kwargs


def test_a_signature_is_a_schema_too():
    schema, open_ = signature_schema(_builder, skip=2)
    assert not open_ and schema == {"hidden": Field(list, (128, 64), items=int), "width": Field(float, 1.0),
                                    "tag": Field(ANY, "x")}
    check_call("c.toml", "model.args", {"hidden": [8, 4], "width": 2, "tag": [1]}, _builder, skip=2)
    for data, text in (({"hiden": [8]}, "hiden: unknown field; did you mean 'hidden'? valid fields: hidden, tag, "
                                         "width"),
                       ({"hidden": 8}, "hidden: must be a list, not 8; write a list in [ ]"),
                       ({"width": "wide"}, "width: must be a number, not 'wide'; write a number, without quotes")):
        with pytest.raises(ConfigError) as e:
            check_call("c.toml", "model.args", data, _builder, skip=2)
        assert str(e.value) == f"c.toml: [model.args] {text}"
    # **kwargs: any other name may be the builder's; the declared ones are still checked
    assert signature_schema(_open_builder, skip=2) == ({"depth": Field(int, 2)}, True)
    check_call("c.toml", "model.args", {"depth": 3, "other": 1}, _open_builder, skip=2)
    with pytest.raises(ConfigError, match=r"\[model.args\] depth: must be an integer, not 'deep'"):
        check_call("c.toml", "model.args", {"depth": "deep"}, _open_builder, skip=2)
    # a parameter without a default must be given
    with pytest.raises(ConfigError, match=r"\[model.args\] width: missing field; add width = … \(a number\)"):
        check_call("c.toml", "model.args", {}, _needs_width, skip=2)
    with pytest.raises(ConfigError, match=r"\[model.args\] width: missing field; add width = … \(a value\)$"):
        check_call("c.toml", "model.args", {}, lambda shape, n, width: None, skip=2)


def test_a_list_built_in_code_may_be_a_tuple():
    assert Table("c.toml", "t", {"widths": (8, 4)}, {"widths": Field(list, items=int)})["widths"] == (8, 4)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_number_is_refused_with_or_without_limits(value):
    """TOML writes nan and inf; a NaN passes every comparison, so a range alone let it through (issue #44)."""
    for f in (Field(float), Field(float, minimum=0.0), Field(list, items=float)):
        data = {"x": [value] if f.kind is list else value}
        with pytest.raises(ConfigError, match=r"t.toml: \[t\] x: .* is not a finite number; write a finite number"):
            Table("t.toml", "t", data, {"x": f})["x"]
