"""The ``edgemask`` command line: parses arguments and calls the stages. No stage logic lives here.

Expected mistakes (bad input, missing files, unreachable hosts) are ``EdgemaskError``s: printed on one line,
exit status 2, no traceback. ``train`` exits 3 when every client's model has collapsed (:data:`COLLAPSED`).
"""

from __future__ import annotations

import argparse
import errno
import json
import sys
from dataclasses import replace
from pathlib import Path

from edgemask.cli.budgets import COST_MODELS
from edgemask.cli.progress import progress_printer
from edgemask.cli import options as opt
from edgemask.cli.options import OneLineParser, add as add_option
from edgemask.errors import EdgemaskError
from edgemask.fileio import disk_full
from edgemask.targets import (BOARDS, DEFAULT_EXPORT_FORMATS, DEMO_FORMATS, FORMATS as FORMAT_FACTS, TRAINING_FORMATS,
                              TX2_ONNXRUNTIME)
from edgemask.workspace import Workspace


COLLAPSED = 3  # `train`: every client's model collapsed at the last evaluation; the run directory is written
MAX_CPUS = 1024  # a count of CPUs or threads (the campaign's threads share this bound)
MAX_ROUNDS = 1_000_000  # a round count above this is a typo, not a study
MAX_KBPS = 1e9  # 1 Tbit/s: a bandwidth above this is a unit mistake
TRAINING = "edgemask.trainer.config:TrainingConfig"
ROUNDS = opt.setting(TRAINING, "rounds", "count", lambda w, t: opt.values.count(w, t, maximum=MAX_ROUNDS))
FORMAT_LIST = opt.name_list(FORMAT_FACTS, "format")


def _ws(args: argparse.Namespace) -> Workspace:
    return Workspace.at(args.workspace)


def cmd_train(args: argparse.Namespace) -> int:
    from edgemask.trainer.config import TrainConfig
    from edgemask.trainer.simulation import train

    cfg = TrainConfig.load(args.config)
    overrides = {k: v for k, v in (("rounds", args.rounds), ("device", args.device)) if v is not None}
    if args.engine == "flower" and (args.device is not None or args.sequential):
        raise EdgemaskError("--device and --sequential choose how this host trains; with --engine flower each "
                            "Flower client trains on its own CPU, one client per message")
    if args.sequential:
        overrides["batched"] = False
    if args.allow_collapse:
        overrides["allow_collapse"] = True
    if overrides:
        import dataclasses

        cfg = cfg.replace(training=dataclasses.replace(cfg.training, **overrides))
    ws = _ws(args)
    with progress_printer(f"train {cfg.run_id}") as progress:  # the bar ends its line before an error is printed
        if args.engine == "flower":
            from edgemask.trainer.flower import train_flower

            path = train_flower(cfg, ws.runs, args.flower_workers, progress, verbose=args.verbose)
        else:
            path = train(cfg, ws.runs, progress=progress, memory_check=not args.no_memory_check,
                         memory=lambda fp: print(f"edgemask: {fp.line()}", file=sys.stderr), source=str(args.config))
    summary = json.loads((path / "summary.json").read_text())
    print(f"wrote {path}  (mean personalized accuracy {summary['mean_accuracy']:.4f}, "
          f"{summary['bytes_up'] + summary['bytes_down']:,} bytes communicated)")
    collapse = summary.get("collapse") or {}
    if collapse.get("all_collapsed") and not cfg.training.allow_collapse:
        print(f"edgemask train: error: {_collapse_line(path, collapse)}", file=sys.stderr)
        return COLLAPSED
    return 0


def _collapse_line(path: Path, collapse: dict) -> str:
    """Why ``train`` exits :data:`COLLAPSED`: the run, what collapsed, what to change, and how to go on."""
    clients = collapse["clients"]
    cid = next(iter(clients))
    settings = ", ".join(f"{k} (now {v})" for k, v in collapse.get("settings", {}).items())
    change = f"change [algorithm.args] {settings} (docs/fedmask.md, \"Collapse\")" if settings else \
        "change the settings that kill its units"
    first = clients[cid]
    return (f"every client's model collapsed ({len(clients)} of {len(clients)}; e.g. {cid}, since round "
            f"{first['round']}: no live unit in {first['layers'][0]!r}, the same output for every input); "
            f"{path} is written for inspection; {change}, or pass --allow-collapse (training.allow_collapse = true) "
            f"to accept it")


def cmd_export(args: argparse.Namespace) -> int:
    from edgemask.manifest import load_manifest
    from edgemask.export import ExportSettings, export_run
    from edgemask.export.layers import kept_dead_notes

    ws = _ws(args)
    clients, formats = args.clients, args.formats
    settings = ExportSettings(device_profile=args.target, int8=args.int8)
    if args.jobs is None:
        from edgemask.export.parallel import default_jobs

        args.jobs = default_jobs()
    dirs = export_run(ws.resolve_run(args.run), ws.artifacts, clients, formats, progress=True, settings=settings,
                      wait_s=args.wait, etrecord=args.etrecord, workers=args.jobs)
    for d in dirs:
        print(f"wrote {d}")
        for line in kept_dead_notes(load_manifest(d).layers):  # why a layer's dead units stay (1× speedup)
            print(f"  {line}")
    return 0


def cmd_devices(args: argparse.Namespace) -> int:
    from edgemask.devices.inventory import load_inventory
    from edgemask.devices.probe import check_device, list_devices

    ws = _ws(args)
    inv_path = Path(args.inventory) if args.inventory else (ws.inventory if ws.inventory.exists() else None)
    inventory = load_inventory(inv_path, ws.root)
    if args.action == "list":
        for row in list_devices(inventory):
            print("  ".join(f"{k}={v}" for k, v in row.items()))
        return 0
    names = args.names or list(inventory)
    bad = [n for n in names if n not in inventory]
    if bad:
        raise EdgemaskError(f"unknown device {bad[0]!r}; valid names: {', '.join(sorted(inventory))}")
    if args.action == "setup":
        from edgemask.devices.setup import setup_device

        if not args.names:
            raise EdgemaskError("devices setup: name the device(s) to set up, e.g. `edgemask devices setup rpi4-a`")
        wheels = Path(args.wheels) if args.wheels else None
        for n in names:
            spec = inventory[n] if not args.torch_index else replace(inventory[n], torch_index=args.torch_index)
            result = setup_device(spec, wheels_dir=wheels)
            print(json.dumps(result, indent=2, default=str))
            if not result["python_is_venv"]:
                print(f"{n}: set python = \"{result['python']}\" for [devices.{n}] in the inventory so "
                      "the runner uses this environment")
        return 0
    status = 0
    for n in names:
        report = check_device(inventory[n], self_test=args.self_test)
        print(json.dumps({"device": n, **report}, indent=2, default=str))
        status |= 0 if report.get("reachable") else 1
    return status


def _waiting_note(every_s: float = 5.0):
    """Progress while a campaign waits for a board: the holder and the time left, every ``every_s`` seconds."""
    import time

    last = [-every_s]

    def note(message: str) -> None:
        if time.monotonic() - last[0] >= every_s:
            last[0] = time.monotonic()
            print(f"waiting for board {message}", file=sys.stderr, flush=True)

    return note


def cmd_profile(args: argparse.Namespace) -> int:
    from edgemask.devices.inventory import load_inventory
    from edgemask.profiling.campaign import load_campaign, run_campaign

    ws = _ws(args)
    inv_path = Path(args.inventory) if args.inventory else (ws.inventory if ws.inventory.exists() else None)
    inventory = load_inventory(inv_path, ws.root)
    cfg = load_campaign(args.campaign, known_devices=list(inventory))
    res = run_campaign(cfg, ws.root, inventory=inventory, progress=True, lock_wait_s=args.wait,
                       board_wait_s=args.wait, on_wait=_waiting_note())
    print(f"wrote {res.store_path}  ({len(res.recorded)} measured, {res.already_done} already there, "
          f"{len(res.failed)} failed, {len(res.skipped)} skipped)")
    for note in res.notes:
        print(f"  {note}")
    for f in res.failed:
        print(f"  {f.status}: {f.job.job_id}: {f.reason}")
    for device, why in res.aborted.items():
        print(f"  stopped: {device}: {why}")
    return 0 if res.complete else 1


def cmd_report(args: argparse.Namespace) -> int:
    from edgemask.profiling.report import write_report

    ws = _ws(args)
    html, md = write_report(Path(args.results), ws.root)
    print(f"wrote {html}\nwrote {md}")
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from edgemask.profiling.replay import ReplaySettings, replay_report

    settings = ReplaySettings(bandwidth_kbps=args.bandwidth, target=args.target, metric=args.metric,
                              measured_rounds=not args.assume_3x)
    print(replay_report(_ws(args).root, args.run, Path(args.trace), settings))
    return 0


def cmd_budgets(args: argparse.Namespace) -> int:
    from edgemask.cli.budgets import write_budgets

    out = Path(args.out)
    devices = write_budgets(Path(args.config), Path(args.results), args.mix, args.deadline, out,
                            args.format, args.threads, args.measured_run, args.run_id, args.allow_invalid,
                            workspace=_ws(args).root, cost_model=args.cost_model)
    for cid, d in devices.items():
        late = "" if d["meets_deadline"] else "  (misses the deadline even training nothing)"
        layers = f"  trains {','.join(d['layers']) or 'nothing'}" if "layers" in d else ""
        print(f"{cid}  {d['board']:<16} psi/d_w {d['fraction']:.3f}  {d['steps_per_round']} steps, predicted round "
              f"{d['predicted_round_s']:.2f} s{late}{layers}")
    print(f"wrote {out}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from edgemask.cli.demo import run_demo

    run_demo(_ws(args), rounds=args.rounds, formats=args.formats)
    return 0


# commands whose libraries bind logging handlers to stderr at import (torch): imported under the log
_PRELOAD = {"train": ("torch",), "export": ("torch",), "demo": ("torch",)}


def _quietly(args: argparse.Namespace) -> int:
    """Run the command with third-party output going to <workspace>/logs (edgemask/terminal.py); then say where
    it went, if anywhere."""
    from edgemask.terminal import quiet_terminal

    log = None
    try:
        with quiet_terminal(_ws(args).root / "logs", args.command, args.verbose,
                            _PRELOAD.get(args.command, ())) as log:
            return args.fn(args)
    finally:
        if log is not None and log.path is not None:
            print(f"other libraries' messages: {log.path} (--verbose shows them here)", file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="edgemask", description="Train personalized sparse models federatedly, "
                                "compact and export them, and profile them on edge devices.")
    p.add_argument("--version", action="version", version="edgemask 0.1.0")
    sub = p.add_subparsers(dest="command", required=True)

    def add(name: str, help_: str, fn) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help_, description=help_)
        add_option(sp, "--workspace", value=opt.WORKSPACE, default="workspace", help="workspace directory (default: "
                   "./workspace)")
        sp.add_argument("--verbose", action="store_true", help="show third-party libraries' warnings and log "
                        "lines (with --engine flower: Flower's and Ray's) on the terminal; by default they go to "
                        "<workspace>/logs/<command>-<time>.log")
        sp.set_defaults(fn=fn, parser=sp)
        return sp

    d = add("demo", "train FedAvg and FedMask on digits, export, profile on the local device, report", cmd_demo)
    add_option(d, "--rounds", value=ROUNDS, default=None, help="override the number of rounds")
    demo_formats = ",".join(DEMO_FORMATS)
    add_option(d, "--formats", value=FORMAT_LIST, default=list(DEMO_FORMATS),
               help=f"export formats (default: {demo_formats})")

    t = add("train", "simulate federated training from a TOML config; writes runs/<run-id>/", cmd_train)
    add_option(t, "--config", value=opt.INPUT_FILE, required=True, help="training config (TOML), e.g. "
               "configs/demo-fedmask.toml")
    add_option(t, "--rounds", value=ROUNDS, default=None, help="override training.rounds")
    t.add_argument("--no-memory-check", action="store_true", help="train even when the memory estimate printed "
                   "before the set-up exceeds what this host has available")
    add_option(t, "--device", value=opt.setting(TRAINING, "device", "text"), default=None, help="override training.device: 'cuda' trains the batched clients on "
                   "the GPU when one is present, 'cpu' otherwise")
    t.add_argument("--sequential", action="store_true", help="train the clients one after another (the reference "
                   "loop; training.batched = false) instead of a round's clients together")
    t.add_argument("--allow-collapse", action="store_true", help="exit 0 even when every client's model has "
                   "collapsed (a masked layer with no live unit; training.allow_collapse = true); by default such a "
                   "run is written and train exits 3")
    t.add_argument("--engine", choices=["local", "flower"], default="local", help="local: this process trains the "
                   "clients (default); flower: the same round loop with the clients' local training on Flower's "
                   "simulation engine (Ray; needs `pip install -e .[flower]`)")
    add_option(t, "--flower-workers", value=opt.count(MAX_CPUS), default=None, help="with --engine flower: Ray CPUs, i.e. clients "
                   "training at a time, one torch thread each (default: this host's CPUs, at most the clients)")

    e = add("export", "compact each client's model and write ONNX / ExecuTorch / TFLite artifacts", cmd_export)
    add_option(e, "--run", value=opt.RUN_REF, required=True, help="run id (under <workspace>/runs) or path to a run directory")
    add_option(e, "--clients", value=opt.name_list(None, "client", all_=True), default="all", help="'all' or a comma-separated list of client ids")
    add_option(e, "--formats", value=FORMAT_LIST, default=list(DEFAULT_EXPORT_FORMATS), help="comma-separated formats: " + ", ".join(
                   f"{f.name} ({f.title})" for f in FORMAT_FACTS.values()))
    tx2 = BOARDS["jetson-tx2"]
    add_option(e, "--target", value=opt.choice(BOARDS, "board kind"), default=None, help=f"device profile for format options (e.g. {tx2.kind}: ONNX "
                   f"opset ≤ {tx2.max_onnx_opset} for its onnxruntime {TX2_ONNXRUNTIME})")
    e.add_argument("--int8", action="store_true", help="also write int8 variants where the format has one")
    e.add_argument("--etrecord", action="store_true", help="with pte: also write the ExecuTorch ETRecord (the "
                   "Inspector maps a device's ETDump events to modules with it; a second lowering per model)")
    add_option(e, "--jobs", value=opt.count(MAX_CPUS), default=None, metavar="N", help="export N clients at a time, each in its "
                   "own process (default: this machine's cores; 1: one after another)")
    add_option(e, "--wait", value=opt.seconds(zero=True), default=0.0, metavar="SECONDS", help="if another export of this run, or "
                   "a training of its run id, is running, wait up to this long for it (default: 0, leave at once "
                   "saying so)")

    dv = add("devices", "list the inventory, check devices over their connection, or set them up "
             "(a venv with numpy and the runtimes their kind supports)", cmd_devices)
    dv.add_argument("action", choices=["list", "check", "setup"])
    add_option(dv, "names", value=opt.NAME, nargs="*", help="devices to check (default: all) or to set up")
    add_option(dv, "--inventory", value=opt.INPUT_FILE, default=None, help="devices.toml (default: <workspace>/devices.toml)")
    add_option(dv, "--wheels", value=opt.INPUT_DIR, default=None, help="setup: install from the wheels in this folder, uploaded to "
                    "the board (for boards without a package index)")
    add_option(dv, "--torch-index", value=opt.URL, default=None, help="setup on a Pi: the index torch comes from (default: the "
                    "device's torch_index, PyTorch's CPU-only wheels https://download.pytorch.org/whl/cpu)")
    dv.add_argument("--self-test", action="store_true", help="check: on a board with TensorRT, build, check and "
                    "time a tiny engine end to end (format trt)")

    pr = add("profile", "run a profiling campaign; results go to results/<campaign>/", cmd_profile)
    add_option(pr, "--campaign", value=opt.INPUT_FILE, required=True, help="campaign.toml")
    add_option(pr, "--inventory", value=opt.INPUT_FILE, default=None, help="devices.toml (default: "
               "<workspace>/devices.toml)")
    add_option(pr, "--wait", value=opt.seconds(zero=True), default=0.0, metavar="SECONDS", help="if another campaign holds a "
                    "board (or this campaign), wait up to this long for it (default: 0, leave at once naming "
                    "the holder)")

    r = add("report", "write report.html and summary.md for a campaign's results", cmd_report)
    add_option(r, "--results", value=opt.INPUT_DIR, required=True, help="results/<campaign> directory")

    rp = add("replay", "replay runs' histories under a device trace's measured costs (FedScale's cost model): "
             "time and device energy to a target accuracy", cmd_replay)
    add_option(rp, "--run", value=opt.NAME, action="append", required=True, help="run id under <workspace>/runs (repeat to "
                    "compare runs, e.g. --run demo-fedavg --run demo-fedmask)")
    add_option(rp, "--trace", value=opt.INPUT_DIR, required=True, help="a trace directory `edgemask report` wrote, e.g. "
                    "results/demo/traces/local-onnx-fp32-t1")
    add_option(rp, "--bandwidth", value=opt.positive(MAX_KBPS, "kbit/s"), default=None, metavar="KBPS", help="client bandwidth in kbit/s "
                    "(default: the trace's, assumed when it was written: 10000)")
    add_option(rp, "--target", value=opt.FRACTION, default=None, help="target mean personalized accuracy, a "
               "fraction in (0, 1] (default: "
                    "the highest every replayed run reaches)")
    add_option(rp, "--metric", value=opt.TEXT, default="mean_accuracy", help="the server-side history metric the target applies "
                    "to (default: mean_accuracy, the clients' mean personalized accuracy)")
    rp.add_argument("--assume-3x", action="store_true", help="ignore the trace's measured local rounds: every "
                    "client's training costs FedScale's 3 x batch-1 inference per sample (default: a client's "
                    "measured local round where the campaign measured a training format)")
    bg = add("budgets", "PerFedMask's budgets psi_n from measured training steps: each simulated device a board "
             "of a measured mix, psi_n the largest trainable part whose local round meets a deadline", cmd_budgets)
    add_option(bg, "--config", value=opt.INPUT_FILE, required=True, help="the PerFedMask training config, e.g. configs/digits-perfedmask.toml")
    add_option(bg, "--results", value=opt.INPUT_DIR, required=True, help="a campaign's results directory holding the training rows of "
                    "a PerFedMask run's clients, e.g. workspace/results/budgets")
    add_option(bg, "--mix", value=opt.MIX, required=True, help="boards (campaign device names) and their shares of the devices, "
                    "e.g. local=0.3,pi-standin=0.7")
    add_option(bg, "--deadline", value=opt.seconds(), required=True, metavar="SECONDS", help="a local round's deadline")
    add_option(bg, "--out", value=opt.output_file("--config", "--results"), required=True, help="the training config to write (budgets and budget_source set)")
    add_option(bg, "--format", value=opt.choice(TRAINING_FORMATS, "training format"), default="torch-train",
               help="the training format whose steps set the cost "
                    "(default: torch-train)")
    add_option(bg, "--threads", value=opt.count(MAX_CPUS), default=1, help="the runtime threads of the rows used (default: 1)")
    add_option(bg, "--measured-run", value=opt.NAME, default=None, help="the run whose clients were measured (default: the "
                    "config's run id)")
    add_option(bg, "--run-id", value=opt.NAME, default=None, help="run id of the written config (default: <run id>-measured)")
    add_option(bg, "--cost-model", value=opt.choice(COST_MODELS, "cost model"), default="line",
               help="a board's step cost: line (a line in the trained fraction f; needs timed steps only) or layers "
                    "(per layer, which layers train and where the gradient flows; needs profiled steps, "
                    "[training_runner] profile_layers = true); default: line (docs/fedmask.md)")
    bg.add_argument("--allow-invalid", action="store_true", help="fit INVALID rows too (e.g. a stand-in's noisy "
                    "steps); the written budget_source names the boards whose fit rests on them")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    opt.check_inputs(args.parser, args)
    try:
        return _quietly(args)
    except EdgemaskError as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(f"edgemask {args.command}: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"edgemask {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a full disk or an unwritable workspace is the host's state, not a bug: one line too
        reason = _environment_failure(e, args.workspace)
        if reason is None:
            raise
        print(f"edgemask {args.command}: error: {reason}", file=sys.stderr)
        return 2


def _environment_failure(e: BaseException, workspace: str) -> str | None:
    """The one line for an error the host's state caused (disk full, no permission), else None (a bug: traceback).

    The disk-full cause is searched through the whole chain: SQLite's ROLLBACK after a failed COMMIT, or a
    writer's own exception, hides the OS's "No space left on device"."""
    full = disk_full(e)
    if full is not None:
        return f"the disk is full ({full}); free space in {workspace} or pass another --workspace, then run again"
    if isinstance(e, OSError) and e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"cannot write {e.filename or 'in the workspace'}: {e.strerror}; pass a --workspace you can write to"
    return None


if __name__ == "__main__":
    sys.exit(main())
