"""Where runs, artifacts and results live inside a workspace (docs/contracts.md)."""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from pathlib import Path

# The longest path component edgemask derives from a name is a client file's temporary,
# ``.<name>.safetensors.<8 random>.tmp`` (the name + 26 bytes); a run directory's is ``.<name>.<8 random>.partial``
# (+ 18). Linux's NAME_MAX is 255 bytes per component, so a 245-byte run id trained for minutes and then failed
# at its final write with ENAMETOOLONG (issue #27). 128 bytes leaves room for every derived name.
MAX_NAME_BYTES = 128


@dataclass(frozen=True)
class Workspace:
    root: Path

    @classmethod
    def at(cls, root: str | Path) -> "Workspace":
        """The workspace at ``root`` (created by the stages that write). A ``root`` that is a file, or lies under
        one, is refused here, before any stage starts its work (a training would otherwise fail at its end)."""
        path = Path(root).resolve()
        existing = next(p for p in (path, *path.parents) if p.exists())
        if not existing.is_dir():
            from edgemask.errors import ConfigError

            where = "is" if existing == path else f"lies under {existing}, which is"
            raise ConfigError(f"workspace {root} {where} a file, not a directory; pass --workspace a directory "
                              "(it is created if missing)")
        return cls(path)

    @property
    def runs(self) -> Path:
        return self.root / "runs"

    @property
    def artifacts(self) -> Path:
        return self.root / "artifacts"

    @property
    def results(self) -> Path:
        return self.root / "results"

    @property
    def inventory(self) -> Path:
        return self.root / "devices.toml"

    def run(self, run_id: str) -> Path:
        return self.runs / run_id

    def resolve_run(self, run: str) -> Path:
        """``--run`` may be a run id (looked up under runs/) or a path to a run directory."""
        p = Path(run)
        if p.is_dir() or p.is_absolute() or "/" in run:
            return p
        return self.run(run)


def check_name(name: object, what: str) -> str:
    """Return ``name`` if it is a plain name that may become one path component, else raise ConfigError.

    Run ids, client ids, campaign names, a manifest's ``file`` and a campaign's ``clients`` all become paths
    under the workspace; a name with a separator, ``..``, a leading dot or an absolute path would reach outside it,
    one longer than ``MAX_NAME_BYTES`` would fail at the last write, and a control character (a newline) would
    split one-line messages.
    ``what`` names the field and its file for the message (e.g. ``"run_id in train.toml"``).
    """
    from edgemask.errors import ConfigError  # errors imports nothing of ours; kept local for a light module

    if not isinstance(name, str) or not name:
        raise ConfigError(f"{what}: expected a non-empty name, got {name!r}")
    control = next((c for c in name if unicodedata.category(c) == "Cc"), None)
    if control is not None:  # a newline would split every one-line message and listing that shows the name
        raise ConfigError(f"{what}: {name!r} holds the control character {control!r}; "
                          "use letters, digits, '-', '_' or '.'")
    size = len(name.encode("utf-8", "surrogatepass"))
    if size > MAX_NAME_BYTES:
        raise ConfigError(f"{what}: {name[:40]!r}... is {size} bytes long; at most {MAX_NAME_BYTES} bytes "
                          "(the file names made from it must stay under the file system's 255): choose a shorter name")
    if (
        name in (".", "..")
        or name.startswith(".")
        or "/" in name
        or "\\" in name
        or "\0" in name
        or Path(name).is_absolute()
        or name != name.strip()
    ):
        raise ConfigError(
            f"{what}: {name!r} is not a plain name (no '/', '\\', '..', leading '.' or surrounding spaces); "
            "use letters, digits, '-', '_' or '.'"
        )
    return name
