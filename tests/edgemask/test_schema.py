"""edgemask.schema: a table checked against its declared fields, every mistake in one wording
``<file>: [table] field: what is wrong; what to do``."""

from __future__ import annotations

import pytest

from edgemask.errors import ConfigError
from edgemask.registry import Registry
from edgemask.schema import Field, Table, did_you_mean

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
