"""The export stage: run directory -> ``artifacts/<run-id>/<client-id>/`` per client, plus ``dense/``.

Per client: rebuild the masked model, compact it, verify it on the client's real test samples, write each format
and check it in its real runtime (a failure: one line naming the artifact, the format and the runtime's message;
a format whose runtime cannot run one of the model's layers, or a local step that trains nothing, is left out of
that artifact with a line saying so), then write ``sample_io.npz`` and ``manifest.json``. The directory is assembled
under a temporary name and renamed into place; an unchanged client (same input hash) is skipped.

Accuracies compare like with like: every file's accuracy is measured in its runtime on the same samples (the
first ``VERIFY_SAMPLES`` of the client's test split; the dense baseline uses the first client's), and the manifest
names that set and its size (``accuracy_set``, ``accuracy_samples``). An int8 file's ``accuracy_change`` is its
accuracy minus the fp32 file's of the same format on those samples.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import warnings
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np
import torch

from edgemask.errors import EdgemaskError
from edgemask.fileio import atomic_dir, exclusive_lock, remove_stale_temporaries, sha256_file
from edgemask.manifest import (MANIFEST, SAMPLE_IO, SCHEMA, ArtifactFile, Manifest, TensorSpec, load_artifact,
                               write_manifest, write_sample_io)
from edgemask.targets import DEFAULT_EXPORT_FORMATS
from edgemask.workspace import check_name
from edgemask.export.compact import compact
from edgemask.export.formats import (FORMATS, ExportFormatError, ExportSettings, FormatContext, FormatRuntimeError,
                                     LayerUnsupportedError)
from edgemask.export.formats.base import Format
from edgemask.export.runtime import one_line
from edgemask.export.formats.isolate import failing_layer
from edgemask.export.layers import ETRECORD, layer_records, write_etrecord
from edgemask.export.parallel import export_pending
from edgemask.export.training import STEP_RULE, TRAIN_IO, NothingTrainsError, write_training
from edgemask.export.verify import TOLERANCE, Tolerance, max_abs_diff, verify_compaction

SAMPLES = 32  # sample_io size
VERIFY_SAMPLES = 256  # compaction check and every file's accuracy: up to this many test samples
ACCURACY_METHOD = 2  # in the input hash: artifacts whose accuracies were measured otherwise are re-exported
CALIBRATION = 64  # int8 calibration samples from the client's train split
DENSE = "dense"


class ExportNote(UserWarning):
    """What export left out of one model's artifact, and why; the rest of the artifact is written: a format
    whose converter or runtime cannot take one of the model's layers, a local step that trains nothing (a
    PerFedMask device with budget ψ_n = 0). The command line shows it as ``edgemask: warning: …``."""


def _warn(line: str) -> None:
    warnings.warn(line, ExportNote, stacklevel=3)


def input_hash(run, client_id: str | None, formats: Sequence[str], settings: ExportSettings) -> str:
    """sha256 over the digests of the run's bytes this export read (``Run.digest``: the bytes the model was built
    from, checked against the run's ``digests.json``, never the file re-read later) and the export settings."""
    h = hashlib.sha256()
    h.update(run.digest("model.safetensors").encode())
    h.update(run.digest("config.toml").encode())
    if client_id is not None:
        h.update(run.digest(run.client_file(client_id)).encode())
    h.update(json.dumps({"formats": list(formats), "settings": asdict(settings), "schema": SCHEMA,
                         "accuracy_method": ACCURACY_METHOD},
                        sort_keys=True).encode())
    return h.hexdigest()


def _is_artifact_dir(path: Path) -> bool:
    """Whether ``path`` is an artifact directory export wrote (the only kind it replaces)."""
    return path.is_dir() and (path / MANIFEST).is_file()


def _unchanged(dest: Path, digest: str, etrecord: bool = False, rule: Tolerance | None = None) -> bool:
    """The artifact at ``dest`` was exported from these inputs (``digest``) and, where ``rule`` is given, verified
    under that tolerance rule (an artifact verified under another, or before the manifest recorded rtol, is
    exported again)."""
    if not (dest / MANIFEST).is_file():
        return False
    try:
        m = load_artifact(dest)  # files changed since (or a manifest copied in) are exported again
    except EdgemaskError:
        return False
    if etrecord and any(f.format == "pte" for f in m.files) and not (m.etrecord and (dest / m.etrecord).is_file()):
        return False  # (a .pte skipped for a layer ExecuTorch cannot run has no ETRecord either)
    if rule is not None and m.tolerance_rule != (rule.atol, rule.rtol):
        return False
    return (m.input_hash == digest and all((dest / f.file).is_file() for f in m.files) and (dest / SAMPLE_IO).is_file()
            and (m.training is None or (dest / m.training["file"]).is_file()))


def _accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    return float((logits.argmax(1) == labels).mean()) if len(labels) else float("nan")


def _written(fmt: Format, where: str, name: str, write: Callable[[], dict], run: Callable[[], np.ndarray]
             ) -> tuple[dict, np.ndarray]:
    """``write()`` then ``run()`` one file of ``fmt``; a failure of either is one line naming ``where`` (the
    artifact, ``<run>/<client>``), the format, the file and the converter's or runtime's own message."""
    try:
        info = write()
    except ExportFormatError as e:
        raise type(e)(f"{where}: {fmt.name}: {e}") from None
    except Exception as e:  # the converters raise many kinds; the message says which file and why
        raise FormatRuntimeError(f"{where}: {fmt.name}: converting to {name} failed: {one_line(e)}") from None
    try:
        return info, run()
    except ExportFormatError as e:
        raise type(e)(f"{where}: {fmt.name}: {e}") from None
    except Exception as e:  # the runtimes raise RuntimeError, their own kinds, or worse
        raise FormatRuntimeError(f"{where}: {fmt.name}: {fmt.runtime} failed to run {name}: {one_line(e)}") from None


def export_client(run, client_id: str | None, out_dir: Path, formats: Sequence[str],
                  settings: ExportSettings = ExportSettings(), limit: Tolerance | float = TOLERANCE,
                  etrecord: bool = False, note: Callable[[str], None] | None = None) -> Path:
    """Export one client (``client_id=None``: the dense baseline) to ``out_dir``. Returns ``out_dir``.

    ``limit``: the rule (:class:`edgemask.export.verify.Tolerance`; a bare number: an absolute limit) that the
    compacted model is held to against the masked one, and each fp32 file against the compacted model.

    ``etrecord``: with ``pte`` among the formats, also write the ETRecord (:mod:`edgemask.export.layers`) for the host's
    Inspector (a second lowering).

    A converter or runtime that fails on a file stops the export with one line (:class:`FormatRuntimeError`:
    the artifact, the format, the file, the message), unless one layer alone fails the same way
    (:func:`edgemask.export.formats.isolate.failing_layer`): then that format is left out of this artifact and
    ``note`` (default: an :class:`ExportNote` warning) gets one line naming the layer and why; the other formats
    are written. A local step that trains nothing (every trainable tensor frozen whole: a PerFedMask device with
    ψ_n = 0) leaves the training formats out the same way, with its inference files written."""
    note = note or _warn
    where = f"{run.run_id}/{client_id or DENSE}"
    ds = run.dataset
    fmts = [FORMATS.get(f) for f in formats]
    for f in fmts:
        f.check_available()
    steps = [f for f in fmts if getattr(f, "training", False)]  # the local step's formats (export.training)
    fmts = [f for f in fmts if f not in steps]
    data_client = client_id if client_id is not None else run.client_ids[0]
    data = ds.client(data_client)
    masked = run.build_model(client_id)
    x_all, y_all = data.test_x[:VERIFY_SAMPLES], data.test_y[:VERIFY_SAMPLES]
    x, y = x_all[:SAMPLES], y_all[:SAMPLES]
    result = compact(masked, x[:1])
    tol = Tolerance.of(limit)
    torch_diff = verify_compaction(masked, result, x_all, tol)
    model = result.module
    with torch.no_grad():
        ref_out = masked(x).float().numpy()
        cmp_out = model(x).float().numpy()

    with atomic_dir(out_dir, _is_artifact_dir, "an edgemask artifact directory (it has no manifest.json)") as tmp:
        ctx = FormatContext(x[:1], settings, data.train_x[:CALIBRATION])  # (in the runtimes' layout)
        files, diffs = [], {"torch": torch_diff}
        written_etrecord = None
        labels = y_all.numpy()
        measured_on = {"accuracy_set": f"{data_client}/test", "accuracy_samples": int(len(labels))}
        for fmt in fmts:
            variants = [v for v in fmt.variants if v == "fp32" or (settings.int8 and v == "int8")]
            fp32_acc, fmt_files = None, []
            before = set(tmp.iterdir())
            try:
                for variant in variants:  # fp32 first: an int8 file's change is against it
                    name = fmt.filename(variant)
                    path = tmp / name
                    try:
                        info, got = _written(fmt, where, name, lambda: fmt.write(model, path, ctx, variant),
                                             lambda: fmt.run(path, x_all.numpy()))  # (len(labels), n_out), batch 1
                    except FormatRuntimeError as e:
                        layer = failing_layer(fmt, model, ctx, tmp) if variant == "fp32" else None
                        if layer is None:
                            raise
                        raise LayerUnsupportedError(f"{where}: {fmt.name} left out: {layer.describe(fmt)}; the "
                                                    "rest of the artifact is written") from e
                    acc = _accuracy(got, labels)
                    if variant == "fp32":
                        c = tol.compare(cmp_out, got[:SAMPLES])  # on the sample_io inputs, as a device checks
                        if not c.ok:  # NaN too
                            raise ExportFormatError(f"{out_dir}/{name}: {fmt.runtime} output differs from the "
                                                    f"compacted torch model {tol.describe(c)}")
                        d = diffs[fmt.name] = c.max_abs_diff
                        fp32_acc = acc
                        extra = {"max_abs_diff": d, "accuracy": acc}
                    else:  # how far this quantized file's outputs lie from sample_io's, on the host: the device's check
                        extra = {"accuracy": acc, "accuracy_change": acc - fp32_acc,
                                 "max_abs_diff": max_abs_diff(got[:SAMPLES], ref_out)}
                    fmt_files.append(ArtifactFile(format=fmt.name, variant=variant, file=name,
                                                  sha256=sha256_file(path), bytes=path.stat().st_size,
                                                  runtime=info["runtime"], opset=info.get("opset"),
                                                  backend=info.get("backend"), **extra, **measured_on))
                    if fmt.name == "pte" and variant == "fp32" and info.get("etrecord"):
                        written_etrecord = info["etrecord"]  # from the .pte's own lowering (export.formats.pte)
            except LayerUnsupportedError as e:
                for leftover in set(tmp.iterdir()) - before:  # what this format wrote (an ETRecord too)
                    shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()
                note(str(e))
                continue
            files += fmt_files

        training = None
        if steps:
            try:
                written, training = write_training(run, client_id, tmp, steps, STEP_RULE, where=out_dir)
            except NothingTrainsError as e:
                note(f"{where}: no training step written ({', '.join(f.name for f in steps)}): {e}; its "
                     "inference files are written")
            else:
                for fmt, path, info, d in written:
                    files.append(ArtifactFile(format=fmt.name, variant="fp32", file=path.name,
                                              sha256=sha256_file(path), bytes=path.stat().st_size,
                                              runtime=info["runtime"], backend=info.get("backend"), max_abs_diff=d))
                training["sha256"] = sha256_file(tmp / TRAIN_IO)
        write_sample_io(tmp / SAMPLE_IO, x.numpy(), ref_out, y.numpy())
        layers = layer_records(masked.base, model, (ctx.example,), result.layers,
                               {f.file: tmp / f.file for f in files if f.format == "onnx"})
        etrec = written_etrecord
        if etrec is None and etrecord and any(f.format == "pte" for f in files):
            etrec = write_etrecord(model, ctx.example, tmp / ETRECORD).name
        cfg = run.config
        manifest = Manifest(
            run_id=run.run_id, client_id=client_id or DENSE, kind="compacted" if client_id else DENSE,
            algorithm=cfg.algorithm.name, model=cfg.model.name, dataset=cfg.data.name,
            inputs=[TensorSpec("input", [1, *ds.input_shape], str(x.dtype).removeprefix("torch."))],
            outputs=[TensorSpec("output", [1, int(ref_out.shape[1])], "float32")],
            files=files,
            sample_io={"file": SAMPLE_IO, "sha256": sha256_file(tmp / SAMPLE_IO), "count": int(len(x))},
            params={"dense": result.params_dense, "compacted": result.params_compacted},
            flops={"dense": result.flops_dense, "compacted": result.flops_compacted},
            layers=layers,
            etrecord=etrec,
            tolerance={"limit": tol.atol, "rtol": tol.rtol, "max_abs_diff": diffs},  # the rule: devices hold to it
            created=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            input_hash=input_hash(run, client_id, formats, settings),
            training=training,
        )
        write_manifest(tmp, manifest)
    return out_dir


def export_run(run_dir: Path, out_root: Path, clients: str | Iterable[str] = "all",
               formats: Sequence[str] = DEFAULT_EXPORT_FORMATS, progress: bool = True,
               settings: ExportSettings = ExportSettings(), limit: Tolerance | float = TOLERANCE,
               wait_s: float = 0.0, etrecord: bool = False, workers: int = 1) -> list[Path]:
    """Export every requested client of a run, and the dense baseline, under ``out_root/<run-id>/``.

    Locks, each waited for up to ``wait_s`` seconds, then a one-line reason:
    - the run's own lock ``runs/.<run-id>.lock``, shared (:func:`edgemask.trainer.run_dir.run_read_lock`): no ``edgemask
      train`` replaces the run while it is exported, nor does an export read a run being trained (issue #27);
    - ``out_root/.<run-id>.lock``, exclusive: one export of a run at a time (a second one, once it has the lock,
      finds the first one's artifacts unchanged).
    Both are taken on real paths (symlinks resolved), so a run or artifact directory reached through a link takes
    the locks its real path takes. Holding them, the run's files are read once and checked against its digests
    (``Run.snapshot``); every model and every ``input_hash`` comes from those bytes.
    Returns the artifact directories (skipped, unchanged ones included). ``etrecord``, ``limit``: see
    :func:`export_client`.
    ``workers``: clients exported at a time, in processes (:mod:`edgemask.export.parallel`; 1, the default: one after
    another in this process; ``edgemask export --jobs`` defaults to this machine's cores). The workers read the
    run while this process holds its shared lock, so no training replaces it meanwhile.
    What a client's export leaves out (:func:`export_client`) is an :class:`ExportNote` warning from this
    process, for the clients the workers exported too. The progress bar is closed on a failure as well, so the
    error the command line prints next starts a line of its own."""
    from edgemask.trainer.run_dir import load_run, run_read_lock

    formats = tuple(formats)
    dup = next((f for i, f in enumerate(formats) if f in formats[:i]), None)
    if dup is not None:
        raise EdgemaskError(f"formats: {dup!r} is given twice; name each format once")
    for f in formats:
        FORMATS.get(f).check_available()  # unknown names and missing toolchains fail before any work
    with run_read_lock(run_dir, wait_s) as real_dir:
        run = load_run(real_dir)
        check_name(run.run_id, f"run directory {run.path} (its name becomes artifacts/<run-id>)")
        ids = run.client_ids if clients == "all" else list(clients)
        for cid in ids:
            check_name(cid, f"client id of run {run.run_id}")
            if cid not in run.client_ids:
                raise EdgemaskError(f"run {run.run_id} has no client {cid!r}; clients: {', '.join(run.client_ids)}")
        if len(set(ids)) != len(ids):
            raise EdgemaskError(f"clients: {next(c for i, c in enumerate(ids) if c in ids[:i])!r} is given twice")
        run.snapshot(ids)  # every file this export uses, read and checked now
        for cid in ids:
            run.client_state(cid)  # a damaged client file (no mask metadata) fails here, before any model is exported
        jobs: list[str | None] = [None, *ids]
        root = (Path(out_root) / run.run_id).resolve()
        if root.name != run.run_id:
            raise EdgemaskError(f"{Path(out_root) / run.run_id} is a link to {root}, another run's artifacts; "
                                "remove the link, then export again")
        out = []
        with exclusive_lock(root.parent / f".{root.name}.lock", f"artifacts/{run.run_id}", wait_s):
            for cid in jobs:  # what a killed export left: no live writer owns it while we hold the lock
                remove_stale_temporaries(root / (cid or DENSE))
            bar = None
            if progress:
                from tqdm import tqdm

                bar = tqdm(total=len(jobs), desc=f"export {run.run_id}", unit="model")
            try:
                todo = []
                for cid in jobs:
                    dest = root / (cid or DENSE)
                    if _unchanged(dest, input_hash(run, cid, formats, settings), etrecord and "pte" in formats,
                                  Tolerance.of(limit)):
                        bar is not None and bar.update(1)
                    else:
                        todo.append((cid, dest))
                    out.append(Path(out_root) / run.run_id / (cid or DENSE))
                export_pending(export_client, run, todo, formats, settings, limit, etrecord, workers,
                               (lambda: bar.update(1)) if bar is not None else (lambda: None), _warn)
            finally:  # on a failure too: the bar ends its line, so the error is printed on a line of its own
                if bar is not None:
                    bar.close()
    return out
