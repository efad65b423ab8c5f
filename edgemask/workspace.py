"""Where runs, artifacts and results live inside a workspace (docs/contracts.md)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Workspace:
    root: Path

    @classmethod
    def at(cls, root: str | Path) -> "Workspace":
        return cls(Path(root).resolve())

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
