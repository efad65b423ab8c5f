"""Installed size per runtime on a Raspberry Pi (aarch64, CPython 3.11), from the wheels `devices setup` installs.

    python benchmarks/bench_pi_install_size.py [WHEELS_DIR]

WHEELS_DIR (default: the test fleet's cache, tests/fleet/fetch-wheels.sh) holds the aarch64/cp311 wheels pip
installs on a Pi for every format. Per runtime, the requirements setup installs (devices.setup.packages_for a
Pi with all three runtimes; ExecuTorch as its runtime pieces) are followed through each wheel's METADATA
Requires-Dist, markers evaluated for Linux aarch64 / CPython 3.11, and the files inside the wheels are summed
(a wheel installs its files unpacked, so this is the installed size up to the .pyc files Python writes later).
Also printed: which CUDA libraries torch's own shared objects need (readelf -d), the reason a
`pip install --no-deps torch` cannot import.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import zipfile
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edgemask.devices.inventory import DeviceSpec  # noqa: E402
from edgemask.devices.setup import packages_for  # noqa: E402

ENV = {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "aarch64", "os_name": "posix",
       "python_version": "3.11", "python_full_version": "3.11.2", "implementation_name": "cpython",
       "platform_python_implementation": "CPython", "extra": ""}


def key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_wheels(folder: Path) -> dict[str, dict]:
    out = {}
    for whl in sorted(folder.glob("*.whl")):
        with zipfile.ZipFile(whl) as z:
            meta_name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            meta = Parser().parsestr(z.read(meta_name).decode())
            size = sum(i.file_size for i in z.infolist())
        reqs = []
        for r in meta.get_all("Requires-Dist") or []:
            req = Requirement(r)
            if req.marker is None or req.marker.evaluate(ENV):
                reqs.append(key(req.name))
        out[key(meta["Name"])] = {"file": whl.name, "bytes": size, "requires": reqs}
    return out


def closure(wheels: dict[str, dict], roots: list[str]) -> set[str]:
    seen, todo = set(), [key(r) for r in roots]
    while todo:
        k = todo.pop()
        if k in seen or k not in wheels:
            continue
        seen.add(k)
        todo.extend(wheels[k]["requires"])
    return seen


def main(argv: list[str]) -> int:
    folder = Path(argv[0]) if argv else next(Path("/var/cache/edgemask-fleet").glob("wheels-aarch64-cp311-*"))
    wheels = read_wheels(folder)
    pi = DeviceSpec(name="pi", kind="rpi4", host="h", user="u", runtimes=("onnxruntime", "tflite", "executorch"))
    pkgs = {p.runtime: p for p in packages_for(pi)}
    roots = {rt: [p.dist, *[re.split(r"[<>=!~ ]", d)[0] for d in p.deps]] for rt, p in pkgs.items()}
    rows = []
    union: set[str] = set()
    for rt in ("onnxruntime", "tflite", "executorch"):
        keys = closure(wheels, roots[rt] + ["numpy"])
        if rt == "executorch":  # executorch itself goes in with --no-deps: only the runtime pieces' closures
            keys = {"executorch"} | closure(wheels, [r for r in roots[rt] if key(r) != "executorch"] + ["numpy"])
        union |= keys
        cuda = {k for k in keys if k.startswith(("nvidia-", "cuda-", "triton"))}
        rows.append((rt, sum(wheels[k]["bytes"] for k in keys), sum(wheels[k]["bytes"] for k in cuda), len(keys)))
    no_deps = {"executorch", "torch", "numpy"} | closure(wheels, ["flatbuffers", "ruamel.yaml", "tabulate"])
    rows.append(("executorch, torch --no-deps", sum(wheels[k]["bytes"] for k in no_deps), 0, len(no_deps)))
    rows.append(("all three", sum(wheels[k]["bytes"] for k in union),
                 sum(wheels[k]["bytes"] for k in union if k.startswith(("nvidia-", "cuda-", "triton"))), len(union)))
    print(f"wheels: {folder}")
    print("| runtime (+ numpy and what it pulls in) | installed MB | of which CUDA/triton MB | distributions |")
    print("| --- | ---: | ---: | ---: |")
    for rt, total, cuda, n in rows:
        print(f"| {rt} | {total / 1e6:,.0f} | {cuda / 1e6:,.0f} | {n} |")
    torch = folder / wheels["torch"]["file"]
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(torch) as z:
        for lib in ("torch/lib/libtorch_cpu.so", "torch/lib/libtorch.so"):
            z.extract(lib, tmp)
            out = subprocess.run(["readelf", "-d", str(Path(tmp) / lib)], capture_output=True, text=True).stdout
            needed = re.findall(r"NEEDED\)\s+Shared library: \[([^\]]+)\]", out)
            cuda = [n for n in needed if re.search(r"cud|cupti|nccl|cublas|nvpl|torch_cuda", n)]
            print(f"{torch.name}: {lib} needs {', '.join(cuda) or 'no CUDA library'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
