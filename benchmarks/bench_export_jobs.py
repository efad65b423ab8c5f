"""Export wall time per client at 1 and 2 jobs (``export_run(workers=N)``, ``edgemask export --jobs N``).

Two run directories, each FedMask-style (every client's last masked layers keep a different share of units): the
demo's MLP (64-3072-2048-10 on digits, its 2 hidden layers masked) and VGG16 in FedMask's IC-CIFAR10 setting
(the last 8 masked layers keep 20 %, 2 classes per client). CIFAR-10 is a stand-in here: random pixels written in
the dataset's standard python-pickle batch format (export time does not depend on pixel values; no download).
Each case is exported with {onnx, pte} and with {onnx, pte, tflite} + int8; jobs 1 and 2 alternate within one
repetition into fresh directories, so load on a shared machine hits both alike. s/client = wall ÷ models exported
(clients + the dense baseline); speedup = s/client at 1 job ÷ at 2 jobs.

Why 2 jobs fall short of 2× on 2 cores, measured alongside: "1 job, 1 thread" exports in this process with torch at
one thread (what each of 2 workers gets, ``export/parallel.py``), so ``parallel share`` = 1 − (1 job) ÷ (1 job,
1 thread) is how much of one export already ran on the second core; ``worker start`` is one spawned worker's
import and run-directory load. A worker pays more than that once: its first export also warms torch.export's and
the converters' lazy imports and caches (a cold process's first VGG16 client took ~6 s longer than a warm one's),
so ``pool fixed s`` = 2-job wall − (models ÷ 2) × (1 job, 1 thread s/client) is the pool's fixed cost at 2 jobs.
The projection to ``--project`` clients (+ the dense baseline), the papers' 400 devices: 1 job, (N + 1) × s/client;
2 jobs, pool fixed s + ⌈(N + 1) ÷ 2⌉ × (1 job, 1 thread s/client): at a few clients the fixed cost hides what
2 jobs gain at 400.

    .venv/bin/python benchmarks/bench_export_jobs.py [--clients 4] [--reps 1] [--models mlp,vgg16] [--no-tflite]
"""

from __future__ import annotations

import argparse
import os
import pickle
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
warnings.filterwarnings("ignore")

from bench_export import fedmask_masks  # noqa: E402
from edgemask.export import export_run  # noqa: E402
from edgemask.export.formats import ExportSettings  # noqa: E402
from edgemask.trainer.config import AlgorithmConfig, ModelConfig, RunConfig, TrainConfig  # noqa: E402
from edgemask.trainer.data import DataConfig  # noqa: E402
from edgemask.trainer.models import build_model  # noqa: E402
from edgemask.trainer.run_dir import ClientState, write_run  # noqa: E402


def write_cifar_standin(directory: Path, per_batch: int = 400, seed: int = 0) -> Path:
    """A stand-in CIFAR-10: random uint8 pixels in the standard batches (b"data" (N, 3072), b"labels")."""
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        labels = [int(i % 10) for i in range(per_batch)]
        d = {b"batch_label": name.encode(), b"labels": labels,
             b"data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8)}
        with open(directory / name, "wb") as f:
            pickle.dump(d, f, protocol=2)
    return directory


def make_run(tmp: Path, name: str, clients: int) -> Path:
    if name == "mlp":
        data, model_cfg, last = DataConfig(name="digits", num_clients=clients), \
            ModelConfig("mlp", {"hidden": [3072, 2048]}), 2
        model = build_model("mlp", (64,), 10, hidden=(3072, 2048))
    else:
        root = write_cifar_standin(tmp / "cifar-10-batches-py")
        data, model_cfg, last = DataConfig(name="cifar10", num_clients=clients, root=str(root)), \
            ModelConfig("vgg16", {}), 8
        model = build_model("vgg16", (3, 32, 32), 10)
    cfg = TrainConfig(run=RunConfig(seed=0, run_id=f"bench-{name}"), data=data, model=model_cfg,
                      algorithm=AlgorithmConfig("fedmask"))
    torch.manual_seed(0)
    states = {f"client-{i:03d}": ClientState(masks=fedmask_masks(model, last, 0.2, seed=i)) for i in range(clients)}
    return write_run(tmp / "runs" / cfg.run_id, cfg, model.state_dict(), states, [],
                     {"run_id": cfg.run_id, "clients": {}})


def format_seconds(run_dir: Path, tmp: Path) -> dict[str, float]:
    """Seconds to write (convert) and then run-check each format/variant of client-000's compacted model, once."""
    from edgemask.export.compact import compact
    from edgemask.export.formats import FORMATS, FormatContext
    from edgemask.trainer.run_dir import load_run

    run = load_run(run_dir)
    data = run.dataset.client("client-000")
    masked = run.build_model("client-000")
    x = data.test_x[:1]
    module = compact(masked, x).module
    ctx = FormatContext(x, ExportSettings(int8=True), data.train_x[:64])
    out = {}
    for fmt in ("onnx", "pte", "tflite"):
        f = FORMATS.get(fmt)
        for variant in f.variants:
            path = tmp / f"fmt.{variant}.{f.filename(variant)}"
            t0 = time.perf_counter()
            f.write(module, path, ctx, variant)
            out[f"{fmt}/{variant}"] = time.perf_counter() - t0
    return out


def _ready() -> None:
    """A worker's first task: nothing; its wall time is the spawn, the imports and the run's load."""


def worker_start_seconds(run_dir: Path) -> float:
    """Seconds for one spawned export worker (``export/parallel.py``'s initializer) to take its first task."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from edgemask.export.parallel import _init

    t0 = time.perf_counter()
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=_init,
                             initargs=(str(run_dir), 1)) as pool:
        pool.submit(_ready).result()
    return time.perf_counter() - t0


def export_wall(run: Path, out: Path, formats, int8: bool, jobs: int, threads: int | None = None) -> float:
    """Seconds for ``export_run`` into ``out`` (removed after); ``threads``: torch's threads here, for jobs 1."""
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        t0 = time.perf_counter()
        export_run(run, out, formats=formats, progress=False, settings=ExportSettings(int8=int8), workers=jobs)
        return time.perf_counter() - t0
    finally:
        torch.set_num_threads(before)
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--models", default="mlp,vgg16")
    ap.add_argument("--no-tflite", action="store_true")
    ap.add_argument("--project", type=int, default=400, help="clients to project the export time to")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench_export_jobs."))
    cases = [(("onnx", "pte"), False)] + ([] if args.no_tflite else [(("onnx", "pte", "tflite"), True)])
    load = os.getloadavg()
    print(f"# host: {os.cpu_count()} cores, load average at start {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}",
          file=sys.stderr)
    rows, per_format = [], {}
    try:
        for name in args.models.split(","):
            run = make_run(tmp, name, args.clients)
            models = args.clients + 1
            if not args.no_tflite:
                per_format[name] = format_seconds(run, tmp)
                print(f"# {name} per format: {per_format[name]}", file=sys.stderr, flush=True)
            start = worker_start_seconds(run)
            for formats, int8 in cases:
                walls: dict[str, list[float]] = {"1": [], "2": [], "1t": []}
                for rep in range(args.reps):
                    for key in ("1", "2", "1t"):  # interleaved: the same load drift hits each
                        jobs, threads = (1, 1) if key == "1t" else (int(key), None)
                        out = tmp / f"a-{name}-{len(formats)}-{rep}-{key}"
                        walls[key].append(export_wall(run, out, formats, int8, jobs, threads))
                        print(f"# {name} {'+'.join(formats)}{' +int8' if int8 else ''} jobs={key}: "
                              f"{walls[key][-1]:.1f} s for {models} models", file=sys.stderr, flush=True)
                s1, s2, s1t = (min(walls[k]) / models for k in ("1", "2", "1t"))
                fixed = max(min(walls["2"]) - models / 2 * s1t, 0.0)
                n = args.project + 1
                one, two = n * s1 / 60, (fixed + -(-n // 2) * s1t) / 60
                rows.append((name, "+".join(formats) + (" +int8" if int8 else ""), s1, s2, s1 / s2, s1t,
                             1 - s1 / s1t, start, fixed, one, two, one / two))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    load = os.getloadavg()
    print(f"| model | formats | s/client, 1 job | s/client, 2 jobs | speedup | s/client, 1 job 1 thread "
          f"| parallel share of 1 job | worker start s | pool fixed s | {args.project} clients, 1 job, min "
          f"| {args.project} clients, 2 jobs, min | projected speedup |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]:.2f} | {r[3]:.2f} | {r[4]:.2f}× | {r[5]:.2f} | {r[6]:.0%} | {r[7]:.1f} "
              f"| {r[8]:.1f} | {r[9]:.1f} | {r[10]:.1f} | {r[11]:.2f}× |")
    if per_format:
        keys = list(next(iter(per_format.values())))
        print("\nwrite (convert) seconds for one compacted client, 1 process:\n")
        print("| model | " + " | ".join(keys) + " |")
        print("|---|" + "---|" * len(keys))
        for name, secs in per_format.items():
            print(f"| {name} | " + " | ".join(f"{secs[k]:.2f}" for k in keys) + " |")
    print(f"host: {os.cpu_count()} cores; load average at the end {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} "
          f"(other processes share these cores: 2 jobs cannot reach 2× unless 2 cores are idle)")


if __name__ == "__main__":
    main()
