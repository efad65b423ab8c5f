"""A quiet terminal: third-party output goes to <workspace>/logs, edgemask's own lines stay on the terminal."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Each road a library's noise takes, and two lines that are edgemask's own.
SCRIPT = textwrap.dedent("""
    import ctypes, logging, os, sys, warnings
    from pathlib import Path
    from edgemask.terminal import library_output, quiet_terminal

    with quiet_terminal(Path(sys.argv[1]), "probe", verbose=sys.argv[2] == "1") as log:
        os.write(2, b"native stderr noise\\n")                    # C/C++ writing to fd 2
        ctypes.CDLL(None).printf(b"native stdout noise, buffered\\n")  # C stdio to fd 1, flushed at exit
        logging.getLogger("somelib").warning("library log noise")  # a library's logger, no handler of its own
        warnings.warn_explicit("library warning noise", UserWarning, "/site-packages/somelib/x.py", 1)
        warnings.warn_explicit("no CUDA device: training on the CPU", UserWarning, sys.argv[3], 1)
        with library_output():
            ctypes.CDLL(None).printf(b"native stdout noise\\n")   # C stdio to fd 1, buffered
            print("python stdout noise")                          # litert-torch's rich progress
            print("python stderr noise", file=sys.stderr)         # ExecuTorch's C++ log via its bindings
        print("progress 1/1", file=sys.stderr)
        print("the summary table")
    print("log:", log.path)
""")

NOISE = ("native stderr noise", "native stdout noise, buffered", "library log noise", "library warning noise",
         "native stdout noise\n", "python stdout noise", "python stderr noise")


def _probe(tmp_path: Path, verbose: bool) -> tuple[subprocess.CompletedProcess, Path]:
    logs = tmp_path / "ws" / "logs"
    ours = str(ROOT / "trainer" / "simulation.py")
    p = subprocess.run([sys.executable, "-c", SCRIPT, str(logs), "1" if verbose else "0", ours], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return p, logs


def test_third_party_output_goes_to_the_log_and_edgemask_lines_stay(tmp_path):
    p, logs = _probe(tmp_path, verbose=False)
    assert p.stderr.splitlines() == ["edgemask: warning: no CUDA device: training on the CPU", "progress 1/1"]
    (log,) = logs.glob("probe-*.log")
    assert p.stdout.splitlines() == ["the summary table", f"log: {log}"]
    text = log.read_text()
    for line in NOISE:
        assert line in text
    assert "no CUDA device" not in text and "summary table" not in text


def test_a_warning_during_a_progress_bar_gets_a_line_of_its_own(tmp_path):
    # a bar drawn without a newline: the warning written after it would continue its line ("3/10 [..]edgemask: ...")
    script = textwrap.dedent("""
        import sys, warnings
        from pathlib import Path
        from tqdm import tqdm
        from edgemask.terminal import quiet_terminal

        with quiet_terminal(Path(sys.argv[1]), "probe"):
            with tqdm(total=10, desc="rounds", file=sys.stderr, mininterval=0) as bar:
                bar.update(3)
                warnings.warn_explicit("round 4: 2 client(s) collapsed", UserWarning, sys.argv[2], 1)
                bar.update(7)
    """)
    p = subprocess.run([sys.executable, "-c", script, str(tmp_path / "logs"), str(ROOT / "trainer" / "simulation.py")],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    (line,) = [s for s in p.stderr.split("\n") if "edgemask: warning:" in s]
    assert line.rsplit("\r", 1)[-1] == "edgemask: warning: round 4: 2 client(s) collapsed", repr(line)
    assert "rounds: 100%" in p.stderr.rsplit("edgemask: warning:", 1)[1]  # the bar is drawn again below it


def test_verbose_leaves_every_message_where_its_library_sends_it(tmp_path):
    p, logs = _probe(tmp_path, verbose=True)
    for line in NOISE:
        assert line in (p.stdout if line == "native stdout noise, buffered" else p.stderr)
    assert "the summary table" in p.stdout and "native stdout noise\n" not in p.stdout
    assert not logs.exists()


def test_nothing_foreign_leaves_no_log_and_no_directory(tmp_path):
    from edgemask.terminal import quiet_terminal

    with quiet_terminal(tmp_path / "ws" / "logs", "quiet") as log:
        print("edgemask's own line", file=sys.stderr)
    assert log.path is None and not (tmp_path / "ws").exists()


# What edgemask itself prints while training and exporting: tqdm bars, "wrote …", where the log went.
OWN_LINE = re.compile(r"^(train |export )[\w-]+:|^wrote |^other libraries' messages: |^edgemask: |^$")  # ours


@pytest.mark.slow
def test_train_and_export_print_no_third_party_line(tmp_path):
    """A real run: torchao's "Failed to load … _C_mxfp8", torch's `W1123 … _pytree` lines, ExecuTorch's cpuinfo
    lines and onnxruntime's quantization advice all land in the log, not on the terminal."""
    ws = tmp_path / "ws"
    cfg = tmp_path / "tiny.toml"
    text = (ROOT / "cli" / "configs" / "demo-fedmask.toml").read_text()
    cfg.write_text(re.sub(r"hidden = \[[^]]*\]", "hidden = [32, 16]", text))
    out = ""
    for args in (["train", "--config", str(cfg), "--rounds", "1"],
                 ["export", "--run", "demo-fedmask", "--clients", "client-000", "--formats", "onnx,pte", "--int8"]):
        p = subprocess.run([sys.executable, "-m", "edgemask.cli", *args, "--workspace", str(ws)], cwd=tmp_path,
                           capture_output=True, text=True, timeout=1200)
        assert p.returncode == 0, p.stderr[-3000:]
        out += p.stdout + p.stderr
    foreign = [ln for ln in re.split(r"[\r\n]", out) if not OWN_LINE.match(ln.strip())]
    assert foreign == []
    logged = "".join(f.read_text() for f in (ws / "logs").glob("export-*.log"))
    assert "Failed to load" in logged and "_pytree" in logged  # the noise was there, and went to the log
