"""The artifact manifest contract (docs/contracts.md): the one writer and reader round trip, every malformed
manifest is one line naming the file (and the field), and the module stays free of torch."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from edgemask.errors import CorruptFileError, UnknownNameError
from edgemask.manifest import (MANIFEST, SAMPLE_IO, ArtifactFile, Manifest, TensorSpec, load_manifest,
                               load_sample_io, write_manifest, write_sample_io)


def a_manifest() -> Manifest:
    return Manifest(
        run_id="digits-fedmask-1", client_id="client-003", kind="compacted", algorithm="fedmask", model="cnn",
        dataset="digits",
        inputs=[TensorSpec("input", [1, 1, 8, 8], "float32")], outputs=[TensorSpec("output", [1, 10], "float32")],
        files=[
            ArtifactFile(format="onnx", variant="fp32", file="model.onnx", sha256="a" * 64, bytes=1234,
                         runtime="onnxruntime", opset=18, max_abs_diff=3e-7, accuracy=0.9375,
                         accuracy_set="client-003/test", accuracy_samples=48),
            ArtifactFile(format="pte", variant="fp32", file="model.pte", sha256="b" * 64, bytes=5678,
                         runtime="executorch", backend="xnnpack"),
            ArtifactFile(format="onnx", variant="int8", file="model.int8.onnx", sha256="c" * 64, bytes=400,
                         runtime="onnxruntime", opset=18, accuracy=0.875, accuracy_change=-0.0625,
                         accuracy_set="client-003/test", accuracy_samples=48),
        ],
        sample_io={"file": SAMPLE_IO, "sha256": "d" * 64, "count": 32},
        params={"dense": 12345, "compacted": 4567}, flops={"dense": 123456, "compacted": 45678},
        layers=[{"name": "conv1", "kept": 10, "total": 16}, {"name": "fc", "kept": 10, "total": 10}],
        tolerance={"limit": 5e-4, "rtol": 1e-4, "max_abs_diff": {"torch": 2e-7, "onnx": 3e-7}},
        created="2026-11-22T10:00:00Z", input_hash="e" * 64,
    )


def test_write_then_load_gives_the_same_manifest(tmp_path):
    m = a_manifest()
    path = write_manifest(tmp_path, m)
    assert path == tmp_path / MANIFEST
    raw = json.loads(path.read_text())
    assert raw["schema"] == 1 and raw["files"][1]["backend"] == "xnnpack" and raw["files"][1]["opset"] is None
    back = load_manifest(tmp_path)
    assert back == m and back.to_dict() == raw
    assert load_manifest(path) == m  # the manifest.json itself works as well as its directory
    assert back.file_for("onnx", "int8").bytes == 400 and back.find_file("tflite") is None
    assert raw["files"][2]["accuracy_set"] == "client-003/test" and raw["files"][2]["accuracy_samples"] == 48
    assert raw["tolerance"]["rtol"] == 1e-4 and back.tolerance_rule == (5e-4, 1e-4)


def test_a_manifest_written_before_rtol_reads_as_an_absolute_limit(tmp_path):
    """Manifests exported before issue #37 record only ``tolerance.limit``: the rule was absolute then, rtol 0. They
    stay schema 1 and are read as they were written, not refused."""
    write_manifest(tmp_path, a_manifest())
    raw = json.loads((tmp_path / MANIFEST).read_text())
    del raw["tolerance"]["rtol"]
    raw["tolerance"]["limit"] = 1e-5
    (tmp_path / MANIFEST).write_text(json.dumps(raw))
    old = load_manifest(tmp_path)
    assert old.tolerance_rule == (1e-5, 0.0) and "rtol" not in old.tolerance
    assert old.to_dict() == raw  # read and written back as it was


def test_missing_format_names_the_place_and_what_it_has(tmp_path):
    m = a_manifest()
    with pytest.raises(UnknownNameError) as e:
        m.file_for("tflite", where=tmp_path)
    assert str(e.value) == (f"{tmp_path}: no tflite/fp32 file in the manifest; "
                            "it has: onnx/fp32, onnx/int8, pte/fp32")
    with pytest.raises(UnknownNameError, match="^artifact digits-fedmask-1/client-003: no pte/int8 file"):
        m.file_for("pte", "int8")


def _bad(raw: dict, field: str, value=...) -> dict:
    """``raw`` with ``field`` (dotted, list indices as numbers) set to ``value`` or, by default, removed."""
    *parents, last = field.split(".")
    node = raw
    for p in parents:
        node = node[int(p)] if isinstance(node, list) else node[p]
    if value is ...:
        del node[last]
    else:
        node[last] = value
    return raw


# (what is broken, how, what the one-line message must say)
MALFORMED = [
    ("bad JSON", lambda r: '{"schema": 1, "run_id": ', "not valid JSON"),
    ("not an object", lambda r: "[1, 2]", "not a JSON object but a list"),
    ("other schema", lambda r: _bad(r, "schema", 2), "field 'schema' is 2; this edgemask reads schema 1"),
    ("no schema", lambda r: _bad(r, "schema"), "missing field 'schema'"),
    ("missing field", lambda r: _bad(r, "run_id"), "missing field 'run_id'"),
    ("missing nested field", lambda r: _bad(r, "files.0.sha256"), "missing field 'files[0].sha256'"),
    ("missing dict key", lambda r: _bad(r, "sample_io.count"), "missing field 'sample_io.count'"),
    ("unknown field", lambda r: _bad(r, "files.1.bites", 3), "unknown field 'files[1].bites'"),
    ("string for an int", lambda r: _bad(r, "files.0.bytes", "1234"),
     "field 'files[0].bytes' is a string (\"1234\"), expected an integer"),
    ("float for an int", lambda r: _bad(r, "params.dense", 1.5), "field 'params.dense' is a number (1.5)"),
    ("bool for an int", lambda r: _bad(r, "layers.0.kept", True),
     "field 'layers[0].kept' is true, expected an integer"),
    ("null where required", lambda r: _bad(r, "client_id", None), "field 'client_id' is null, expected a string"),
    ("object for a list", lambda r: _bad(r, "inputs", {}), "field 'inputs' is an object, expected a list"),
    ("string for a number", lambda r: _bad(r, "tolerance.max_abs_diff.onnx", "small"),
     "field 'tolerance.max_abs_diff.onnx' is a string (\"small\"), expected a number"),
    ("null rtol", lambda r: _bad(r, "tolerance.rtol", None), "field 'tolerance.rtol' is null, expected a number"),
    # names that would lead a reader (profiling, deploy) out of the artifact directory (issue #19)
    ("file out of the artifact", lambda r: _bad(r, "files.1.file", "../../etc/passwd"),
     "field 'files[1].file': '../../etc/passwd' is not a plain name"),
    ("absolute file", lambda r: _bad(r, "files.0.file", "/etc/passwd"),
     "field 'files[0].file': '/etc/passwd' is not a plain name"),
    ("sample_io out of the artifact", lambda r: _bad(r, "sample_io.file", ".."),
     "field 'sample_io.file': '..' is not a plain name"),
]


@pytest.mark.parametrize("case, corrupt, says", MALFORMED, ids=[c[0] for c in MALFORMED])
def test_malformed_manifest_is_one_line_naming_file_and_field(tmp_path, case, corrupt, says):
    write_manifest(tmp_path, a_manifest())
    path = tmp_path / MANIFEST
    broken = corrupt(json.loads(path.read_text()))
    path.write_text(broken if isinstance(broken, str) else json.dumps(broken))
    with pytest.raises(CorruptFileError) as e:
        load_manifest(tmp_path)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(f"{path}: ") and says in msg, msg
    assert msg.endswith("re-export the artifact (`edgemask export --run RUN`)"), msg


def test_missing_manifest_says_to_export_first(tmp_path):
    with pytest.raises(CorruptFileError) as e:
        load_manifest(tmp_path / "nowhere")
    assert str(e.value) == (f"{tmp_path / 'nowhere' / MANIFEST}: no manifest; "
                            "export the artifact first (`edgemask export --run RUN`)")


def test_undecodable_manifest_names_the_file(tmp_path):
    (tmp_path / MANIFEST).write_bytes(b"\xff\xfe{")
    with pytest.raises(CorruptFileError, match=f"^{tmp_path / MANIFEST}: cannot read the manifest"):
        load_manifest(tmp_path)


def test_writer_refuses_what_the_reader_would_refuse(tmp_path):
    with pytest.raises(TypeError, match="'files\\[0\\].bytes' is a number"):
        write_manifest(tmp_path, replace(a_manifest(), files=[replace(a_manifest().files[0], bytes=12.0)]))
    assert not (tmp_path / MANIFEST).exists()


def test_sample_io_round_trip_and_errors(tmp_path):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    write_sample_io(tmp_path / SAMPLE_IO, x, np.ones((3, 2), np.float64), np.array([0, 1, 1], np.int32))
    io = load_sample_io(tmp_path / SAMPLE_IO)
    assert np.array_equal(io["input"], x) and io["output"].dtype == np.float32 and io["label"].dtype == np.int64
    with pytest.raises(CorruptFileError, match="no sample_io; export the artifact first"):
        load_sample_io(tmp_path / "none.npz")
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(CorruptFileError, match="bad.npz: not a valid sample_io.npz .*; re-export"):
        load_sample_io(tmp_path / "bad.npz")
    np.savez(tmp_path / "partial.npz", input=x)
    with pytest.raises(CorruptFileError, match="partial.npz: not a valid sample_io.npz"):
        load_sample_io(tmp_path / "partial.npz")


@pytest.mark.parametrize("modules", ["edgemask.manifest", "devices.benchmark, profiling.campaign"])
def test_manifest_readers_do_not_load_torch(modules):
    # devices and profiling read manifests where torch is absent or too slow to load
    code = f"import sys, {modules}; print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout
