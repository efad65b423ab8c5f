"""The papers' own settings on one host, from their configs in ``configs/``, on stand-in data in each dataset's
own file layout (``benchmarks/standins.py``: read by the repository's loaders unchanged, no real sample in them):

* ``fedmask``: FedMask's IC-CIFAR10 (VGG16, 400 devices, 20 a round), ``configs/ic-cifar10-fedmask.toml``;
* ``ic-emnist``: FedMask's IC-EMNIST (VGG16 on LEAF's FEMNIST, 2,414 writers × 232.8 samples, 20 a round);
* ``har``: FedMask's HAR (the 3-layer MLP on UCI HAR, 30 subjects × 364 samples, 20 a round);
* ``ncp``: FedMask's NCP (the character LSTM on LEAF's Shakespeare, 1,129 roles × 3,743.2 sequences, 20 a round);
* ``perfedmask``: PerFedMask's CIFAR-10 c = 1 (ResNet18, 100 devices, every one every round);
* ``perfedmask-c01``: PerFedMask's c = 0.1 (10 of the 100 a round);
* ``fedselect``: FedSelect's ResNet18 on CIFAR-10 (10 clients, 2 classes each, every one every round).

Each case runs at its own default size here (``CASES``: fewer devices, fewer Shakespeare sequences or a smaller
width where two CPU cores would not finish a case in a few minutes) or at ``--devices`` / ``--widths`` /
``--samples``, and the script prints, per case, what it scaled down against the paper: devices, samples per device,
width, rounds. A CIFAR-10 device keeps the paper's samples at any device count: IC-CIFAR10's
``samples_per_client``, FedSelect's per-class counts, PerFedMask's 600 (``kept_samples``: the 60,000 images over
its 100 devices, where the partition alone would give 20 devices 3,000 each); a LEAF or HAR device has its
stand-in user's. Prints per phase the seconds of one run, its peak host RSS and GPU memory, and the projection to
the config's own rounds; then each phase's own peak RSS, which says which phase sets the run's peak.

    python benchmarks/bench_scale.py [--cases fedmask,ic-emnist,har,ncp,perfedmask,perfedmask-c01,fedselect]
                                     [--devices 50,100,200,400] [--widths 0.125] [--samples 300] [--paper-data]
                                     [--rounds 1] [--device cpu] [--data-root DIR] [--root femnist=DIR] [--cache DIR]

A round keeps the config's own number of devices (``training.participation`` × its ``data.num_clients``, floored:
20 for FedMask's settings, 10 for PerFedMask's c = 0.1), whatever ``--devices`` says, so two device counts compare;
fewer devices than that and every device trains every round. The table's ``a round`` column says how many trained.

Each (case, devices, width) runs in a fresh process, so its peak RSS is its own. Stand-ins are written once under
``--cache`` and reused: CIFAR-10's python batches (50,000 + 10,000 images), LEAF's FEMNIST and Shakespeare JSON
(as many users as the most devices asked, the paper's samples per user, Shakespeare's fewer; ``--paper-data``:
the paper's users and samples, FEMNIST's 2.1 GB of JSON, which the loader parses twice), UCI HAR's text files at
the paper's size. ``--data-root`` (CIFAR-10) and ``--root KIND=DIR`` read real data instead.

Phases (exclusive seconds: a phase inside another counts once, in the inner one):

* ``data``: reading and partitioning the dataset;
* ``build``: the rest of building the algorithm (the model, ``Algorithm.__init__``'s checks, e.g. FedMask's
  one-sample rule's forward) and the run's summary, once a run;
* ``setup``: the algorithm's ``setup()`` outside local training (FedMask's top-k and bookkeeping, PerFedMask's
  MILP); ``setup train``: local training inside it (ClientPruning's epoch);
* ``train``: the rounds' local training (the stacked forward/backward passes, by the engine);
* ``tasks``: building each selected device's local task (FedMask's start m^T ⊙ m_k);
* ``aggregate``: the uploads (``client_updates``) and the server's ``aggregate``;
* ``eval``: the stacked evaluation forward passes; ``eval glue``: the rest of an evaluation (each device's model);
* ``finetune``: fine-tuning after the last round (PerFedMask's heads), once a run;
* ``other``: the rest of ``simulate`` (a round's glue: the store's pins, the FLOP and byte accounting, the history).

``outside`` is the share of the rounds' time spent outside the stacked passes (tasks, aggregate, eval glue,
other), the figure #36 holds to 20 %; data, set-up and fine-tuning are once a run, not in it. The projection: data,
set-up and fine-tuning + the config's rounds × a round's time outside evaluation + its evaluations (every
``eval_every`` rounds, and one after fine-tuning) × one evaluation's time.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # standins.py beside this file, when imported too

from standins import PAPER, Size, standin, write_cifar10  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PHASES = ("data", "build", "setup", "setup train", "train", "tasks", "aggregate", "eval", "eval glue", "finetune",
          "other")
ONCE = ("data", "build", "setup", "setup train", "finetune")  # once a run, not in its rounds
write_standin = write_cifar10  # the name other benchmarks import from here


@dataclass(frozen=True)
class Case:
    """A paper's setting: its config, the stand-in it reads, and the size it runs at here by default."""

    config: str  # under configs/
    data: str  # the stand-in (standins.WRITERS): cifar10, femnist, shakespeare, har
    devices: int  # data.num_clients here
    width: float  # the model's width (WIDTH_ARGS): 1 is the paper's
    samples: float | None = None  # a LEAF stand-in's samples per user on average; None: the paper's


CASES = {
    "fedmask": Case("ic-cifar10-fedmask.toml", "cifar10", 400, 0.125),
    "ic-emnist": Case("ic-emnist-fedmask.toml", "femnist", 100, 0.125),
    "har": Case("har-fedmask.toml", "har", 30, 1.0),
    "ncp": Case("ncp-fedmask.toml", "shakespeare", 20, 0.25, samples=100),
    "perfedmask": Case("perfedmask-cifar10-c1.toml", "cifar10", 10, 0.0625),
    "perfedmask-c01": Case("perfedmask-cifar10-c01.toml", "cifar10", 20, 0.0625),  # 10 a round, as the paper's
    "fedselect": Case("fedselect-cifar10-resnet18.toml", "cifar10", 10, 0.125),
}
# which of a model's arguments a width scales (their defaults × width, rounded, at least 1)
WIDTH_ARGS = {"vgg16": ("width",), "resnet18": ("width",), "char_lstm": ("hidden", "fc"), "har_mlp": ("hidden",)}


def scaled_args(model: str, args: dict, width: float) -> dict:
    """The model's arguments at ``width``: a ``width`` argument set, or its layer sizes' defaults scaled."""
    from edgemask.trainer.models import MODELS

    names = WIDTH_ARGS.get(model)
    if names is None:
        if width != 1:
            raise SystemExit(f"{model}: no width to scale; pass --widths 1 (scaled: {', '.join(WIDTH_ARGS)})")
        return dict(args)
    if names == ("width",):
        return {**args, "width": width}
    defaults = inspect.signature(MODELS.get(model)).parameters

    def scale(v):
        return tuple(scale(u) for u in v) if isinstance(v, (tuple, list)) else max(1, round(v * width))

    return {**args, **{n: scale(args.get(n, defaults[n].default)) for n in names}}


def per_round(cfg) -> int:
    """The devices a round of the config trains: :func:`clients_per_round` of its own device count."""
    from edgemask.trainer.sampling import clients_per_round

    return clients_per_round(cfg.data.num_clients, cfg.training.participation)


def kept_participation(base, devices: int) -> float:
    """``training.participation`` that makes a round of ``devices`` devices train as many as ``base``'s own round
    (all of them where there are fewer): (k + ½) / devices, so ⌊devices · participation⌋ is k whatever the
    floating point does."""
    k = per_round(base)
    return 1.0 if k >= devices else (k + 0.5) / devices


POOLS = {"cifar10": 60_000}  # the images a partition shares out: CIFAR-10's 50,000 + 10,000 (the stand-in's too)


def kept_samples(base) -> int | None:
    """A device's samples as in the paper, where the config leaves them to the partition (PerFedMask: the pooled
    60,000 CIFAR-10 images over its 100 devices, 600 each), so fewer devices do not each take a larger share of
    the pool; None where the config fixes them (``samples_per_client``, FedSelect's per-class counts) or the data
    has its users."""
    d = base.data
    if d.samples_per_client is not None or d.name not in POOLS or "train_per_class" in d.options:
        return None
    return POOLS[d.name] // d.num_clients


def case_config(case: str, devices: int, width: float, rounds: int, device: str, data_root: Path):
    """(the config as the paper has it, the config run here)."""
    from edgemask.trainer.config import TrainConfig

    cfg = TrainConfig.load(ROOT / "configs" / CASES[case].config)
    data = dataclasses.replace(cfg.data, root=str(data_root), num_clients=devices,
                               samples_per_client=kept_samples(cfg) or cfg.data.samples_per_client)
    model = dataclasses.replace(cfg.model, args=scaled_args(cfg.model.name, cfg.model.args, width))
    training = dataclasses.replace(cfg.training, rounds=rounds, eval_every=1, device=device,
                                   participation=kept_participation(cfg, devices))
    return cfg, cfg.replace(data=data, model=model, training=training)


def _high_water(reset: bool) -> int:
    """This process's peak RSS in bytes since the last reset (VmHWM), then reset (``clear_refs`` 5, Linux ≥ 4.0);
    0 where /proc does not have it. A reset also lowers ``getrusage``'s ru_maxrss, so the run's peak is the largest
    phase's."""
    try:
        with open("/proc/self/status") as f:
            kb = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
        if reset:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        return kb * 1024
    except (OSError, StopIteration, ValueError):
        return 0


class PhaseClock:
    """Exclusive seconds per phase: a wrapped call's time, less the wrapped calls inside it. And each phase's own
    peak RSS: at every call's start and end the peak since the last such moment is the phase then running's, and
    the high-water mark is reset (``other``: outside every wrapped call)."""

    def __init__(self) -> None:
        self.seconds = {p: 0.0 for p in PHASES}
        self.calls = {p: 0 for p in PHASES}
        self.peak = {p: 0 for p in PHASES}
        self.stack: list[tuple[str, list[float]]] = []  # (phase, seconds of the wrapped calls inside it)
        _high_water(reset=True)

    def mark(self) -> None:
        """The peak since the last mark, to the phase running now."""
        now = self.stack[-1][0] if self.stack else "other"
        self.peak[now] = max(self.peak[now], _high_water(reset=True))

    def wrap(self, owner, attr: str, phase: str, inside: dict[str, str] | None = None) -> None:
        """Time ``owner.attr`` as ``phase``, or as ``inside[p]`` when called within phase ``p``."""
        fn = getattr(owner, attr)
        clock = self

        def timed(*args, **kwargs):
            name = (inside or {}).get(clock.stack[-1][0], phase) if clock.stack else phase
            clock.mark()
            clock.stack.append((name, [0.0]))
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - t0
                clock.mark()
                children = clock.stack.pop()[1][0]
                clock.seconds[name] += elapsed - children
                clock.calls[name] += 1
                if clock.stack:
                    clock.stack[-1][1][0] += elapsed

        setattr(owner, attr, timed)


def run_one(case: str, devices: int, width: float, rounds: int, device: str, data_root: Path) -> dict:
    """One simulate() of the case, its phases timed; peak RSS and GPU memory of this process."""
    import torch

    from edgemask.trainer import engines, simulation
    from edgemask.trainer.algorithms import ALGORITHMS

    base, cfg = case_config(case, devices, width, rounds, device, data_root)
    clock = PhaseClock()
    algo_cls = ALGORITHMS.get(cfg.algorithm.name)
    clock.wrap(algo_cls, "setup", "setup")
    for engine in (engines.BatchedEngine, engines.SequentialEngine):
        # inside setup: ClientPruning's epoch; inside finetune: PerFedMask's heads, once after the rounds
        clock.wrap(engine, "train", "train", inside={"setup": "setup train", "finetune": "finetune"})
        clock.wrap(engine, "evaluate", "eval")
    clock.wrap(algo_cls, "local_task", "tasks")
    clock.wrap(algo_cls, "client_updates", "aggregate")
    clock.wrap(algo_cls, "aggregate", "aggregate")
    clock.wrap(simulation, "evaluate_clients", "eval glue")
    clock.wrap(simulation, "build_dataset", "data")
    clock.wrap(simulation, "build_algorithm", "build")
    clock.wrap(simulation, "summarize", "build")
    clock.wrap(simulation, "finetune", "finetune")
    t0 = time.perf_counter()
    result = simulation.simulate(cfg)
    total = time.perf_counter() - t0
    clock.mark()
    clock.seconds["other"] = total - sum(clock.seconds.values())
    peak_gpu = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0
    evals = clock.calls["eval glue"]
    s = clock.seconds
    per_round_s = (s["train"] + s["tasks"] + s["aggregate"] + s["other"]) / rounds
    per_eval = (s["eval"] + s["eval glue"]) / max(evals, 1)
    full_rounds, every = base.training.rounds, base.training.eval_every
    evaluations = -(-full_rounds // every) + (clock.calls["finetune"] > 0)  # and one after fine-tuning
    projection = sum(s[p] for p in ONCE) + full_rounds * per_round_s + evaluations * per_eval
    stacked = s["train"] + s["eval"]
    round_time = total - sum(s[p] for p in ONCE)
    algo = result.algorithm
    trained = {h["client"] for h in result.history if h["round"] == 0 and h["metric"] == "train_loss"}
    return {"case": case, "devices": len(algo.client_ids), "per_round": len(trained), "width": width,
            "rounds": rounds, "device": device, "model_args": cfg.model.args,
            "samples": sum(c.num_train for c in algo.dataset.clients) / len(algo.dataset.clients),
            "seconds": s, "phase_peak": clock.peak, "total": total,
            "peak_rss": max(max(clock.peak.values()), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024),
            "peak_gpu": peak_gpu, "outside": 1 - stacked / round_time if round_time else float("nan"),
            "projection": projection, "full_rounds": full_rounds,
            "accuracy": result.summary["mean_accuracy"], "threads": torch.get_num_threads()}


def table(rows: list[dict]) -> str:
    head = ("case", "devices", "a round", "train samples", "width", *PHASES, "total s", "outside", "peak RSS GB",
            "GPU GB", "projection")
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in rows:
        s = r["seconds"]
        lines.append(" | ".join([r["case"], str(r["devices"]), str(r["per_round"]), f"{r['samples']:.1f}",
                                 f"{r['width']:g}", *(f"{s[p]:.2f}" for p in PHASES),
                                 f"{r['total']:.1f}", f"{100 * r['outside']:.0f} %", f"{r['peak_rss'] / 1e9:.2f}",
                                 f"{r['peak_gpu'] / 1e9:.2f}",
                                 f"{r['projection'] / 60:.1f} min / {r['full_rounds']} rounds"]))
    return "\n".join(lines)


def peak_table(rows: list[dict]) -> str:
    """Each phase's own peak RSS (GB): which phase sets the run's peak."""
    head = ("case", "devices", "width", *PHASES)
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in rows:
        p = r.get("phase_peak") or {}
        lines.append(" | ".join([r["case"], str(r["devices"]), f"{r['width']:g}",
                                 *(f"{p.get(x, 0) / 1e9:.2f}" for x in PHASES)]))
    return "\n".join(lines)


def case_data(case: str, devices: list[int], args: argparse.Namespace) -> tuple[Path, Size | None, str]:
    """Where the case's data is, the stand-in's size (None: real data, or CIFAR-10's own), and what it is."""
    kind = CASES[case].data
    if kind in args.root:
        return args.root[kind], None, f"real {kind} from {args.root[kind]}"
    if kind == "cifar10":
        if args.data_root is not None:
            return args.data_root, None, f"real CIFAR-10 from {args.data_root}"
        return standin("cifar10", args.cache), None, "CIFAR-10 STAND-IN (60,000 images)"
    paper = PAPER[kind]
    size = paper if args.paper_data else Size(max(devices), args.samples or CASES[case].samples
                                              or paper.mean_samples)
    root = standin(kind, args.cache, size)
    return root, size, f"{kind} STAND-IN, {size.users:,} users × {size.mean_samples:,g} samples ({root})"


def scaled_down(case: str, devices: list[int], widths: list[float], size: Size | None, data: str,
                rounds: int) -> str:
    """One line: what this case runs at against the paper's setting."""
    from edgemask.trainer.config import TrainConfig

    base = TrainConfig.load(ROOT / "configs" / CASES[case].config)
    k = per_round(base)
    counts = ", ".join(f"{d:,} ({min(k, d)} a round)" for d in devices)
    kind = CASES[case].data
    if size is None:
        kept = kept_samples(base)
        samples = ("samples per device as the config fixes them" if kept is None else
                   f"samples per device at most the paper's {kept:,} (data.samples_per_client)")
    else:
        paper = PAPER[kind].mean_samples
        samples = (f"samples per device {size.mean_samples:,g} of the paper's {paper:,g}"
                   if size.mean_samples != paper else f"samples per device the paper's {paper:,g}")
    shown = "; ".join(f"{w:g}: {scaled_args(base.model.name, base.model.args, w)}" for w in widths)
    return (f"{case} ({CASES[case].config}, {base.algorithm.name}): devices {counts} of the paper's "
            f"{base.data.num_clients:,} ({k} a round); {samples}; width {', '.join(f'{w:g}' for w in widths)} of 1 "
            f"({base.model.name} {shown}); rounds {rounds} of {base.training.rounds} (projected); data: {data}")


def root_option(text: str) -> tuple[str, Path]:
    kind, sep, path = text.partition("=")
    if not sep or kind not in ("femnist", "shakespeare", "har", "cifar10"):
        raise argparse.ArgumentTypeError(f"{text!r}: KIND=DIR, KIND one of cifar10, femnist, har, shakespeare")
    return kind, Path(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(CASES), help=f"of {', '.join(CASES)}")
    ap.add_argument("--devices", default=None, help="device counts, comma-separated (default: each case's own)")
    ap.add_argument("--widths", default=None, help="model widths, comma-separated (default: each case's own)")
    ap.add_argument("--samples", type=float, default=None,
                    help="a LEAF or HAR stand-in's samples per device on average (default: each case's own)")
    ap.add_argument("--paper-data", action="store_true", help="stand-ins at the paper's users and samples")
    ap.add_argument("--rounds", type=int, default=1, help="rounds run (each evaluated)")
    ap.add_argument("--device", default="cpu", help="training.device: cpu or cuda")
    ap.add_argument("--data-root", type=Path, default=None, help="the CIFAR-10 python batches (default: a stand-in)")
    ap.add_argument("--root", type=root_option, action="append", default=[], metavar="KIND=DIR",
                    help="real data for a kind (femnist, shakespeare, har, cifar10) instead of its stand-in")
    ap.add_argument("--cache", type=Path, default=ROOT / "workspace" / "bench-data", help="where stand-ins go")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # case:devices:width, run in this process (a child's)
    args = ap.parse_args()
    args.root = dict(args.root)
    if args.one:
        case, devices, width = args.one.split(":")
        print(json.dumps(run_one(case, int(devices), float(width), args.rounds, args.device, args.data_root)))
        return
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        raise SystemExit(f"unknown case {', '.join(unknown)}; the cases: {', '.join(CASES)}")
    rows, notes = [], []
    for case in cases:
        devices = [int(d) for d in args.devices.split(",")] if args.devices else [CASES[case].devices]
        widths = [float(w) for w in args.widths.split(",")] if args.widths else [CASES[case].width]
        root, size, data = case_data(case, devices, args)
        if size is not None:  # a natural split has as many devices as the stand-in has users
            devices = sorted({min(d, size.users) for d in devices})
        notes.append(scaled_down(case, devices, widths, size, data, args.rounds))
        print(notes[-1], file=sys.stderr, flush=True)
        for width in widths:
            for n in devices:
                cmd = [sys.executable, __file__, "--one", f"{case}:{n}:{width}", "--rounds", str(args.rounds),
                       "--device", args.device, "--data-root", str(root)]
                p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
                if p.returncode != 0:  # the child's traceback tail: on a borrowed GPU there is no second look
                    tail = "\n    ".join(p.stderr.strip().splitlines()[-12:] or ["?"])
                    print(f"{case} {n} devices width {width:g}: failed (exit {p.returncode}):\n    {tail}",
                          file=sys.stderr)
                    continue
                rows.append(json.loads(p.stdout.strip().splitlines()[-1]))
                print(table(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    print("Scaled down from the papers' settings (stand-ins are not the real datasets):")
    print("\n".join(f"- {n}" for n in notes))
    print()
    print(table(rows))
    print()
    print("Peak RSS (GB) while each phase ran (its own high-water mark, /proc/self/status VmHWM):")
    print(peak_table(rows))


if __name__ == "__main__":
    main()
