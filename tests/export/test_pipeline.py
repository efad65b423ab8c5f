"""The artifact directory: a hand-built run directory exported end to end; manifest and sample_io round trip."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from edgemask.errors import CorruptFileError
from edgemask.fileio import sha256_file
from edgemask.manifest import Manifest
from edgemask.export import TOLERANCE, Tolerance, export_run, load_manifest, load_sample_io
from edgemask.export.formats import FORMATS, ExportSettings
from edgemask.export.formats.base import ExportFormatError
from export_helpers import random_masks
from edgemask.trainer.config import AlgorithmConfig, ModelConfig, RunConfig, TrainConfig
from edgemask.trainer.data import DataConfig
from edgemask.trainer.models import build_model
from edgemask.trainer.run_dir import ClientState, load_run, write_digests, write_run


@pytest.fixture
def run_dir(tmp_path):
    cfg = TrainConfig(run=RunConfig(seed=0, run_id="digits-fedmask-mlp-test"),
                      data=DataConfig(name="digits", num_clients=2),
                      model=ModelConfig("mlp", {"hidden": [32, 16]}), algorithm=AlgorithmConfig("fedmask"))
    torch.manual_seed(0)
    model = build_model("mlp", (64,), 10, hidden=(32, 16))
    clients = {f"client-00{i}": ClientState(masks=random_masks(model, 0.4, seed=i)) for i in range(2)}
    return write_run(tmp_path / "runs" / cfg.run_id, cfg, model.state_dict(), clients, [],
                     {"run_id": cfg.run_id, "clients": {}})


def test_export_run_writes_verified_artifacts(run_dir, tmp_path):
    out = export_run(run_dir, tmp_path / "artifacts", formats=("onnx",), progress=False)
    names = [p.name for p in out]
    assert names == ["dense", "client-000", "client-001"]
    run = load_run(run_dir)
    for d in out:
        m = load_manifest(d)
        assert m.run_id == "digits-fedmask-mlp-test" and m.client_id == d.name
        f = m.file_for("onnx", "fp32")
        assert f.sha256 == sha256_file(d / f.file) and f.bytes == (d / f.file).stat().st_size
        assert m.tolerance["max_abs_diff"]["onnx"] <= 1e-5 and m.tolerance["max_abs_diff"]["torch"] <= 1e-5
        io = load_sample_io(d / "sample_io.npz")
        assert io["input"].shape == (m.sample_io["count"], *m.inputs[0].shape[1:]) and io["label"].dtype == np.int64
        # sample_io's outputs are the MASKED model's (dense: the unmasked one) on the client's real test data
        cid = "client-000" if d.name == "dense" else d.name
        data = run.dataset.client(cid)
        assert np.array_equal(io["input"], data.test_x[: len(io["input"])].numpy())
        with torch.no_grad():
            want = run.build_model(None if d.name == "dense" else d.name)(torch.from_numpy(io["input"])).numpy()
        assert np.abs(io["output"] - want).max() <= 1e-6
        if d.name == "dense":
            assert m.kind == "dense" and m.params["dense"] == m.params["compacted"]
        else:
            assert m.kind == "compacted" and m.params["compacted"] < m.params["dense"]
            assert m.flops["compacted"] < m.flops["dense"]
            assert any(layer["kept"] < layer["total"] for layer in m.layers)
    assert not list((tmp_path / "artifacts" / "digits-fedmask-mlp-test").glob(".*partial"))


def test_a_runtime_that_answers_nan_fails_the_export(run_dir, tmp_path, monkeypatch):
    # the runtime's answer replaced by NaN (a stand-in for one call): `d > limit` once let it through
    onnx = FORMATS.get("onnx")
    monkeypatch.setattr(type(onnx), "run", lambda self, path, inputs, threads=1: np.full((len(inputs), 10), np.nan))
    with pytest.raises(ExportFormatError, match=r"onnxruntime output differs from the compacted torch model by nan"):
        export_run(run_dir, tmp_path / "artifacts", clients=["client-000"], formats=("onnx",),
                   progress=False)
    assert not (tmp_path / "artifacts" / "digits-fedmask-mlp-test" / "client-000").exists()


def test_unchanged_client_is_skipped_and_changed_one_redone(run_dir, tmp_path):
    out = export_run(run_dir, tmp_path / "a", clients=["client-001"], formats=("onnx",), progress=False)
    stamp = {d.name: (d / "manifest.json").stat().st_mtime_ns for d in out}
    again = export_run(run_dir, tmp_path / "a", clients=["client-001"], formats=("onnx",), progress=False)
    assert {d.name: (d / "manifest.json").stat().st_mtime_ns for d in again} == stamp
    (run_dir / "clients" / "client-001.safetensors").write_bytes(
        (run_dir / "clients" / "client-000.safetensors").read_bytes())
    write_digests(run_dir)  # as a new training of the run records them
    export_run(run_dir, tmp_path / "a", clients=["client-001"], formats=("onnx",), progress=False)
    assert (out[1] / "manifest.json").stat().st_mtime_ns != stamp["client-001"]
    assert (out[0] / "manifest.json").stat().st_mtime_ns == stamp["dense"]


def test_export_with_pte(run_dir, tmp_path):
    out = export_run(run_dir, tmp_path / "a", clients=["client-000"], formats=("onnx", "pte"), progress=False)
    m = load_manifest(out[1])
    assert m.file_for("pte").backend == "xnnpack" and m.tolerance["max_abs_diff"]["pte"] <= 1e-5


@pytest.mark.slow
def test_every_accuracy_names_its_samples_and_int8_compares_like_with_like(run_dir, tmp_path):
    # Before: fp32 files' accuracy on the 32 sample_io samples, int8's on up to 256 and its change against the
    # torch model on those 256; nothing said which samples.
    out = export_run(run_dir, tmp_path / "a", clients=["client-001"], formats=("onnx",), progress=False,
                     settings=ExportSettings(int8=True))
    run = load_run(run_dir)
    for d in out:
        m = load_manifest(d)
        cid = "client-000" if d.name == "dense" else d.name  # the dense baseline: the first client's test split
        data = run.dataset.client(cid)
        n = min(256, len(data.test_y))
        assert n > 32  # more than sample_io's samples, so a 32-sample accuracy would differ in size
        fp32, int8 = m.file_for("onnx", "fp32"), m.file_for("onnx", "int8")
        for f in (fp32, int8):
            assert (f.accuracy_set, f.accuracy_samples) == (f"{cid}/test", n)
            got = FORMATS.get("onnx").run(d / f.file, data.test_x[:n].numpy())
            assert f.accuracy == pytest.approx(float((got.argmax(1) == data.test_y[:n].numpy()).mean()))
        assert int8.accuracy_change == pytest.approx(int8.accuracy - fp32.accuracy)
        # the int8 file's deviation from the outputs a device checks against (sample_io), as the host ran it
        io = np.load(d / "sample_io.npz")
        got = FORMATS.get("onnx").run(d / int8.file, io["input"])
        assert int8.max_abs_diff == pytest.approx(float(np.abs(got - io["output"]).max())) and int8.max_abs_diff > 0


def test_manifest_round_trip(run_dir, tmp_path):
    d = export_run(run_dir, tmp_path / "a", clients=["client-000"], formats=("onnx",), progress=False)[1]
    m = load_manifest(d)
    raw = json.loads((d / "manifest.json").read_text())
    assert raw["schema"] == 1 and raw["files"][0]["format"] == "onnx"
    assert Manifest.from_dict(m.to_dict()) == m


def test_corrupt_manifest_names_the_file(run_dir, tmp_path):
    d = export_run(run_dir, tmp_path / "a", clients=["client-000"], formats=("onnx",), progress=False)[1]
    (d / "manifest.json").write_text('{"schema": 1, "run_id": ')
    with pytest.raises(CorruptFileError, match="manifest.json"):
        load_manifest(d)
    (d / "manifest.json").write_text('{"schema": 1, "run_id": "x"}')
    with pytest.raises(CorruptFileError, match="manifest.json"):
        load_manifest(d)


def test_unknown_client_and_format(run_dir, tmp_path):
    from edgemask.errors import EdgemaskError, UnknownNameError

    with pytest.raises(UnknownNameError, match="valid names"):
        export_run(run_dir, tmp_path / "a", formats=("onnx", "caffe"), progress=False)
    with pytest.raises(EdgemaskError, match="client-009"):
        export_run(run_dir, tmp_path / "a", clients=["client-009"], formats=("onnx",), progress=False)


def test_export_never_replaces_a_directory_it_did_not_write(run_dir, tmp_path):
    from edgemask.errors import EdgemaskError

    foreign = tmp_path / "a" / run_dir.name / "dense"
    foreign.mkdir(parents=True)
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(EdgemaskError, match=f"{foreign} exists and is not an edgemask artifact directory"):
        export_run(run_dir, tmp_path / "a", clients=["client-000"], formats=("onnx",), progress=False)
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]
    assert sorted(p.name for p in foreign.parent.iterdir()) == ["dense"]  # no temporary, nothing else written


def _hold(lock, ready, release):
    from edgemask.fileio import exclusive_lock

    with exclusive_lock(lock, "holder"):
        ready.set()
        release.wait(60)


def test_second_export_of_a_run_leaves_at_once_or_waits_for_the_first(run_dir, tmp_path):
    import multiprocessing as mp
    import threading

    from edgemask.errors import EdgemaskError

    ctx = mp.get_context("fork")
    ready, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold, args=(tmp_path / "a" / f".{run_dir.name}.lock", ready, release))
    holder.start()  # stands for another export of this run, still writing
    try:
        assert ready.wait(30)
        with pytest.raises(EdgemaskError, match=f"artifacts/{run_dir.name} is in use by another edgemask "
                                                "process"):
            export_run(run_dir, tmp_path / "a", clients=["client-000"], formats=("onnx",), progress=False)
        assert not (tmp_path / "a" / run_dir.name).exists()
        threading.Timer(1.0, release.set).start()  # the other export finishes after a second
        out = export_run(run_dir, tmp_path / "a", clients=["client-000"], formats=("onnx",), progress=False,
                         wait_s=60)
    finally:
        release.set()
        holder.join(30)
    assert [p.name for p in out] == ["dense", "client-000"] and all((p / "manifest.json").is_file() for p in out)


def test_an_artifact_verified_under_another_rule_is_exported_again(run_dir, tmp_path):
    """The skip of an unchanged client also asks under which tolerance rule it was verified: one exported under
    another rule (or before the manifest recorded rtol) is redone, so its manifest says what a device holds it to."""
    out = export_run(run_dir, tmp_path / "a", clients=["client-001"], formats=("onnx",), progress=False)
    stamp = (out[1] / "manifest.json").stat().st_mtime_ns
    assert load_manifest(out[1]).tolerance_rule == (TOLERANCE.atol, TOLERANCE.rtol)
    export_run(run_dir, tmp_path / "a", clients=["client-001"], formats=("onnx",), progress=False,
               limit=Tolerance(atol=1e-3, rtol=0.0))
    assert (out[1] / "manifest.json").stat().st_mtime_ns != stamp
    assert load_manifest(out[1]).tolerance_rule == (1e-3, 0.0)
