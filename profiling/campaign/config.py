"""Read and check ``campaign.toml`` into a frozen :class:`~edgemask.profiling.records.CampaignConfig`.

Each setting is declared once: its name, type and default on the dataclass it fills (``CampaignConfig``,
``ArtifactSelection``, ``devices.records.RunnerSettings``), its limits here; the schema tables
(:mod:`edgemask.schema`: one wording for every mistake) are derived from the two. ``configs/campaign.example.toml``
shows every table with what each field means::

    [campaign]            # CampaignConfig: name, formats, variants, devices, threads, repetitions, timeout_s, …
    [[artifacts]]         # ArtifactSelection: run, clients ("all" or a list), dense
    [runner]              # any field of devices.records.RunnerSettings except threads (the campaign's own list)
    [training_runner]     # the same fields, for the jobs of a training format (pte-train, torch-train); its
                          # defaults are profiling.records.TRAINING_RUNNER's (a step is far slower than an inference)
"""

from __future__ import annotations

import dataclasses
import re
import typing
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from edgemask.devices.records import RunnerSettings
from edgemask.registry import Registry
from edgemask.schema import Field, Table, schema_of
from edgemask.targets import FORMAT_RUNTIME
from edgemask.tomlio import read_toml
from edgemask.workspace import check_name
from edgemask.profiling.records import TRAINING_RUNNER, ArtifactSelection, CampaignConfig

# Format name -> the runtime that runs it (docs/contracts.md): edgemask.targets' one map, as a registry so an unknown
# name in a campaign lists the valid ones.
FORMATS: Registry[str] = Registry("format")
for _fmt, _runtime in FORMAT_RUNTIME.items():
    FORMATS.add(_fmt, _runtime)

VARIANTS: Registry[str] = Registry("variant")
VARIANTS.add("fp32", "fp32")
VARIANTS.add("int8", "int8")

DENSE_CLIENT = "dense"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

# Upper bounds on the campaign's counts (issue #27: `repetitions = 10**12` allocated 5.7 GB of jobs and died with
# MemoryError before any work). Each is far above any real campaign (a setting measured 1000 times; 1024 runtime
# threads; a runner count of a million runs), and keeps the job list and the runner's sample arrays small.
MAX_REPETITIONS = 1000
MAX_THREADS = 1024
MAX_RETRIES = 100
MAX_RUNNER_COUNT = 1_000_000


def derive_schema(cls: type, limits: Mapping[str, Mapping[str, Any]], skip: Collection[str] = ()) -> dict[str, Field]:
    """The schema table of dataclass ``cls``: one :class:`Field` per field (but ``skip``), its kind and default
    from the dataclass (:func:`edgemask.schema.schema_of`), its limits (any other :class:`Field` argument,
    ``kind``/``default`` to read a field otherwise) from ``limits``. A name in ``limits`` that is no field of ``cls`` raises here, at import."""
    fields = {name: f for name, f in schema_of(cls).items() if name not in skip}
    stray = sorted(set(limits) - set(fields))
    if stray:
        raise TypeError(f"{cls.__name__} has no field {', '.join(stray)}")
    return {name: dataclasses.replace(f, **limits.get(name, {})) for name, f in fields.items()}


_TOP = {"campaign": Field(dict), "artifacts": Field(list, nonempty=True, what="[[artifacts]] table"),
        "runner": Field(dict, default={}), "training_runner": Field(dict, default={})}
_CAMPAIGN = derive_schema(CampaignConfig, skip=("artifacts", "runner", "training_runner"), limits={
    "formats": dict(choices=FORMATS, what="format", nonempty=True, unique=True),
    "variants": dict(choices=VARIANTS, what="variant", nonempty=True, unique=True),
    "devices": dict(what="device", nonempty=True, unique=True),
    "threads": dict(minimum=1, maximum=MAX_THREADS, what="thread count", nonempty=True, unique=True),
    "repetitions": dict(minimum=1, maximum=MAX_REPETITIONS),
    "timeout_s": dict(above=0),
    "cooldown_s": dict(minimum=0),
    "retries": dict(minimum=0, maximum=MAX_RETRIES),
    "retry_backoff_s": dict(minimum=0),
    "remeasure_unstable": dict(minimum=0, maximum=MAX_RETRIES),
    "sample_clients": dict(minimum=0),
})
# clients: "all" in the file, None in the record (every client the run exported)
_SELECTION = derive_schema(ArtifactSelection, limits={
    "clients": dict(kind=(str, list), default="all", what="client id", unique=True)})
# The runner's counts and times: none negative, counts bounded; at least one timed sample.
_RUNNER_LIMITS = {int: dict(minimum=0, maximum=MAX_RUNNER_COUNT), float: dict(minimum=0)}
_RUNNER_FIELD_LIMITS = {
    name: {**_RUNNER_LIMITS.get(kind, {}), **({"minimum": 1} if name == "min_runs" else {})}
    for name, kind in typing.get_type_hints(RunnerSettings).items() if name != "threads"}
_RUNNER = derive_schema(RunnerSettings, skip=("threads",), limits=_RUNNER_FIELD_LIMITS)
# [training_runner]: the same fields and limits, each default TRAINING_RUNNER's (profiling.records)
_TRAINING_RUNNER = derive_schema(RunnerSettings, skip=("threads",), limits={
    name: {**limits, "default": getattr(TRAINING_RUNNER, name)} for name, limits in _RUNNER_FIELD_LIMITS.items()})


def parse_campaign(data: Mapping[str, Any], source: str = "campaign.toml",
                   known_devices: Collection[str] | None = None) -> CampaignConfig:
    """Validate a parsed ``campaign.toml`` against its schema (:mod:`edgemask.schema`: one wording for every
    mistake). ``known_devices``: the inventory's names, checked when given."""
    top = Table(source, "", data, _TOP)
    schema = _CAMPAIGN if known_devices is None else {
        **_CAMPAIGN, "devices": dataclasses.replace(_CAMPAIGN["devices"], choices=sorted(known_devices))}
    camp = Table(source, "campaign", top["campaign"], schema)

    name = camp["name"]
    check_name(name, f"{source}: [campaign] name")
    if not _NAME_RE.match(name):
        raise camp.error("name", f"{name!r} is not a directory name", "use letters, digits, '.', '_' and '-'")
    selections = tuple(_selection(top, source, i, entry) for i, entry in enumerate(top["artifacts"]))
    runner = Table(source, "runner", top["runner"], _RUNNER)
    training = Table(source, "training_runner", top["training_runner"], _TRAINING_RUNNER)
    settings = {key: tuple(v) if isinstance(v := camp[key], list) else v for key in _CAMPAIGN}  # TOML list: tuple
    return CampaignConfig(**settings, artifacts=selections, runner=RunnerSettings(**runner.values()),
                          training_runner=dataclasses.replace(TRAINING_RUNNER, **training.values()))


def _selection(top: Table, source: str, i: int, entry: Any) -> ArtifactSelection:
    """One ``[[artifacts]]`` table -> its selection; names that become paths are checked."""
    if not isinstance(entry, dict):
        raise top.error("artifacts", f"holds {entry!r}", "write each selection as an [[artifacts]] table")
    sel = Table(source, f"artifacts[{i}]", entry, _SELECTION)
    run = sel["run"]
    check_name(run, f"{source}: [artifacts[{i}]] run")
    if not _NAME_RE.match(run):
        raise sel.error("run", f"{run!r} is not a run id", "use letters, digits, '.', '_' and '-'")
    clients_raw = sel["clients"]
    if isinstance(clients_raw, str):
        if clients_raw != "all":
            raise sel.error("clients", f"is {clients_raw!r}", 'write "all" or a list of client ids')
        clients = None
    else:  # [] = the dense baseline alone (e.g. FedAvg, whose clients all run it)
        clients = tuple(clients_raw)
        for client in clients:  # each becomes artifacts/<run>/<client>: "..", "/" would leave the run
            check_name(client, f"{source}: [artifacts[{i}]] clients")
        if DENSE_CLIENT in clients:
            raise sel.error("clients", 'lists "dense"', "remove it; dense = true measures the baseline")
    dense = sel["dense"]
    if clients == () and not dense:
        raise sel.error("clients", "is empty and dense = false: the selection measures nothing",
                        "name clients or set dense = true")
    return ArtifactSelection(run=run, clients=clients, dense=dense)


def load_campaign(path: str | Path, known_devices: Collection[str] | None = None) -> CampaignConfig:
    """Read and validate ``campaign.toml``; errors name the file and the field."""
    path = Path(path)
    data = read_toml(path, "no such campaign file")
    return parse_campaign(data, str(path), known_devices)
