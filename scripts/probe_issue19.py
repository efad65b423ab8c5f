"""Issue #19 probes for defects 1, 3 (export), 5 and 6: bad inputs through the real command line.

Each probe: rc != 0, exactly one 'error:' line, no traceback, the sentinel files unchanged, no temporaries left.
Run from the repository root: `OMP_NUM_THREADS=1 python scripts/probe_issue19.py` (as root for the full-disk
probes, which mount a 400 KiB tmpfs; without root they are left out). Prints one line per probe and the count.
"""
import hashlib
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PY = sys.executable
BASE = Path(tempfile.mkdtemp(prefix="probes-"))
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def cli(*args, **kw):
    return subprocess.run([PY, "-m", "cli", *map(str, args)], capture_output=True, text=True, env=ENV,
                          timeout=900, **kw)


def toml(path, run_id, algorithm="fedavg", args="", hidden=8):
    rid = json.dumps(run_id) if isinstance(run_id, str) else str(run_id)
    path.write_text(f"[run]\nrun_id = {rid}\n[data]\nnum_clients = 2\n[model]\nname = \"mlp\"\n"
                    f"args = {{hidden = [{hidden}]}}\n[algorithm]\nname = \"{algorithm}\"\n{args}\n"
                    "[training]\nrounds = 1\nbatch_size = 64\nlr = 100.0\n")
    return path


def snapshot(root):
    return {str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir")
            for p in sorted(root.rglob("*")) if not p.name.endswith(".lock")}


def leftovers(root):
    return [str(p) for p in root.rglob("*") if p.name.endswith((".partial", ".old", ".tmp"))]


# a base workspace: a finished FedMask run "fm" (2 clients), exported; a sentinel dir beside it
W = BASE / "W"
assert cli("train", "--workspace", W, "--config", toml(BASE / "fm.toml", "fm", "fedmask")).returncode == 0
assert cli("export", "--workspace", W, "--run", "fm", "--formats", "onnx").returncode == 0
(W / "x").mkdir()
(W / "x" / "precious").write_text("keep")
(BASE / "afile").write_text("file")
evil = BASE / "evil.pt"


class Payload:
    def __reduce__(self):
        return (os.system, (f"touch {BASE / 'PWNED'}",))


evil.write_bytes(pickle.dumps({"fc1.weight": Payload()}, protocol=4))
(BASE / "bad.safetensors").write_bytes(b"garbage")
results = []


def probe(name, args, setup=None, cleanup=None, root=W):
    if setup:
        setup()
    before = snapshot(root)
    p = cli(*args)
    after = snapshot(root)
    if cleanup:
        cleanup()
    errs = [ln for ln in p.stderr.splitlines() if "error:" in ln]
    ok = (p.returncode != 0 and len(errs) == 1 and "Traceback" not in p.stderr and before == after
          and not leftovers(root) and not (BASE / "PWNED").exists())
    results.append((name, ok))
    print(f"{'OK  ' if ok else 'FAIL'} rc={p.returncode} {name}: {errs[0] if errs else p.stderr[-300:]!r}"
          + ("" if before == after else f" CHANGED {set(before) ^ set(after)}"), flush=True)


T = lambda *a, **k: ("train", "--workspace", W, "--config", toml(BASE / "t.toml", *a, **k))  # noqa: E731
for rid in ["../x", str(W / "x"), "..", ".", ".hidden", "a/b", "", " x", "x\\y", 3, "../../../tmp/evil"]:
    probe(f"train run_id={rid!r}", T(rid))
probe("train --workspace a file", ("train", "--workspace", BASE / "afile", "--config", toml(BASE / "t.toml", "ok")))
probe("train --workspace under a file",
      ("train", "--workspace", BASE / "afile" / "w", "--config", toml(BASE / "t.toml", "ok")))
FS = 'args = {{init_weights = "{}"}}'
probe("fedselect init_weights pickle payload", T("fs", "fedselect", FS.format(evil)))
probe("fedselect init_weights garbage safetensors", T("fs", "fedselect", FS.format(BASE / "bad.safetensors")))
probe("fedselect init_weights missing", T("fs", "fedselect", FS.format(BASE / "nope.pt")))
(W / "runs" / "notarun").mkdir()
(W / "runs" / "notarun" / "notes").write_text("mine")
probe("train onto a dir that is not a run", T("notarun"))
os.symlink(W / "x", W / "runs" / "link")
probe("train onto a symlink to outside runs/", T("link"))

# the lock of a run held by another process
holder_code = ("import sys, time; from edgemask.fileio import exclusive_lock\n"
               "with exclusive_lock(sys.argv[1], 'h'):\n    print('held', flush=True); time.sleep(600)")


def hold(path):
    h = subprocess.Popen([PY, "-c", holder_code, str(path)], stdout=subprocess.PIPE, text=True, env=ENV)
    assert h.stdout.readline().strip() == "held"
    return h


h = hold(W / "runs" / ".fm.lock")
probe("train of a run id being trained", T("fm", "fedmask"))
h.kill(); h.wait()
h = hold(W / "artifacts" / ".fm.lock")
probe("export of a run being exported", ("export", "--workspace", W, "--run", "fm", "--formats", "onnx"))
h.kill(); h.wait()

E = lambda *a: ("export", "--workspace", W, "--run", *a)  # noqa: E731
for c in ["../x", "/etc", "client-000/../client-001", ".hidden", "nope"]:
    probe(f"export --clients {c!r}", E("fm", "--clients", c, "--formats", "onnx"))
probe("export --run missing", E("missing"))
probe("export --run .", E("."))
probe("export --run ..", E(".."))
probe("export --workspace a file", ("export", "--workspace", BASE / "afile", "--run", "fm"))
probe("export unknown format", E("fm", "--formats", "onnx,coreml"))

# damaged client files in a copy of the run
for case in ["nometa", "stray"]:
    rid = f"fm-{case}"
    shutil.copytree(W / "runs" / "fm", W / "runs" / rid)
    f = W / "runs" / rid / "clients" / "client-000.safetensors"
    code = ("from safetensors.numpy import load_file, save_file; import numpy as np, sys; a = load_file(sys.argv[1]); "
            + ("save_file(a, sys.argv[1])" if case == "nometa" else
               "a['evil'] = np.ones(3, np.float32); save_file(a, sys.argv[1], metadata={'mask_shapes': '{}'})"))
    subprocess.run([PY, "-c", code, str(f)], check=True, env=ENV)
    probe(f"export client file {case}", E(rid, "--formats", "onnx"))
# an artifact dir that export did not write
(W / "artifacts" / "fm-nometa").mkdir(parents=True, exist_ok=True)
shutil.copytree(W / "runs" / "fm", W / "runs" / "fm3")
(W / "artifacts" / "fm3" / "dense").mkdir(parents=True)
(W / "artifacts" / "fm3" / "dense" / "notes").write_text("mine")
probe("export onto a dir without manifest", E("fm3", "--formats", "onnx"))
shutil.rmtree(W / "artifacts" / "fm3" / "dense")
os.symlink(W / "x", W / "artifacts" / "fm3" / "dense")
probe("export onto a symlinked artifact dir", E("fm3", "--formats", "onnx", "--clients", "client-000"))
probe("profile --workspace a file", ("profile", "--workspace", BASE / "afile", "--campaign", BASE / "c.toml"))
probe("report --workspace a file", ("report", "--workspace", BASE / "afile", "--results", BASE / "r"))

# full disk: a 400 KiB tmpfs as the workspace, a finished run there first
D = BASE / "disk"
D.mkdir()
if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(D)]).returncode == 0:
    try:
        DW = D / "ws"
        assert cli("train", "--workspace", DW, "--config", toml(BASE / "d.toml", "r")).returncode == 0
        st = os.statvfs(D)
        (D / "filler").write_bytes(b"\0" * (st.f_bavail * st.f_frsize - 48 * 1024))
        probe("train on a full disk, same run id", ("train", "--workspace", DW, "--config",
                                                    toml(BASE / "d2.toml", "r", hidden=256)), root=D)
        probe("train on a full disk, new run id", ("train", "--workspace", DW, "--config",
                                                   toml(BASE / "d3.toml", "s", hidden=256)), root=D)
        probe_root_before = snapshot(DW / "runs")
        p = cli("export", "--workspace", DW, "--run", "r", "--formats", "onnx")
        errs = [ln for ln in p.stderr.splitlines() if "error:" in ln]
        ok = (p.returncode != 0 and len(errs) == 1 and "Traceback" not in p.stderr and not leftovers(D)
              and snapshot(DW / "runs") == probe_root_before)
        results.append(("export on a full disk", ok))
        print(f"{'OK  ' if ok else 'FAIL'} rc={p.returncode} export on a full disk: {errs}", flush=True)
        (D / "filler").unlink()
        st = os.statvfs(D)
        (D / "filler").write_bytes(b"\0" * (st.f_bavail * st.f_frsize))
        probe("train on a disk with no block left", ("train", "--workspace", DW, "--config",
                                                     toml(BASE / "d4.toml", "t")), root=D)
    finally:
        subprocess.run(["umount", str(D)])
print(f"\n{sum(ok for _, ok in results)} of {len(results)} probes refused cleanly "
      f"(one line, non-zero, nothing changed, no temporaries); workspace {BASE}")
