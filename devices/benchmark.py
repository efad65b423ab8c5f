"""One benchmark job: deploy an artifact's model, its sample_io.npz and the runner (a zipapp); run; parse JSON.
A training format's job (pte-train, torch-train; issue #39) deploys the step's file and train_io.npz instead.

The artifact's manifest.json is read with ``edgemask.manifest`` (the contract's one reader, torch-free); this module
adds what only a device needs: the files' sha256 checked before they are sent."""

from __future__ import annotations

import json
import math
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from edgemask.devices.connection import Connection
from edgemask.devices.deploy import deploy_many
from edgemask.devices.errors import DeviceError
from edgemask.devices.inventory import FORMAT_RUNTIME, DeviceSpec
from edgemask.devices.records import Measurement, RunnerSettings
from edgemask.devices.remote.runner.options import TRAINING_DEFAULTS
from edgemask.devices.runner_app import runner_zipapp
from edgemask.errors import CorruptFileError, UnknownNameError
from edgemask.fileio import sha256_file
from edgemask.manifest import ArtifactFile, Manifest, load_manifest
from edgemask.targets import FORMATS, TRAINING_FORMATS, artifact_format
from edgemask.workspace import check_name

# A quantized file's outputs on a board may round differently from the host's run of the same file: the device's
# output check allows this many times the deviation the host measured as its absolute part (and never less than
# the fp32 rule's).
INT8_MARGIN = 1.5

_FLOAT_FIELDS = {f.name for f in fields(Measurement) if f.type in ("float", float)}


def _checked_file(artifact_dir: Path, name: str, sha256: str) -> tuple[Path, str]:
    check_name(name, f"{Path(artifact_dir) / 'manifest.json'}: file")  # a name, never a path out of the artifact
    path = Path(artifact_dir) / name
    if not path.is_file():
        raise CorruptFileError(f"{path}: named in manifest.json but missing; export the artifact again")
    digest = sha256_file(path)
    if digest != sha256:
        raise CorruptFileError(f"{path}: sha256 {digest} differs from manifest.json ({sha256}); export again")
    return path, digest


def unsupported_reason(spec: DeviceSpec, fmt: str, entry: ArtifactFile) -> str | None:
    """Why ``spec`` cannot run this file, judged from the inventory and the board's profile; None if it can."""
    runtime = FORMAT_RUNTIME.get(fmt)
    if runtime is None:
        return f"unknown format {fmt!r}; valid: {', '.join(sorted(FORMAT_RUNTIME))}"
    if spec.runtimes and runtime not in spec.runtimes:
        return f"device {spec.name} has no {runtime} (its runtimes: {', '.join(spec.runtimes)})"
    limit = spec.profile.max_onnx_opset
    opset = entry.opset
    if artifact_format(fmt) == "onnx" and limit is not None and opset is not None and opset > limit:
        return f"{entry.file} has ONNX opset {opset}; a {spec.kind} runs opset <= {limit}; export for it"
    return None


def parse_runner_output(stdout: str) -> dict[str, Any]:
    """The runner's one JSON document (the last non-empty line of stdout)."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        raise ValueError("no output")
    doc = json.loads(lines[-1])
    if not isinstance(doc, dict) or "ok" not in doc:
        raise ValueError("not a runner result")
    return doc


def measurement_from_runner(doc: dict[str, Any], **ids: Any) -> Measurement:
    """Runner JSON + the job's identity -> Measurement. JSON null in a float field becomes NaN."""
    known = {f.name for f in fields(Measurement)}
    kw = {k: v for k, v in doc.items() if k in known and not (v is None and k in _FLOAT_FIELDS)}
    kw.update(ids)
    if not kw.get("ok"):
        kw["ok"] = False
        kw["error"] = kw.get("error") or "the runner failed without a reason"
    kw["latency_ms"] = tuple(float(x) for x in kw.get("latency_ms", ()))
    kw["power_w"] = tuple(float(x) for x in kw.get("power_w", ()))
    for k in ("state_before", "state_after", "profile", "training"):
        kw[k] = kw.get(k) or {}
    return Measurement(**kw)


def _training_step(artifact_dir: Path, manifest: Manifest, fmt: str) -> None:
    """Refuse a training format the artifact was not exported with, saying how to export it."""
    if manifest.training is not None and manifest.find_file(fmt, "fp32") is not None:
        return
    have = "no local step (no `training` in manifest.json)" if manifest.training is None else \
        f"no {fmt} file (it has {', '.join(f.format for f in manifest.files if f.format in TRAINING_FORMATS)})"
    raise UnknownNameError(
        f"{artifact_dir}: artifact {manifest.artifact} has {have}, so its training step cannot be measured as "
        f"{fmt}; export it again with the training formats, e.g. `edgemask export --run {manifest.run_id} "
        f"--clients {manifest.client_id} --formats onnx,{','.join(TRAINING_FORMATS)}`")


def run_benchmark(conn: Connection, spec: DeviceSpec, artifact_dir: Path, fmt: str, variant: str = "fp32",
                  settings: RunnerSettings = RunnerSettings(), timeout: float = 600,
                  train_rounds: int = TRAINING_DEFAULTS["train_rounds"]) -> Measurement:
    """Measure one artifact file on one device.

    A model that cannot run or gives wrong outputs: ``Measurement(ok=False, error=...)``.
    A device that cannot be reached or drops the link: ``DeviceError`` (retry the job).

    A training format (``pte-train``, ``torch-train``) measures the client's local step: each latency sample one
    step on the manifest's minibatch (train_io.npz), after the board's own step is checked against the host's by
    the manifest's training rule; then ``train_rounds`` whole local rounds of ``steps_per_round`` steps
    (``Measurement.training``). An artifact exported without that format raises ``UnknownNameError`` saying how
    to export it.
    """
    artifact_dir = Path(artifact_dir)
    manifest = load_manifest(artifact_dir)
    facts = FORMATS.get(fmt)
    training = facts is not None and facts.training
    if training:
        if variant != "fp32":
            raise UnknownNameError(f"{artifact_dir}: a training step has only the fp32 variant, not {variant!r}")
        _training_step(artifact_dir, manifest, fmt)
    entry = manifest.file_for(artifact_format(fmt), variant, where=artifact_dir)  # "trt": the ONNX file
    ids = dict(device=spec.name, artifact=manifest.artifact, format=fmt, variant=variant, threads=settings.threads)
    why_not = unsupported_reason(spec, fmt, entry)
    if why_not:
        return Measurement(ok=False, error=why_not, **ids)

    # The device holds the outputs to the rule export held this artifact to, |y - y_ref| <= atol + rtol·|y_ref|
    # (the manifest's), each part raised to the job's own where that is larger.
    if training:  # the rule export held the step to: |t - t_ref| <= limit + rtol·|t_ref| (the manifest's)
        atol, rtol = float(manifest.training["limit"]), float(manifest.training["rtol"])
    else:
        atol, rtol = manifest.tolerance_rule
    settings = replace(settings, tolerance=max(settings.tolerance, atol), rtol=max(settings.rtol, rtol))
    if entry.variant != "fp32":
        # A quantized file cannot meet the fp32 rule against sample_io: the device is held to what the host
        # measured for this very file (export's max_abs_diff), with INT8_MARGIN for its own kernels' rounding.
        if entry.max_abs_diff is None:
            return Measurement(ok=False, error=f"{artifact_dir / entry.file}: the manifest records no host output "
                               f"deviation for this {variant} file, so the device's outputs cannot be checked; "
                               "re-export it with this edgemask", **ids)
        settings = replace(settings, tolerance=max(settings.tolerance, INT8_MARGIN * entry.max_abs_diff))
    model, model_sha = _checked_file(artifact_dir, entry.file, entry.sha256)
    # the reference the board checks against: sample_io.npz, or a training step's train_io.npz (every number stored
    # traces to the bytes it measured: both digests are the manifest's, checked before anything is sent)
    io_info = manifest.training if training else manifest.sample_io
    io_file, io_sha = _checked_file(artifact_dir, io_info["file"], io_info["sha256"])
    runner, runner_sha = runner_zipapp()
    remote_runner, remote_model, remote_io = deploy_many(
        conn, spec, [runner, model, io_file], [runner_sha, model_sha, io_sha])
    # deploy put exactly these bytes under their content address (verified on the board): the runner loads the
    # file this digest names, whatever happens to the local file from now on
    ids["artifact_sha256"] = model_sha

    io_args = ["--train-io", remote_io, "--round-steps", str(int(manifest.training["steps_per_round"])),
               "--train-rounds", str(int(train_rounds))] if training else ["--sample-io", remote_io]
    argv = [spec.python, remote_runner, "--model", remote_model, "--format", fmt, *io_args,
            *settings.to_args(), "--power-sensor", spec.power_sensor, "--watch-stdin"]
    if fmt == "trt":  # the board builds the engine from the ONNX with its trtexec; --loadInputs names the binding
        argv += ["--input-name", manifest.inputs[0].name] + (["--trtexec", spec.trtexec] if spec.trtexec else [])
    res = conn.run(argv, timeout=timeout)
    try:
        doc = parse_runner_output(res.stdout)
    except ValueError:
        # No JSON: the runner died (killed for memory, crashed in native code) or the Python is broken.
        if res.rc == 127:
            raise DeviceError(f"{spec.name}: {spec.python!r} not found on the device; fix `python` in the "
                              "inventory") from None
        return Measurement(ok=False, error=f"runner exited with rc={res.rc} and no result: {res.tail()}", **ids)
    if doc.get("ok") and not math.isfinite(float(doc.get("timed_window_s") or math.nan)):
        return Measurement(ok=False, error="runner result has no timed window; not a full result", **ids)
    if training and doc.get("ok"):
        got = (doc.get("training") or {}).get("train_io_sha256")
        if got is not None and got != io_sha:
            return Measurement(ok=False, error=f"the runner read a train_io.npz with sha256 {got}, not the "
                               f"{io_sha} deployed; not a result of this artifact", **ids)
        doc["training"] = {**doc["training"], "train_io_sha256": io_sha}
    return measurement_from_runner(doc, **ids)
