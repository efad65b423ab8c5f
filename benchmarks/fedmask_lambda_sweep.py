"""Where FedMask's λ_R stops being safe (issue #38 item 2, docs/fedmask.md "λ_R safety"): for each model of the zoo
FedMask is run on, each λ_R and each seed, whether every client's model is still alive at the end (summary.json's
``collapse``: no client with a dead layer and a constant output, :class:`edgemask.trainer.simulation.CollapseWatch`),
its mean personalized accuracy (local mask) and its mask density; then, per model, the range of λ_R at which every
seed stays alive.

Every run is ``configs/digits-fedmask.toml`` (8 devices × 2 classes, 15 rounds, 2 local epochs, lr 100, the binary
forward, s = ``init_scale`` = 1 unless ``--init-scale``) with the model swapped and ``prune_last`` set per model
(:data:`CASES`). The LSTM reads LEAF's Shakespeare JSON: ``--shakespeare ROOT`` for the real one; without it a
stand-in is written under ``--work`` from plain English text, one client per contiguous slice: a next-character
task with LEAF's 80-character vocabulary and 80-character windows, the shape FedMask's NCP has. The text is
``--text FILE ...`` where given, else what every Python ships: the Language Reference topics ``help()`` shows
(the standard library's ``pydoc_data.topics``, 0.46 M characters on Python 3.11; it differs between Python
versions, so a table says which one ran).

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python benchmarks/fedmask_lambda_sweep.py \\
        --models mlp cnn vgg16 tiny_mobilenet char_lstm --lambdas 0 2e-5 2e-4 6e-4 2e-3 2e-2 --seeds 0 1 2 \\
        --json workspace/lambda_sweep/all.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edgemask.trainer.config import AlgorithmConfig, ModelConfig, TrainConfig  # noqa: E402
from edgemask.trainer.data import DataConfig  # noqa: E402
from edgemask.trainer.data.leaf import ALL_LETTERS, SEQ_LEN  # noqa: E402
from edgemask.trainer.simulation import simulate  # noqa: E402


@dataclass(frozen=True)
class Case:
    """One model of the sweep: its ``[model]``, FedMask's ``prune_last`` for it, and whether it reads text."""

    model: ModelConfig
    prune_last: int
    text: bool = False
    note: str = ""


CASES = {
    "mlp": Case(ModelConfig("mlp"), 2, note="64-128-64-10"),
    "cnn": Case(ModelConfig("cnn"), 2, note="conv 16, conv 32, FC"),
    # full width has 15.3 M weights at the 8×8 input, 63× width 1/8's 0.24 M, whose runs take 80-110 s on two
    # shared cores: 15 runs at full width would not fit an hour
    "vgg16": Case(ModelConfig("vgg16", {"width": 0.125}), 8, note="batch norm, width 1/8, prune_last 8 (§4.2)"),
    "tiny_mobilenet": Case(ModelConfig("tiny_mobilenet"), 2, note="batch norm, depthwise"),
    # hidden 256 (the paper's, 0.91 M weights) had not finished one run in 5 minutes here: a quarter of the width
    # (0.06 M), the same layers
    "char_lstm": Case(ModelConfig("char_lstm", {"hidden": 64, "fc": [64, 32]}), 2, text=True,
                      note="embed 8, 2 × LSTM 64, FC 64-32, W_o real (Table 3)"),
}


def shipped_text() -> tuple[str, str]:
    """``(where it comes from, the text)``: English prose that every Python install ships, whatever else is
    installed: the Language Reference topics of ``help()`` (``pydoc_data.topics``, in the order of their names)."""
    try:
        from pydoc_data.topics import topics
    except ImportError:  # a distribution that strips the standard library's pydoc data
        topics = {}
    return (f"Python {sys.version_info.major}.{sys.version_info.minor}'s pydoc_data.topics",
            "\n".join(topics[k] for k in sorted(topics)))


def read_texts(paths: list[Path] | None) -> tuple[str, str]:
    """``(where it comes from, the text)`` of the stand-in: the ``--text`` files, or :func:`shipped_text`. A file
    that cannot be read, or no text at all, ends the run with one line saying what to give."""
    if not paths:
        where, text = shipped_text()
    else:
        parts = []
        for p in paths:
            try:
                parts.append(p.read_text(encoding="utf-8", errors="replace"))
            except OSError as e:
                raise SystemExit(f"--text: cannot read {p} ({e.strerror or e}); give readable plain-text files")
        where, text = ", ".join(p.name for p in paths), " ".join(parts)
    if not text.strip():
        raise SystemExit(f"--text: {where} holds no text; give plain-text files with --text FILE ...")
    return where, text


def standin_shakespeare(raw: str, out: Path, clients: int, train: int, test: int) -> Path:
    """LEAF Shakespeare JSON (``out/train/all.json``, ``out/test/all.json``) cut from the text ``raw``:
    characters outside LEAF's vocabulary turned into spaces and whitespace runs into one space, split into
    ``clients`` contiguous slices; each slice gives ``train`` windows of SEQ_LEN characters from its first 80 %
    and ``test`` from the rest, each labelled with the character that follows. Returns ``out``."""
    known = set(ALL_LETTERS)
    text = re.sub(r"\s+", " ", "".join(c if c in known else " " for c in raw))
    size = len(text) // clients
    split = {"train": {}, "test": {}}
    for k in range(clients):
        chunk = text[k * size:(k + 1) * size]
        cut = int(0.8 * len(chunk))
        for name, part, n in (("train", chunk[:cut], train), ("test", chunk[cut:], test)):
            if len(part) < SEQ_LEN + n:
                raise SystemExit(f"--text: {len(text)} usable characters are too few for {clients} clients of "
                                 f"{train} + {test} windows; give more text or fewer clients")
            starts = np.linspace(0, len(part) - SEQ_LEN - 1, n).astype(int)
            split[name][f"role-{k:02d}"] = {"x": [part[s:s + SEQ_LEN] for s in starts],
                                            "y": [part[s + SEQ_LEN] for s in starts]}
    for name, users in split.items():
        (out / name).mkdir(parents=True, exist_ok=True)
        (out / name / "all.json").write_text(json.dumps(
            {"users": list(users), "num_samples": [len(u["y"]) for u in users.values()], "user_data": users}))
    return out


def config(base: TrainConfig, case: Case, lambda_r: float, init_scale: float, seed: int, rounds: int,
           text_root: Path | None) -> TrainConfig:
    data = base.data
    if case.text:
        data = DataConfig(name="shakespeare", root=str(text_root), num_clients=base.data.num_clients,
                          partition="natural")
    args = {**base.algorithm.args, "prune_last": case.prune_last, "lambda_r": lambda_r, "init_scale": init_scale,
            "forward": "binary"}
    return base.replace(data=data, model=case.model, algorithm=AlgorithmConfig("fedmask", args),
                        training=replace(base.training, rounds=rounds),
                        run=replace(base.run, seed=seed, run_id=f"sweep-{case.model.name}-{lambda_r:g}-{seed}"))


def measure(cfg: TrainConfig) -> dict:
    """One run's figures: ``alive`` (no client collapsed at the last evaluation), the collapsed clients and the
    round the first of them was found, mean accuracy (local mask), mask density, seconds."""
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the collapse lines: summary.json's ``collapse`` says the same
        s = simulate(cfg).summary
    clients = s["collapse"]["clients"]
    return {"alive": not clients, "collapsed": len(clients), "clients": s["num_clients"],
            "first_round": min((c["round"] for c in clients.values()), default=None),
            "accuracy": s["mean_accuracy"], "density": s["mask_density"], "seconds": time.perf_counter() - t0}


def key(model: str, lambda_r: float, init_scale: float, seed: int) -> str:
    return f"{model}|{lambda_r:g}|{init_scale:g}|{seed}"


def cell(runs: list[dict]) -> str:
    acc = np.array([r["accuracy"] for r in runs])
    sd = acc.std(ddof=1) if len(acc) > 1 else 0.0
    dens = np.mean([r["density"] for r in runs])
    alive = sum(r["alive"] for r in runs)
    first = [r["first_round"] for r in runs if r["first_round"] is not None]
    when = f", from round {min(first)}" if first else ""
    return f"{alive}/{len(runs)} alive{when}; {acc.mean():.3f} ± {sd:.3f}; {dens:.3f}"


def safe_range(lambdas: list[float], runs: dict[float, list[dict]]) -> str:
    """The λ_R from the smallest up to the last one at which every seed stays alive, and the first that is not."""
    ok = [lam for lam in sorted(lambdas) if runs.get(lam)]
    safe = []
    for lam in ok:
        if not all(r["alive"] for r in runs[lam]):
            return (f"λ_R ≤ {safe[-1]:g}; collapses at {lam:g}" if safe
                    else f"none of those tried: collapses at {lam:g}")
        safe.append(lam)
    return f"every λ_R tried (≤ {safe[-1]:g})" if safe else "not run"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/digits-fedmask.toml")
    ap.add_argument("--models", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--lambdas", type=float, nargs="+", default=[0, 2e-5, 2e-4, 2e-3, 2e-2])
    ap.add_argument("--init-scale", type=float, nargs="+", default=[1.0], help="the restart scale s")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--rounds", type=int, default=None, help="default: the config's")
    ap.add_argument("--shakespeare", type=Path, default=None, help="LEAF's shakespeare data directory")
    ap.add_argument("--text", type=Path, nargs="+", default=None,
                    help="plain text for the LSTM's stand-in data when --shakespeare is not given (default: the "
                    "Language Reference topics every Python ships, pydoc_data.topics)")
    ap.add_argument("--text-samples", type=int, nargs=2, default=(200, 50), metavar=("TRAIN", "TEST"),
                    help="windows per client of the stand-in")
    ap.add_argument("--work", type=Path, default=Path("workspace/lambda_sweep"))
    ap.add_argument("--json", type=Path, default=None, help="every run's figures; runs already there are reused")
    args = ap.parse_args()
    torch.set_num_threads(1)
    base = TrainConfig.load(args.config)
    rounds = args.rounds or base.training.rounds
    text_root = args.shakespeare
    source = f"LEAF Shakespeare {text_root}" if text_root else "none (no text model among --models)"
    if text_root is None and any(CASES[m].text for m in args.models):
        where, text = read_texts(args.text)
        text_root = standin_shakespeare(text, args.work / "shakespeare", base.data.num_clients, *args.text_samples)
        source = f"a stand-in from {where}"
    done = json.loads(args.json.read_text()) if args.json and args.json.exists() else {}
    print(f"# {args.config} with the model swapped, {rounds} rounds, binary forward, seeds {args.seeds}; "
          f"LSTM data: {source}", flush=True)
    for m in args.models:
        for s in args.init_scale:
            for lam in args.lambdas:
                for seed in args.seeds:
                    k = key(m, lam, s, seed)
                    if k not in done:
                        done[k] = measure(config(base, CASES[m], lam, s, seed, rounds, text_root))
                        if args.json:
                            args.json.write_text(json.dumps(done, indent=1))
                    r = done[k]
                    print(f"{k:<36} alive {r['alive']!s:<5} collapsed {r['collapsed']}/{r['clients']} "
                          f"acc {r['accuracy']:.3f} density {r['density']:.3f} {r['seconds']:.0f} s", flush=True)
    print("\n| model | s | " + " | ".join(f"λ_R = {lam:g}" for lam in args.lambdas) + " | safe |")
    print("| --- | --- | " + " | ".join("---" for _ in args.lambdas) + " | --- |")
    for m in args.models:
        for s in args.init_scale:
            runs = {lam: [done[key(m, lam, s, seed)] for seed in args.seeds] for lam in args.lambdas}
            print(f"| {m} | {s:g} | " + " | ".join(cell(runs[lam]) for lam in args.lambdas)
                  + f" | {safe_range(args.lambdas, runs)} |")
    for m in args.models:
        print(f"# {m}: {CASES[m].note}")
    shown = [done[key(m, lam, s, seed)] for m in args.models for s in args.init_scale for lam in args.lambdas
             for seed in args.seeds]
    print(f"\n# cells: alive seeds; mean accuracy ± sd (local mask, final); mask density. {len(shown)} runs, "
          f"{sum(r['seconds'] for r in shown) / 60:.1f} min of run time", flush=True)


if __name__ == "__main__":
    main()
