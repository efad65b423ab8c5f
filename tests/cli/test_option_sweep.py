"""Every option of every command, fed every kind of bad value that applies to it (issue #44).

The options are read from the parser itself (``build_parser()``), not from a list kept here: a new command or
option is swept the day it is added, and one that declares no :class:`~edgemask.cli.options.Value` fails
:func:`test_every_option_declares_what_it_takes`. Each option's ``Value.kind`` picks its bad values (:data:`BAD`):
negative, zero, NaN, ±inf, absurdly large, empty, malformed, a directory where a file is wanted, a missing file, a
link to nothing, the command's own input as its output and a link to that input. Each run of the real command line
(a subprocess) must end in exit 2, one line ``edgemask <command>: error: …`` naming the option or the value given,
no traceback, and every file of the workspace and of the inputs as before (logs and lock files aside).

The bad option comes first on the command line, before the valid rest (:data:`VALID`: a real FedMask run, its ONNX
artifacts, a results store, a training and a campaign config), so its refusal is the first thing the command says.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from test_bad_inputs import base  # noqa: F401 - the fixture: a FedMask run "fm", its ONNX artifacts, a store "c"
from test_cli_safety import train_toml, tree
from edgemask.cli.main import build_parser

REPO = Path(__file__).resolve().parents[2]
Env = dict[str, Path]  # "ws" (the workspace), "in" (the inputs' folder), and each input file's path
Bad = Callable[[Env, argparse.Action], list[tuple[str, str]]]  # -> [(label, value)]


def _const(*pairs: tuple[str, str]) -> Bad:
    return lambda env, action: list(pairs)


NUMBER = (("negative", "-1"), ("NaN", "nan"), ("inf", "inf"), ("-inf", "-inf"), ("overflow to inf", "1e400"),
          ("absurdly large", "1e30"), ("empty", ""), ("malformed", "12abc"))
NAMES = (("empty", ""), ("a path out", "../x"), ("a separator", "a/b"), ("a newline", "a\nb"),
         ("leading dot", ".x"), ("300 bytes", "x" * 300))


def _paths(kind: str) -> Bad:
    def bad(env: Env, action: argparse.Action) -> list[tuple[str, str]]:
        d = env["in"]
        common = [("empty", ""), ("a newline", str(d / "a\nb")), ("missing", str(d / "missing"))]
        if kind == "file":
            return [*common, ("a directory", str(d)), ("a link to nothing", str(env["dangling"]))]
        if kind == "dir":
            return [*common, ("a file", str(env["afile"]))]
        # an output: each input of its command, named directly or through a link, a directory, no folder
        outs = [("empty", ""), ("a directory", str(d)), ("no such folder", str(d / "nope" / "x.toml"))]
        for option in action.type.value.inputs:
            outs += [(f"its {option}", str(env[option])), (f"a link to its {option}", str(env[option + " link"]))]
        return outs

    return bad


BAD: dict[str, Bad] = {
    "seconds": _const(("zero", "0"), *NUMBER),
    "seconds0": _const(*NUMBER),  # 0 is valid (do not wait)
    "positive": _const(("zero", "0"), *NUMBER),
    "fraction": _const(("zero", "0"), ("negative", "-0.5"), ("above 1", "1.5"), ("a percentage", "95"),
                       ("NaN", "nan"), ("inf", "inf"), ("empty", ""), ("malformed", "0.9x")),
    "count": _const(("negative", "-1"), ("zero", "0"), ("a fraction", "1.5"), ("exponent", "1e3"),
                    ("absurdly large", "10000000000000"), ("empty", ""), ("malformed", "two")),
    "file": _paths("file"),
    "dir": _paths("dir"),
    "out": _paths("out"),
    "name": _const(*NAMES),
    "run": _const(("empty", ""), ("a newline", "a\nb"), ("unknown run", "no-such-run"), ("missing path", "../x"),
                  ("5000 bytes", "x" * 5000)),
    "names": _const(("empty", ""), ("unknown", "no-such-name"), ("only a comma", ","), ("an empty item", "a,,b"), ("twice", "onnx,onnx"),
                    ("a path out", "../x"), ("a newline", "a\nb")),
    "choice": _const(("empty", ""), ("unknown", "no-such-name"), ("a newline", "a\nb")),
    "text": _const(("empty", ""), ("a newline", "a\nb"), ("5000 bytes", "x" * 5000)),
    "url": _const(("empty", ""), ("no scheme", "download.pytorch.org/whl/cpu"), ("ftp", "ftp://host/x"),
                  ("no host", "https://"), ("a newline", "https://a\nb")),
    "workspace": lambda env, action: [("empty", ""), ("a file", str(env["afile"])),
                                      ("under a file", str(env["afile"] / "ws"))],
    "mix": _const(("empty", ""), ("no share", "local"), ("no board", "=1"), ("NaN", "local=nan"),
                  ("negative", "local=-1,b=2"), ("zero", "local=0,b=1"), ("inf", "local=inf"),
                  ("twice", "local=0.5,local=0.5"), ("not adding to 1", "local=0.3"), ("a path out", "../x=1")),
    "argparse-choices": lambda env, action: [("empty", ""), ("unknown", "no-such-name")],
}

# the valid rest of each command line: what each required option (and the devices' action) is given
VALID: dict[str, Callable[[Env], list[str]]] = {
    "demo": lambda env: [],
    "train": lambda env: ["--config", str(env["--config"])],
    "export": lambda env: ["--run", "fm", "--formats", "onnx"],
    "devices": lambda env: [],
    "profile": lambda env: ["--campaign", str(env["--campaign"])],
    "report": lambda env: ["--results", str(env["--results"])],
    "replay": lambda env: ["--run", "fm", "--trace", str(env["--trace"])],
    "budgets": lambda env: ["--config", str(env["--config"]), "--results", str(env["--results"]), "--mix", "local=1",
                            "--deadline", "1", "--out", str(env["in"] / "out.toml")],
}
DEVICES_ACTION = "list"  # the devices command's positional action, when another of its options is swept


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def swept(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The actions of a command that take a value (flags such as ``--verbose`` and ``--help`` take none)."""
    return [a for a in parser._actions if a.nargs != 0 and not isinstance(a, argparse._HelpAction)]


def kind_of(action: argparse.Action) -> str | None:
    if action.choices is not None and action.type is None:
        return "argparse-choices"
    value = getattr(action.type, "value", None)
    return None if value is None else value.kind


def test_every_option_declares_what_it_takes():
    """An option without a declared check would go unswept: none may exist, and each kind has bad values."""
    undeclared = [f"{cmd} {a.option_strings or a.dest}" for cmd, p in subcommands().items() for a in swept(p)
                  if kind_of(a) is None]
    assert not undeclared, f"options with no Value (cli/options.py): {undeclared}"
    kinds = {kind_of(a) for p in subcommands().values() for a in swept(p)}
    assert kinds <= set(BAD), kinds - set(BAD)
    assert set(VALID) == set(subcommands()), "a command with no valid rest in VALID"


def environment(root: Path, tmp: Path, cmd: str) -> Env:
    """A copy of the workspace ``root`` and the inputs each command's valid rest names, under ``tmp``."""
    ws, inputs = tmp / "ws", tmp / "in"
    shutil.copytree(root, ws)
    inputs.mkdir()
    env: Env = {"ws": ws, "in": inputs, "--results": ws / "results" / "c", "afile": inputs / "a-file.txt"}
    env["afile"].write_text("not what any option wants\n")
    if cmd == "budgets":  # PerFedMask's config, as budgets reads it
        env["--config"] = inputs / "p.toml"
        shutil.copyfile(REPO / "configs" / "digits-perfedmask.toml", env["--config"])
    else:
        env["--config"] = train_toml(inputs / "t.toml", "sweep")
    env["--campaign"] = inputs / "c.toml"
    env["--campaign"].write_text('[campaign]\nname = "c"\nformats = ["onnx"]\ndevices = ["local"]\n'
                                 '[[artifacts]]\nrun = "fm"\nclients = ["client-000"]\ndense = false\n')
    env["--trace"] = inputs / "trace"
    env["--trace"].mkdir()
    env["dangling"] = inputs / "dangling.toml"
    env["dangling"].symlink_to(inputs / "gone.toml")
    for option in ("--config", "--results"):
        link = inputs / f"link{option}"
        link.symlink_to(env[option])
        env[option + " link"] = link
    return env


def state(env: Env) -> dict[str, str]:
    """Every file of the workspace and the inputs (logs and lock files hold no data)."""
    files = {f"ws/{k}": v for k, v in tree(env["ws"]).items()}
    files |= {f"in/{k}": v for k, v in tree(env["in"]).items()}
    return {k: v for k, v in files.items() if "/logs/" not in k and not k.endswith(".lock")}


def command_line(cmd: str, action: argparse.Action, value: str, env: Env) -> list[str]:
    """The bad value first (``--opt=value``: a value that starts with '-' stays a value), then the valid rest."""
    if action.option_strings:
        head = [f"{action.option_strings[0]}={value}"]
        if cmd == "devices":
            head = [DEVICES_ACTION, *head]
    elif action.dest == "names":
        head = ["check", value]
    else:  # the devices' action itself
        head = [value]
    rest = VALID[cmd](env)
    if action.option_strings and action.option_strings[0] in rest:  # the swept option is not given twice
        at = rest.index(action.option_strings[0])
        rest = rest[:at] + rest[at + 2:]
    return [cmd, *head, *rest] if action.dest == "workspace" else [cmd, *head, "--workspace", str(env["ws"]), *rest]


def check_refusal(cmd: str, action: argparse.Action, label: str, value: str, env: Env) -> str | None:
    """Run one bad command line; return what is wrong with how it ended, or None."""
    argv = command_line(cmd, action, value, env)
    before = state(env)
    try:
        p = subprocess.run([sys.executable, "-m", "edgemask.cli", *argv], capture_output=True, text=True,
                           timeout=120, cwd=env["in"])
    except subprocess.TimeoutExpired:
        return "still running after 120 s: the value was accepted and work started"
    lines = [ln for ln in p.stderr.splitlines() if ln.strip() and not ln.startswith("other libraries' messages:")]
    if p.returncode == 0:
        return f"accepted (exit 0): {p.stdout[-200:]!r}"
    if "Traceback" in p.stderr:
        return f"traceback: {p.stderr[-400:]!r}"
    if len(lines) != 1 or not lines[0].startswith(f"edgemask {cmd}: error: "):
        return f"not one error line: {p.stderr[-400:]!r}"
    names = [*action.option_strings, action.dest] + ([value.splitlines()[0][:40]] if value.strip() else [])
    if not any(n and n in lines[0] for n in names):
        return f"the line names neither the option nor the value: {lines[0]!r}"
    if state(env) != before:
        changed = sorted(set(state(env).items()) ^ set(before.items()))
        return f"changed files: {changed[:3]}"
    return None


@pytest.mark.parametrize("cmd", sorted(VALID))
def test_every_option_refuses_every_bad_value(base, tmp_path, cmd, capsys):  # noqa: F811 - the fixture
    env = environment(base, tmp_path, cmd)
    parser = subcommands()[cmd]
    failures, summary, cases = [], [], 0
    for action in swept(parser):
        kind = kind_of(action)
        bad = BAD[kind](env, action)
        for label, value in bad:
            why = check_refusal(cmd, action, label, value, env)
            if why is not None:
                failures.append(f"{cmd} {(action.option_strings or [action.dest])[0]} = {label} ({value[:30]!r}): "
                                f"{why}")
        cases += len(bad)
        summary.append(f"{(action.option_strings or [action.dest])[0]} ({kind}: {', '.join(lb for lb, _ in bad)})")
    with capsys.disabled():
        print(f"\nedgemask {cmd}: swept {len(summary)} options with {cases} bad values: " + "; ".join(summary))
    assert not failures, "\n".join(failures)
