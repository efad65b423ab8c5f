"""What a device offers, asked of the device itself (`edgemask devices list / check`)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from edgemask.devices.benchmark import parse_runner_output, run_benchmark
from edgemask.devices.connection import Connection, open_connection
from edgemask.devices.deploy import deploy_runner
from edgemask.devices.errors import DeviceError
from edgemask.devices.inventory import FORMAT_RUNTIME, DeviceSpec
from edgemask.devices.records import RunnerSettings
from edgemask.devices.setup import GENERIC_KINDS, missing_items
from edgemask.targets import TRAINING_FORMATS


def probe(conn: Connection, spec: DeviceSpec, timeout: float = 120.0) -> dict[str, Any]:
    """Arch, OS, Python, numpy and runtime versions, free disk and memory, power sensors, governor, temperatures
    and throttling, as the device sees them (the runner's --probe mode, deployed like any file).

    Raises DeviceError when the device cannot be reached or its Python cannot run the probe.
    """
    runner = deploy_runner(conn, spec)
    trtexec = ["--trtexec", spec.trtexec] if spec.trtexec else []
    res = conn.run([spec.python, runner, "--probe", "--watch-stdin", *trtexec], timeout=timeout)
    try:
        info = parse_runner_output(res.stdout)
    except ValueError:
        raise DeviceError(f"{spec.name}: the probe gave no answer (rc={res.rc}: {res.tail()}); check `python` "
                          f"({spec.python!r}) on the device") from None
    info.pop("ok", None)
    installed = {rt for rt, version in info.get("runtimes", {}).items() if version}
    info["training"] = training_formats(spec, info)
    info["formats"] = sorted([fmt for fmt, rt in FORMAT_RUNTIME.items()
                              if rt in installed and rt in spec.runtimes and fmt not in TRAINING_FORMATS]
                             + [fmt for fmt, line in info["training"].items() if line.startswith("yes")])
    info["reachable"] = True
    return info


def training_formats(spec: DeviceSpec, info: dict[str, Any]) -> dict[str, str]:
    """Whether ``spec`` can take a client's local step in each training format, one line each, from its kind's
    facts and its probe (``info``: the runner's ``training_runtimes`` and ``training_errors``):
    {"pte-train": "yes — executorch 1.5.1", "torch-train": "no — torch is not installed ..."}."""
    lines = {}
    versions = info.get("training_runtimes") or {}
    errors = info.get("training_errors") or {}
    for fmt in TRAINING_FORMATS:
        rt = FORMAT_RUNTIME[fmt]
        if spec.profile.no_training:
            why = spec.profile.no_training
        elif spec.kind not in GENERIC_KINDS and rt not in spec.profile.runtimes:
            why = f"a {spec.kind} has no {rt} build ({spec.profile.notes or spec.profile.os})"
        elif not versions.get(fmt):
            why = errors.get(fmt) or "the board's runner did not report it"
            if rt == "torch" and why.startswith("no module named"):
                why = f"torch is not installed for {info.get('python_executable') or spec.python} ({why})"
        elif rt not in spec.runtimes:
            why = f"{rt} is installed ({versions[fmt]}) but not among this device's runtimes; add \"{rt}\" to " \
                  f"runtimes of [devices.{spec.name}] in devices.toml"
        else:
            lines[fmt] = f"yes — {versions[fmt]}"
            continue
        lines[fmt] = f"no — {why}"
    return lines


def list_devices(inventory: dict[str, DeviceSpec]) -> list[dict[str, Any]]:
    """The inventory as rows for a table; connects to nothing."""
    rows = []
    for name in sorted(inventory):
        s = inventory[name]
        rows.append({
            "name": s.name, "kind": s.kind, "address": s.address, "python": s.python, "workdir": s.workdir,
            "runtimes": ",".join(s.runtimes), "power_sensor": s.power_sensor,
            "host_keys": "trust on first use" if s.trust_on_first_use else ("-" if s.is_local else "known_hosts"),
        })
    return rows


def write_self_test_artifact(directory: Path) -> Path:
    """A tiny real artifact for ``devices check --self-test``: Conv(1->4, 3x3) + Relu -> Flatten -> Gemm(144->3)
    on a (1, 1, 8, 8) input (node names as an exporter writes them), 8 samples whose reference outputs are
    onnxruntime's on the host, and its manifest."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from edgemask.fileio import sha256_file
    from edgemask.manifest import SAMPLE_IO, ArtifactFile, Manifest, TensorSpec, write_manifest, write_sample_io

    rng = np.random.default_rng(28)
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    w1, b1 = rng.standard_normal((4, 1, 3, 3)).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    w2, b2 = (rng.standard_normal((3, 144)) / 12).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["input", "w1", "b1"], ["c"], name="Conv_0"),
         helper.make_node("Relu", ["c"], ["r"], name="Relu_1"),
         helper.make_node("Flatten", ["r"], ["f"], name="Flatten_2"),
         helper.make_node("Gemm", ["f", "w2", "b2"], ["output"], name="Gemm_3", transB=1)],
        "edgemask-self-test",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 1, 8, 8])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 3])],
        initializer=[numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (b1, "b1"), (w2, "w2"), (b2, "b2"))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(d / "model.onnx"))
    sess = ort.InferenceSession(str(d / "model.onnx"), providers=["CPUExecutionProvider"])
    x = rng.standard_normal((8, 1, 8, 8)).astype(np.float32)
    y = np.concatenate([sess.run(None, {"input": x[i:i + 1]})[0] for i in range(8)])
    write_sample_io(d / SAMPLE_IO, x, y, y.argmax(1))
    write_manifest(d, Manifest(
        run_id="self-test", client_id="tiny", kind="dense", algorithm="none", model="self-test", dataset="random",
        inputs=[TensorSpec("input", [1, 1, 8, 8], "float32")], outputs=[TensorSpec("output", [1, 3], "float32")],
        files=[ArtifactFile(format="onnx", variant="fp32", file="model.onnx", sha256=sha256_file(d / "model.onnx"),
                            bytes=(d / "model.onnx").stat().st_size, runtime="onnxruntime", opset=13)],
        sample_io={"file": SAMPLE_IO, "sha256": sha256_file(d / SAMPLE_IO), "count": 8},
        params={"dense": 0, "compacted": 0}, flops={"dense": 0, "compacted": 0}, layers=[],
        tolerance={"limit": 1e-5, "max_abs_diff": {}}, created="2026-11-25T00:00:00Z"))
    return d


SELF_TEST_SETTINGS = RunnerSettings(warmup_runs=1, warmup_seconds=0.2, min_runs=20, min_seconds=1.0,
                                    idle_seconds=0.0, profile_layers=True, profile_runs=10)


def run_self_test(conn: Connection, spec: DeviceSpec, timeout: float = 3600.0) -> dict[str, Any]:
    """`devices check --self-test`: a tiny engine built, checked against host outputs and timed on the board,
    through the same job a campaign runs (format trt). {"ok", "error" | the engine's build, latency, layers}."""
    import tempfile

    if "tensorrt" not in spec.runtimes:
        return {"ok": False, "error": f"{spec.name} declares no tensorrt runtime; nothing to self-test"}
    with tempfile.TemporaryDirectory(prefix="edgemask-self-test-") as tmp:
        m = run_benchmark(conn, spec, write_self_test_artifact(Path(tmp) / "art"), "trt",
                          settings=SELF_TEST_SETTINGS, timeout=timeout)
    if not m.ok:
        return {"ok": False, "error": m.error}
    trt = m.state_after.get("tensorrt", {})
    return {"ok": True, "tensorrt": trt.get("tensorrt"), "engine_cached": trt.get("cached"),
            "engine_build_s": trt.get("build_s"), "p50_ms": statistics.median(m.latency_ms), "runs": m.runs,
            "output_max_abs_diff": m.output_max_abs_diff, "accuracy": m.accuracy, "power_source": m.power_source,
            "gpu_power_source": trt.get("gpu_power_source"),
            "layers": [op[0] for run in m.profile.get("runs", [])[:1] for op in run["ops"]]}


def check_device(spec: DeviceSpec, self_test: bool = False) -> dict[str, Any]:
    """Connect and probe one device (and, with ``self_test``, build and time a tiny TensorRT engine on it).
    Never raises for an unreachable device: ``reachable`` False and ``error``."""
    row: dict[str, Any] = {"name": spec.name, "kind": spec.kind, "address": spec.address}
    try:
        with open_connection(spec) as conn:
            row.update(probe(conn, spec))
            if self_test:
                row["self_test"] = run_self_test(conn, spec)
        row["missing"] = missing_items(spec, row)  # what `devices setup` (or the fix given) still has to do
    except DeviceError as e:
        row.update(reachable=False, error=str(e))
    profile = spec.profile
    row["max_onnx_opset"] = profile.max_onnx_opset
    return row
