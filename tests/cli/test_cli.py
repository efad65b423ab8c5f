"""The command line on bad input: one line naming the file or the valid names, exit 2, no traceback,
and nothing half-written left behind."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edgemask.trainer.config import AlgorithmConfig, DataConfig, ModelConfig, TrainConfig, TrainingConfig
from edgemask.trainer.simulation import simulate


def edgemask(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgemask.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=600)


def assert_clean_failure(p: subprocess.CompletedProcess, *needles: str) -> None:
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr
    errors = [ln for ln in p.stderr.splitlines() if "error:" in ln]
    assert len(errors) == 1, p.stderr
    for n in needles:
        assert n in errors[0], (n, errors[0])


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    ws = tmp_path_factory.mktemp("ws")
    cfg = TrainConfig(data=DataConfig(num_clients=2), model=ModelConfig("mlp", {"hidden": [16]}),
                      algorithm=AlgorithmConfig("fedavg"), training=TrainingConfig(rounds=1, batch_size=64))
    simulate(cfg).write(ws / "runs" / "tiny")
    return ws


def test_every_subcommand_has_help():
    for sub in ("demo", "train", "export", "devices", "profile", "report"):
        p = edgemask(sub, "--help")
        assert p.returncode == 0 and "--workspace" in p.stdout, sub


def test_missing_run_directory(tmp_path):
    p = edgemask("export", "--workspace", str(tmp_path), "--run", "no-such-run")
    assert_clean_failure(p, "no-such-run", "not found")


def test_unknown_format_lists_valid_ones(workspace):
    p = edgemask("export", "--workspace", str(workspace), "--run", "tiny", "--formats", "onnx,coreml")
    assert_clean_failure(p, "coreml", "onnx", "pte")
    assert not (workspace / "artifacts").exists() or not any((workspace / "artifacts").rglob("*.onnx"))


def test_truncated_checkpoint(workspace, tmp_path):
    run = tmp_path / "runs" / "tiny"
    shutil.copytree(workspace / "runs" / "tiny", run)
    ck = run / "model.safetensors"
    ck.write_bytes(ck.read_bytes()[: len(ck.read_bytes()) // 2])
    p = edgemask("export", "--workspace", str(tmp_path), "--run", "tiny", "--formats", "onnx")
    assert_clean_failure(p, "model.safetensors")
    assert not any((tmp_path / "artifacts").rglob("*.onnx"))


@pytest.mark.parametrize("section,value,needle", [
    ("algorithm", 'name = "fedmagic"', "fedavg"),
    ("data", 'name = "imagenet"', "digits"),
    ("model", 'name = "gpt"', "mlp"),
])
def test_unknown_names_in_a_training_config(tmp_path, section, value, needle):
    cfg = tmp_path / "train.toml"
    cfg.write_text(f"[{section}]\n{value}\n")
    p = edgemask("train", "--workspace", str(tmp_path), "--config", str(cfg))
    assert_clean_failure(p, "valid names", needle)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_missing_config_file(tmp_path):
    p = edgemask("train", "--workspace", str(tmp_path), "--config", str(tmp_path / "nope.toml"))
    assert_clean_failure(p, "nope.toml")


def test_corrupt_manifest_in_a_campaign(tmp_path):
    art = tmp_path / "artifacts" / "tiny" / "client-000"
    art.mkdir(parents=True)
    (art / "manifest.json").write_text('{"schema": 1, "run_id": "tiny", "files": [')  # truncated
    (tmp_path / "runs" / "tiny").mkdir(parents=True)
    camp = tmp_path / "c.toml"
    camp.write_text('[campaign]\nname = "c"\nformats = ["onnx"]\ndevices = ["local"]\n'
                    '[[artifacts]]\nrun = "tiny"\nclients = ["client-000"]\ndense = false\n')
    p = edgemask("profile", "--workspace", str(tmp_path), "--campaign", str(camp))
    assert_clean_failure(p, "manifest.json")


def test_report_on_missing_results(tmp_path):
    p = edgemask("report", "--workspace", str(tmp_path), "--results", str(tmp_path / "results" / "nope"))
    assert_clean_failure(p, "nope")


def test_train_writes_a_run(tmp_path):
    cfg = tmp_path / "t.toml"
    cfg.write_text('[run]\nrun_id = "r1"\n[data]\nnum_clients = 2\n[model]\nname = "mlp"\n'
                   '[model.args]\nhidden = [8]\n[training]\nrounds = 1\nbatch_size = 64\n')
    p = edgemask("train", "--workspace", str(tmp_path), "--config", str(cfg))
    assert p.returncode == 0, p.stderr
    summary = json.loads((tmp_path / "runs" / "r1" / "summary.json").read_text())
    assert summary["rounds"] == 1 and set(summary["clients"]) == {"client-000", "client-001"}


def test_train_sequential_flag_runs_the_reference_loop_with_the_same_result(tmp_path):
    cfg = tmp_path / "t.toml"
    body = ('[data]\nnum_clients = 3\n[model]\nname = "mlp"\n[model.args]\nhidden = [8]\n'
            '[training]\nrounds = 2\nbatch_size = 16\n')
    runs = {}
    for flag, rid in (([], "batched"), (["--sequential"], "sequential")):
        cfg.write_text(f'[run]\nrun_id = "{rid}"\n' + body)
        p = edgemask("train", "--workspace", str(tmp_path), "--config", str(cfg), *flag)
        assert p.returncode == 0, p.stderr
        runs[rid] = json.loads((tmp_path / "runs" / rid / "summary.json").read_text())
        config = (tmp_path / "runs" / rid / "config.toml").read_text()
        assert ("batched = false" in config) == bool(flag)  # the run records which loop trained it
    assert runs["batched"]["mean_accuracy"] == pytest.approx(runs["sequential"]["mean_accuracy"], abs=1e-9)
    assert runs["batched"]["bytes_up"] == runs["sequential"]["bytes_up"]


def test_the_default_export_formats_are_declared_once():
    """`edgemask export`, `edgemask demo` and export_run write the same formats unless told otherwise: they read
    edgemask.targets.DEFAULT_EXPORT_FORMATS (issue #31 item 4); a literal default in one of them would drift."""
    import inspect

    from edgemask.cli.main import build_parser
    from edgemask.export.pipeline import export_run
    from edgemask.targets import DEFAULT_EXPORT_FORMATS, DEMO_FORMATS, FORMATS

    assert DEFAULT_EXPORT_FORMATS == ("onnx", "pte") and set(DEFAULT_EXPORT_FORMATS) <= set(FORMATS)
    # the demo adds the local training step (issue #39), declared once beside them
    assert DEMO_FORMATS == ("onnx", "pte", "torch-train") and set(DEMO_FORMATS) <= set(FORMATS)
    parser = build_parser()
    assert parser.parse_args(["export", "--run", "r"]).formats == ["onnx", "pte"]
    assert parser.parse_args(["demo"]).formats == ["onnx", "pte", "torch-train"]
    assert inspect.signature(export_run).parameters["formats"].default is DEFAULT_EXPORT_FORMATS
