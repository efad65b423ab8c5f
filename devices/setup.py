"""Provisioning (`edgemask devices setup NAME`): a virtual environment in the device's work directory with numpy
and the runtimes its kind supports, installed from the board's own package index or from wheels the host uploads.

What a kind gets (see docs/architecture.md, "What the boards can run"):

- jetson-tx2 (Python 3.6): numpy==1.19.5, onnxruntime==1.10.0 (pinned in ``edgemask.targets``); no TFLite for
  Python 3.6, no ExecuTorch (it needs Python >= 3.10).
- rpi4 (Python 3.11): numpy, onnxruntime, tflite-runtime (then numpy<2), ExecuTorch's runtime; with ExecuTorch
  wanted too, ai-edge-litert for TFLite.
- linux, local: numpy and whatever the inventory declares (onnxruntime, ai-edge-litert, executorch, torch).
- "torch" (format torch-train, a client's local training step) on a Pi or a generic Linux: torch==2.13.0, the
  release the host exports with; a TX2 has none for Python 3.6 (``targets.TX2_NO_TRAINING``).

tflite-runtime 2.14 needs numpy<2 and ExecuTorch needs numpy>=2, so a Pi that wants both gets ai-edge-litert,
which the runner also accepts.

ExecuTorch is installed as its runtime pieces, not with `pip install executorch`: the wheel's declared
dependencies are its export-time tools (coremltools==9.0, pandas, scikit-learn, hydra-core, ...), and
coremltools has no aarch64 wheel at all, so pip cannot resolve them on a Pi. Setup installs the wheel with
``--no-deps`` and, with their own dependencies, what `executorch.runtime` imports: the torch its
`_portable_lib` links against (the same release it was built with), flatbuffers, ruamel.yaml and tabulate.
PyPI's aarch64 torch 2.13.0 is a CUDA build: libtorch_cpu.so itself links libcudart.so.13, so pip also brings
the CUDA runtime wheels (about 2.8 GB in all) even to a board without a GPU. So on a Pi setup installs torch first,
alone, from PyTorch's own CPU-only wheel index (the device's ``torch_index``, default
https://download.pytorch.org/whl/cpu, or ``--torch-index``), and the rest from the board's index; a board that
cannot reach it takes ``--wheels DIR`` with the CPU wheels downloaded on the host. Setup is idempotent: what is
already importable at a fitting version is left alone, and a second call installs and uploads nothing. The runner
runs with the device's `python`; after setup that should be ``<workdir>/venv/bin/python`` (the result says so).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgemask.devices.connection import Connection, open_connection
from edgemask.devices.deploy import deploy_many, remote_path
from edgemask.devices.errors import DeviceError
from edgemask.devices.inventory import DeviceSpec
from edgemask.targets import TX2_TRTEXEC

VENV = "venv"
WHEELHOUSE = "wheelhouse"
GENERIC_KINDS = ("linux", "local")  # no fixed board profile: install what the inventory declares


@dataclass(frozen=True)
class Package:
    """One thing to install: a pip requirement and the module that proves it works."""

    runtime: str  # numpy | onnxruntime | tflite | executorch
    requirement: str  # "numpy<2", "onnxruntime==1.10.0", ...
    module: str  # imported on the device to check it
    # what ``module`` needs at run time, installed with their own dependencies; when given, ``requirement``
    # itself is installed with --no-deps (its declared dependencies cannot be installed on the board)
    deps: tuple[str, ...] = ()

    @property
    def dist(self) -> str:
        return re.split(r"[<>=!~ ]", self.requirement, maxsplit=1)[0]


def packages_for(spec: DeviceSpec) -> list[Package]:
    """What ``spec``'s kind needs for its declared runtimes, numpy first; runtimes its kind cannot run are left out
    (`unavailable_runtimes` says why)."""
    wanted = [rt for rt in spec.runtimes if rt in spec.profile.runtimes or spec.kind in GENERIC_KINDS]
    if spec.kind == "jetson-tx2":  # Python 3.6: the last wheels for it, pinned in its profile
        pins = spec.profile.requirements
        pkgs = [Package("numpy", pins["numpy"], "numpy")]
        if "onnxruntime" in wanted:
            pkgs.append(Package("onnxruntime", pins["onnxruntime"], "onnxruntime"))
        return pkgs
    # tflite-runtime (numpy<2) on a Pi unless ExecuTorch (numpy>=2) is wanted too: then ai-edge-litert
    tflite_runtime = spec.kind == "rpi4" and "executorch" not in wanted
    pkgs = [Package("numpy", "numpy<2" if tflite_runtime and "tflite" in wanted else "numpy", "numpy")]
    if "onnxruntime" in wanted:
        pkgs.append(Package("onnxruntime", "onnxruntime", "onnxruntime"))
    if "tflite" in wanted:
        pkgs.append(Package("tflite", "tflite-runtime", "tflite_runtime") if tflite_runtime
                    else Package("tflite", "ai-edge-litert", "ai_edge_litert"))
    if "executorch" in wanted:
        pkgs.append(EXECUTORCH)
    if "torch" in wanted:  # format torch-train (a client's local step); with ExecuTorch, the same torch
        pkgs.append(TORCH)
    return pkgs


# The runtime the host exports .pte files with (pyproject.toml), and what importing it needs (see the docstring)
EXECUTORCH = Package("executorch", "executorch==1.5.1", "executorch.runtime",
                     deps=("torch==2.13.0", "flatbuffers", "ruamel.yaml", "tabulate"))
# torch for the torch-train step: the release the host exports torch.export programs with (pyproject.toml)
TORCH = Package("torch", "torch==2.13.0", "torch")


def pip_installs(packages: list[Package]) -> list[list[str]]:
    """The pip install arguments that install ``packages``, in order: one list of requirements installed with
    their dependencies (the packages without ``deps``, then the ``deps`` of the others), then, if any, one
    ``["--no-deps", ...]`` list. E.g. [["numpy", "torch==2.13.0", ...], ["--no-deps", "executorch==1.5.1"]]."""
    with_deps = [p.requirement for p in packages if not p.deps]
    with_deps += [r for p in packages for r in p.deps]
    with_deps = list(dict.fromkeys(with_deps))  # torch once, whether ExecuTorch or torch-train asked for it
    no_deps = [p.requirement for p in packages if p.deps]
    return [with_deps] + ([["--no-deps", *no_deps]] if no_deps else [])


def install_commands(spec: DeviceSpec, packages: list[Package], from_wheels: bool = False) -> list[list[str]]:
    """The pip install arguments setup runs, in order: :func:`pip_installs`, except that on a Pi torch comes first
    and alone from ``spec.torch_index`` (PyTorch's CPU-only wheels; PyPI's aarch64 torch is the CUDA build).
    E.g. [["--index-url", "https://download.pytorch.org/whl/cpu", "torch==2.13.0"], ["numpy", ...],
    ["--no-deps", "executorch==1.5.1"]]. From uploaded wheels (``from_wheels``) the folder decides."""
    steps = pip_installs(packages)
    if spec.kind != "rpi4" or from_wheels:
        return steps
    torch = [r for r in steps[0] if re.split(r"[<>=!~ ]", r, maxsplit=1)[0] == "torch"]
    if not torch:
        return steps
    rest = [r for r in steps[0] if r not in torch]
    return [["--index-url", spec.torch_index, *torch]] + ([rest] if rest else []) + steps[1:]


def unavailable_runtimes(spec: DeviceSpec) -> dict[str, str]:
    """Runtimes the inventory declares that the board's kind has no build of, with the reason."""
    if spec.kind in GENERIC_KINDS:
        return {}  # any Linux: the inventory's runtimes are the user's word
    return {rt: f"a {spec.kind} has no {rt} build ({spec.profile.notes or spec.profile.os})"
            for rt in spec.runtimes if rt not in spec.profile.runtimes}


# -- versions: the few specifier forms used above ---------------------------------------------------------
def _release(version: str) -> tuple[int, ...]:
    nums = []
    for part in version.split("+")[0].split("."):
        m = re.match(r"\d+", part)
        if not m:
            break
        nums.append(int(m.group()))
    return tuple(nums)


def satisfies(version: str | None, requirement: str) -> bool:
    """Does an installed ``version`` meet ``requirement`` ("numpy", "numpy<2", "onnxruntime==1.10.0", ">=")?"""
    if not version:
        return False
    m = re.match(r"^[A-Za-z0-9_.-]+\s*(==|<=|>=|<|>)?\s*([0-9][0-9.]*)?$", requirement.strip())
    if not m or not m.group(1):
        return True
    have, want = _release(version), _release(m.group(2))
    n = max(len(have), len(want))
    have, want = have + (0,) * (n - len(have)), want + (0,) * (n - len(want))
    return {"==": have == want, "<=": have <= want, ">=": have >= want, "<": have < want,
            ">": have > want}[m.group(1)]


# -- on the device (Python 3.6 compatible snippets) --------------------------------------------------------
# args: MODULE DIST [MODULE DIST ...] -> {"versions": {dist: version or null}, "errors": {dist: reason}}
_VERSIONS = r"""
import importlib, json, sys
out, errors = {}, {}
for module, dist in zip(sys.argv[1::2], sys.argv[2::2]):
    try:
        mod = importlib.import_module(module)
    except Exception as e:  # a broken install counts as missing; say why
        out[dist] = None
        errors[dist] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")
        continue
    version = None
    try:
        from importlib import metadata
        version = metadata.version(dist)
    except Exception:
        top = sys.modules.get(module.split(".")[0])
        version = getattr(mod, "__version__", None) or getattr(top, "__version__", None) or "unknown"
    out[dist] = version
print(json.dumps({"versions": out, "errors": errors}))
"""

# args: WHEELHOUSE BLOB NAME [BLOB NAME ...]: the uploaded blobs under their wheel names (pip needs them)
_WHEELHOUSE = r"""
import json, os, sys
house = sys.argv[1]
if not os.path.isdir(house):
    os.makedirs(house)
for blob, name in zip(sys.argv[2::2], sys.argv[3::2]):
    dest = os.path.join(house, name)
    if os.path.lexists(dest):
        os.remove(dest)
    os.symlink(os.path.abspath(blob), dest)
print(json.dumps({"ok": True}))
"""


def _json(conn: Connection, spec: DeviceSpec, argv: list[str], what: str, timeout: float) -> dict[str, Any]:
    res = conn.run(argv, timeout=timeout)
    try:
        return json.loads(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise DeviceError(f"{spec.name}: {what} gave no answer (rc={res.rc}: {res.tail()})") from None


def venv_python(spec: DeviceSpec) -> str:
    return remote_path(spec, VENV, "bin", "python")


def installed_versions(conn: Connection, spec: DeviceSpec, python: str, packages: list[Package]
                       ) -> tuple[dict[str, str | None], dict[str, str]]:
    """{dist: version or None} of ``packages`` as ``python`` on the device imports them, and import errors."""
    args = [a for p in packages for a in (p.module, p.dist)]
    doc = _json(conn, spec, [python, "-c", _VERSIONS, *args], f"{python} (checking installed packages)", 600)
    return doc.get("versions", {}), doc.get("errors", {})


def _ensure_venv(conn: Connection, spec: DeviceSpec) -> tuple[str, str | None]:
    """Create <workdir>/venv unless it works already. Returns (venv python, how it was made or None)."""
    py = venv_python(spec)
    if conn.run([py, "-c", "import sys; print(sys.prefix)"], timeout=120).rc == 0:
        return py, None
    base = spec.python if spec.python != py else "python3"
    venv_dir = remote_path(spec, VENV)
    conn.run(["mkdir", "-p", spec.workdir], timeout=60)
    res = conn.run([base, "-m", "venv", venv_dir], timeout=900)
    how = "venv"
    if res.rc != 0:
        # Debian without python3-venv has no ensurepip: a pip-less venv that sees the system's packages, and the
        # system pip (python3-pip) run by the venv's python installs into the venv.
        conn.run(["rm", "-rf", venv_dir], timeout=120)
        res = conn.run([base, "-m", "venv", "--without-pip", "--system-site-packages", venv_dir], timeout=900)
        how = "venv --without-pip --system-site-packages"
        if res.rc != 0:
            raise DeviceError(f"{spec.name}: `{base} -m venv` failed ({res.tail()}); install the venv module on "
                              "the board (`sudo apt-get install python3-venv`) and run setup again")
    if conn.run([py, "-m", "pip", "--version"], timeout=300).rc != 0:
        raise DeviceError(f"{spec.name}: the new venv {venv_dir} has no pip; install pip on the board "
                          "(`sudo apt-get install python3-venv python3-pip`) and run setup again")
    return py, how


def _upload_wheels(conn: Connection, spec: DeviceSpec, py: str, wheels_dir: Path) -> str:
    """Deploy every wheel of ``wheels_dir`` (content-addressed: unchanged wheels are not sent again) and expose
    them under their own names in <workdir>/wheelhouse; returns that folder."""
    wheels = sorted(Path(wheels_dir).glob("*.whl"))
    if not wheels:
        raise DeviceError(f"{spec.name}: no .whl files in {wheels_dir}; download them for the board, e.g. "
                          "`pip download --only-binary=:all: --platform manylinux2014_aarch64 --python-version 3.11 "
                          f"-d {wheels_dir} numpy onnxruntime`")
    blobs = deploy_many(conn, spec, wheels)
    house = remote_path(spec, WHEELHOUSE)
    args = [a for blob, w in zip(blobs, wheels) for a in (blob, w.name)]
    _json(conn, spec, [py, "-c", _WHEELHOUSE, house, *args], "linking the uploaded wheels", 120)
    return house


def _pip_install(conn: Connection, spec: DeviceSpec, argv: list[str], reqs: list[str],
                 wheels_dir: Path | None) -> None:
    res = conn.run(argv, timeout=1800)
    if res.rc == 0:
        return
    index = reqs[1] if reqs[:1] == ["--index-url"] else None
    names = [r for r in reqs if not r.startswith("--") and r != index]
    where = (f"the wheels in {wheels_dir} (add the missing ones for this board's platform and Python)"
             if wheels_dir is not None else
             f"{index if index else 'the board' + chr(39) + 's package index'} (no network? download the wheels "
             f"on the host with `pip download {'--index-url ' + index + ' ' if index else ''}--only-binary=:all: "
             f"--platform manylinux_2_28_aarch64 --python-version X.Y -d WHEELS {' '.join(names)}` and run "
             f"`edgemask devices setup {spec.name} --wheels WHEELS`)")
    raise DeviceError(f"{spec.name}: pip could not install {', '.join(names)} from {where}: {res.tail()}")


def setup_device(spec: DeviceSpec, wheels_dir: Path | None = None, conn: Connection | None = None
                 ) -> dict[str, Any]:
    """Prepare ``spec`` over its connection; idempotent. Returns what was done:

    ``python`` (the venv's interpreter: use it as the device's `python`), ``venv_created`` (how, or None),
    ``installed`` (requirements installed now; [] on a second call), ``uploaded`` (files sent), ``versions``
    (after setup), ``unavailable`` (declared runtimes the kind cannot run, with why), ``source``.
    Raises DeviceError naming the host and the fix when the board cannot be reached or pip fails.
    """
    if spec.is_local:
        raise DeviceError(f"{spec.name}: a local device uses this machine's Python; install its runtimes with "
                          "`pip install -e .[test]` instead of `devices setup`")
    own = conn is None
    conn = conn or open_connection(spec)
    try:
        sent0 = conn.uploads
        packages = packages_for(spec)
        py, created = _ensure_venv(conn, spec)
        versions, _ = installed_versions(conn, spec, py, packages)
        todo = [p for p in packages if not satisfies(versions.get(p.dist), p.requirement)]
        source = None
        if todo:
            # --no-compile: byte-compiling numpy and the runtimes takes minutes on a slow board (or under
            # emulation); Python compiles what the runner imports on first use instead.
            pip = [py, "-m", "pip", "install", "--disable-pip-version-check", "--no-input", "--quiet", "--no-compile"]
            if wheels_dir is not None:
                house = _upload_wheels(conn, spec, py, Path(wheels_dir))
                pip, source = [*pip, "--no-index", "--find-links", house], f"uploaded wheels ({wheels_dir})"
            else:
                source = "the board's package index"
            for reqs in install_commands(spec, todo, from_wheels=wheels_dir is not None):
                _pip_install(conn, spec, [*pip, *reqs], reqs, wheels_dir)
            versions, errors = installed_versions(conn, spec, py, packages)
            still = [p.requirement for p in todo if not satisfies(versions.get(p.dist), p.requirement)]
            if still:
                raise DeviceError(f"{spec.name}: {', '.join(still)} installed but do not import on the board "
                                  f"({'; '.join(errors.values()) or 'wrong version'})")
        return {
            "device": spec.name, "python": py, "venv_created": created,
            "installed": [p.requirement for p in todo], "uploaded": conn.uploads - sent0,
            "versions": versions, "unavailable": unavailable_runtimes(spec), "source": source,
            "python_is_venv": spec.python == py,
        }
    finally:
        if own:
            conn.close()


def missing_items(spec: DeviceSpec, info: dict[str, Any]) -> list[dict[str, str]]:
    """From a probe (`devices.probe.probe`): what the device still lacks to run its declared runtimes, each with
    the command that fixes it. Empty when nothing is missing."""
    items: list[dict[str, str]] = []
    setup = f"edgemask devices setup {spec.name}"
    versions = dict(info.get("runtimes") or {})
    versions["numpy"] = info.get("numpy")
    for pkg in packages_for(spec):
        have = versions.get(pkg.runtime)
        have_version = have.split()[-1] if isinstance(have, str) and have else None
        if pkg.runtime == "tflite" and have:
            continue  # tflite_runtime or ai_edge_litert: either serves the runner
        if not satisfies(have_version, pkg.requirement):
            why = f"{pkg.runtime} {have_version} does not meet {pkg.requirement}" if have_version else \
                f"{pkg.runtime} is not importable by {info.get('python_executable') or spec.python}"
            pip = f"{spec.python} -m pip install '{pkg.requirement}'"
            items.append({"what": pkg.runtime, "why": why,
                          "fix": pip if spec.is_local else f"{setup} (or on the board: {pip})"})
    venv_py = venv_python(spec)
    if items and not spec.is_local and spec.python != venv_py:
        items.append({"what": "python", "why": f"the device's python is {spec.python}, not the venv setup makes",
                      "fix": f"{setup}, then set python = \"{venv_py}\" for [devices.{spec.name}] in devices.toml"})
    for rt, why in unavailable_runtimes(spec).items():
        items.append({"what": rt, "why": why, "fix": f"remove {rt!r} from runtimes of [devices.{spec.name}]"})
    trt = info.get("tensorrt") or {}
    if "tensorrt" in spec.runtimes and "tensorrt" not in unavailable_runtimes(spec) and not trt.get("trtexec_version"):
        items.append({"what": "tensorrt", "why": f"no working trtexec at {spec.trtexec or TX2_TRTEXEC} or on PATH",
                      "fix": "install TensorRT with JetPack (`sudo apt-get install nvidia-tensorrt`), or set "
                             f"trtexec = \"PATH\" for [devices.{spec.name}] in devices.toml"})
    return items
