"""The command line: one mode per call, one JSON document on stdout (see the package's docstring); ``--help``, for a
person at the board, prints the usage instead and exits 0."""

import argparse
import json
import math
import os
import sys
import time
import traceback

from .benchmark import benchmark
from .clocks import jetson_clocks, set_governors
from .errors import RunFailed
from .lock import lock_held_by, take_lock
from .options import MEASUREMENT, TRAINING, flag
from .probe import probe
from .runtimes import RUNTIMES
from .session import find_strays, start_watchdog
from .trt import TRTEXEC, TRTEXEC_DEFAULT


def build_parser():
    p = argparse.ArgumentParser(prog="runner", description="edgemask remote runner: one JSON document on stdout")
    p.add_argument("--probe", action="store_true", help="describe this device and exit")
    p.add_argument("--model")
    p.add_argument("--format", choices=sorted(RUNTIMES))
    p.add_argument("--sample-io")
    p.add_argument("--train-io", help="a training format: the artifact's train_io.npz (the minibatch and the host's "
                   "step), checked and stepped on instead of --sample-io")
    p.add_argument("--round-steps", type=int, default=1, help="a training format: steps of one local round "
                   "(the manifest's steps_per_round; default 1)")
    for name, kind, default, what in MEASUREMENT + TRAINING:  # the measurement settings, declared once (options.py)
        if kind is bool:
            p.add_argument(flag(name), action="store_true", help=what)
        else:
            p.add_argument(flag(name), type=kind, default=default, help="%s (default %s)" % (what, default),
                           choices=("keep", "release") if name == "train_malloc" else None)
    p.add_argument("--power-sensor", default="auto", help="auto, none, or a sensor of the registry")
    p.add_argument("--watch-stdin", action="store_true", help="exit when stdin closes or the parent changes")
    p.add_argument("--strays", action="store_true", help="kill benchmark runners of this workdir and exit")
    p.add_argument("--lock", help="--strays: only if this board lock is held by --token (never another "
                   "campaign's runners)")
    p.add_argument("--token", help="--strays: the caller's board lock token")
    p.add_argument("--hold-lock", metavar="FILE", help="take this board lock, print the result, hold it until "
                   "stdin closes (with --watch-stdin)")
    p.add_argument("--holder", metavar="JSON", default="{}", help="--hold-lock: who holds it")
    p.add_argument("--set-governors", metavar="JSON", help='{"*": "performance"} or {"cpu0": "ondemand", ...}')
    p.add_argument("--jetson-clocks", choices=("store", "apply", "restore"))
    p.add_argument("--state-file", help="jetson_clocks --store/--restore file")
    p.add_argument("--profile-dir", help="keep the profiler's files (ETDump) here; default: a removed temp dir")
    p.add_argument("--trtexec", help="format trt: the board's trtexec (default %s, then PATH)" % TRTEXEC_DEFAULT)
    p.add_argument("--input-name", help="format trt: the ONNX input's name (trtexec --loadInputs)")
    p.add_argument("--engine-dir", help="format trt: the engine cache (default: trt-engines in the workdir)")
    return p


def _clean(obj):
    """NaN and infinities become null: the output is strict JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return dict((k, _clean(v)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def _hold_lock(args, out_fd):
    """--hold-lock: print the one JSON line at once, then (when taken) hold the lock until the session ends.

    The host keeps this process's stdin open for as long as its campaign runs; when the campaign ends, is killed
    or loses its link, stdin reaches EOF and the watchdog (--watch-stdin) exits this process, which drops the
    lock. Without --watch-stdin nothing would ever end it, so it is refused."""
    if not args.watch_stdin:
        result, fd = {"ok": False, "error": "--hold-lock needs --watch-stdin"}, None
    else:
        result, fd = take_lock(args.hold_lock, json.loads(args.holder))
    with os.fdopen(out_fd, "w") as out:
        out.write(json.dumps(_clean(result), sort_keys=True))
        out.write("\n")
    if fd is None:
        return 0 if result.get("busy") else 1
    while True:  # the watchdog ends the process
        time.sleep(60)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if "-h" in argv or "--help" in argv:
        sys.stdout.write(build_parser().format_help())
        return 0
    # Keep the real stdout for the one JSON document; whatever a runtime prints goes to stderr.
    out_fd = os.dup(1)
    sys.stdout.flush()
    os.dup2(2, 1)
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:
        result = {"ok": False, "error": "bad runner arguments (exit %s); see stderr" % e.code}
        args = None
    if args is not None:
        try:
            if args.watch_stdin:
                start_watchdog()
            TRTEXEC[0] = args.trtexec
            if args.probe:
                result = probe()
            elif args.hold_lock:
                return _hold_lock(args, out_fd)
            elif args.strays:
                why = lock_held_by(args.lock, args.token) if args.lock else None
                if why is not None:
                    raise RunFailed("%s: no runner killed" % why)
                result = {"ok": True, "found": find_strays()}
            elif args.set_governors:
                result = set_governors(json.loads(args.set_governors))
            elif args.jetson_clocks:
                if not args.state_file:
                    raise RunFailed("--jetson-clocks needs --state-file")
                result = jetson_clocks(args.jetson_clocks, args.state_file)
            else:
                inputs = ("model", "format", "train_io" if getattr(RUNTIMES.get(args.format), "training", False)
                                             else "sample_io")
                for name in inputs:
                    if getattr(args, name) is None:
                        raise RunFailed("--%s is required%s" % (name.replace("_", "-"), " for format %s" % args.format
                                                                if name == "train_io" else ""))
                for path in [getattr(args, name) for name in inputs if name != "format"]:
                    if not os.path.isfile(path):
                        raise RunFailed("no such file: %s" % path)
                result = benchmark(args)
        except RunFailed as e:
            result = {"ok": False, "error": str(e)}
        except Exception as e:  # the JSON must say what broke, whatever it was
            traceback.print_exc(file=sys.stderr)
            msg = " ".join(str(e).split()) or type(e).__name__
            result = {"ok": False, "error": "%s: %s" % (type(e).__name__, msg[:500])}
    sys.stdout.flush()
    with os.fdopen(out_fd, "w") as out:
        out.write(json.dumps(_clean(result), sort_keys=True))
        out.write("\n")
    return 0 if result.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
