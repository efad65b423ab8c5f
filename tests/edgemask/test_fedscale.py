"""FedScale's device traces read without trusting the file (edgemask/fedscale.py): plain data only, each entry
checked, a mistake one line naming the file, the client and the field."""

from __future__ import annotations

import json
import os
import pickle

import numpy as np
import pytest

from edgemask.errors import ConfigError
from edgemask.fedscale import Availability, Capacity, read_availability, read_capacity
from edgemask.mix import assign_trace_clients

CAPACITY = {1: {"computation": 2.5, "communication": 800.0}, 7: {"computation": 40, "communication": 1200.5}}
BEHAVE = {3: {"duration": 100, "inactive": [20, 90], "finish_time": 100, "active": [10, 50], "model": "SM-G960F"}}


def write(path, data, protocol=4):
    path.write_bytes(pickle.dumps(data, protocol=protocol))
    return path


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_a_capacity_trace_in_fedscales_format_is_read(tmp_path, protocol):
    t = read_capacity(write(tmp_path / "client_device_capacity", CAPACITY, protocol))
    assert t.clients == {1: Capacity(2.5, 800.0), 7: Capacity(40.0, 1200.5)}
    assert len(t.sha256) == 64 and t.path.endswith("client_device_capacity")


def test_the_same_dictionary_as_json_reads_the_same(tmp_path):
    js = tmp_path / "cap.json"
    js.write_text(json.dumps(CAPACITY))  # JSON's keys are strings: "1", "7"
    assert read_capacity(js).clients == read_capacity(write(tmp_path / "cap", CAPACITY)).clients


def test_availability_is_fedscales_rule_over_every_interval(tmp_path):
    """active in [10, 20] and [50, 90] of every 100 s (FedScale: norm_time = t % finish_time)."""
    a = read_availability(write(tmp_path / "client_behave_trace", BEHAVE)).clients[3]
    assert a == Availability((10.0, 50.0), (20.0, 90.0), 100.0)
    assert [a.is_active(t) for t in (0, 10, 15, 20, 21, 49, 50, 90, 95, 110, 175, 199)] == [
        False, True, True, True, False, False, True, True, False, True, True, False]


def test_a_pickle_naming_a_callable_is_refused_and_never_run(tmp_path):
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    path = write(tmp_path / "evil", {1: Evil()})
    with pytest.raises(ConfigError, match=r"evil: not a plain pickle of FedScale's dictionary \(it names "
                                          r"(posix|os)\.system"):
        read_capacity(path)
    assert not marker.exists()


def test_a_numpy_number_is_refused_with_what_to_do(tmp_path):
    path = write(tmp_path / "np", {1: {"computation": np.float64(2.0), "communication": 800.0}})
    with pytest.raises(ConfigError, match="it names numpy.*as JSON in a file ending in .json"):
        read_capacity(path)


@pytest.mark.parametrize("data, words", [
    ({}, "holds {}; expected FedScale's non-empty dictionary"),
    ([1, 2], "holds [1, 2]; expected FedScale's non-empty dictionary"),
    ({1: {"computation": 2.0}}, "client 1: field communication missing"),
    ({1: 5.0}, "client 1: its entry is 5.0; expected a table"),
    ({1: {"computation": -2.0, "communication": 1.0}}, "client 1: field computation is -2.0; expected a finite "
                                                       "positive number"),
    ({1: {"computation": float("nan"), "communication": 1.0}}, "field computation is nan"),
    ({1: {"computation": 1.0, "communication": 0}}, "field communication is 0"),
    ({1: {"computation": True, "communication": 1.0}}, "field computation is True"),
    ({1: {"computation": "3", "communication": 1.0}}, "field computation is '3'"),
    ({"a": {"computation": 1.0, "communication": 1.0}}, "client id 'a' is no integer"),
])
def test_a_malformed_capacity_trace_is_one_line(tmp_path, data, words):
    path = write(tmp_path / "cap", data)
    with pytest.raises(ConfigError) as e:
        read_capacity(path)
    assert str(e.value).startswith(f"{path}: ") and words in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("entry, words", [
    ({"active": [1, 2], "inactive": [3], "finish_time": 10}, "fields active and inactive hold 2 and 1 times"),
    ({"active": [], "inactive": [], "finish_time": 10}, "field active is []; expected a non-empty list"),
    ({"active": [1], "inactive": [3], "finish_time": 0}, "field finish_time is 0"),
    ({"active": [-1], "inactive": [3], "finish_time": 10}, "field active[0] is -1"),
    ({"active": [1], "finish_time": 10}, "field inactive missing"),
])
def test_a_malformed_availability_trace_is_one_line(tmp_path, entry, words):
    path = write(tmp_path / "behave", {4: entry})
    with pytest.raises(ConfigError, match=None) as e:
        read_availability(path)
    assert str(e.value).startswith(f"{path}: client 4: ") and words in str(e.value)


def test_a_missing_truncated_or_directory_file_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"nope: no such file \(\[system.trace\] capacity\)"):
        read_capacity(tmp_path / "nope")
    with pytest.raises(ConfigError, match=r"a directory, not a trace file \(\[system.trace\] availability\)"):
        read_availability(tmp_path, "availability")
    cut = tmp_path / "cut"
    cut.write_bytes(pickle.dumps(CAPACITY)[:-7])
    with pytest.raises(ConfigError, match="cut: not a plain pickle"):
        read_capacity(cut)
    bad = tmp_path / "bad.json"
    bad.write_text("{1: 2}")
    with pytest.raises(ConfigError, match="bad.json: not JSON"):
        read_capacity(bad)


def test_devices_take_distinct_trace_clients_by_seed():
    ids = [5, 1, 9, 3, 7]
    a = assign_trace_clients(["d0", "d1", "d2"], ids, seed=4, stream=0, where="f")
    assert a == assign_trace_clients(["d0", "d1", "d2"], ids, seed=4, stream=0, where="f")
    assert len(set(a.values())) == 3 and set(a.values()) <= set(ids)
    assert any(assign_trace_clients(["d0", "d1", "d2"], ids, seed=s, stream=0, where="f") != a for s in range(5))
    with pytest.raises(ConfigError, match=r"^f: 5 client\(s\), fewer than the run's 6 devices"):
        assign_trace_clients([f"d{i}" for i in range(6)], ids, seed=0, stream=0, where="f")
