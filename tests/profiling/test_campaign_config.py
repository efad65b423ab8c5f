"""campaign.toml validation and job planning."""

import tomllib

import pytest

import profiling_fakes as pf
from edgemask.errors import ConfigError
from edgemask.profiling.campaign import Job, load_campaign, parse_campaign, plan_campaign, plan_jobs


def _load(tmp_path, text, known=None):
    p = tmp_path / "campaign.toml"
    p.write_text(text)
    return load_campaign(p, known)


def test_loads_every_field(tmp_path):
    cfg = _load(tmp_path, pf.campaign_toml(threads=(1, 4), repetitions=3, cooldown_s=1.5))
    assert cfg.name == "camp" and cfg.formats == ("onnx", "pte") and cfg.variants == ("fp32",)
    assert cfg.devices == ("dev-a", "dev-b") and cfg.threads == (1, 4) and cfg.repetitions == 3
    assert cfg.cooldown_s == 1.5 and cfg.timeout_s == 30.0 and cfg.retries == 2
    assert cfg.runner.min_runs == 5 and cfg.runner.min_seconds == 0.01 and cfg.runner.warmup_runs == 1
    sel = cfg.artifacts[0]
    assert sel.run == "run-a" and sel.clients is None and sel.dense is True


@pytest.mark.parametrize("edit, words", [
    (('formats = ["onnx", "pte"]', 'formats = ["onnx", "tfjs"]'),
     ["[campaign] formats: unknown format 'tfjs'; valid names: onnx, pte, pte-train, tflite, torch-train, trt"]),
    (('[campaign]', '[campaign]\nvariants = ["fp16"]'),
     ["[campaign] variants: unknown variant 'fp16'; valid names: fp32, int8"]),
    (('repetitions = 2', 'repetitions = 0'), ["[campaign] repetitions: 0 is out of range; use a value between 1 and 1000"]),
    (('repetitions = 2', 'repetitions = "two"'),
     ["[campaign] repetitions: must be an integer, not 'two'; write a whole number"]),
    (('threads = [1]', 'threads = [0]'), ["[campaign] threads: 0 is out of range; use a value between 1 and 1024"]),
    (('name = "camp"', 'name = "../evil"'), ["[campaign] name: '../evil' is not a plain name"]),
    (('min_runs = 5', 'min_runz = 5'),
     ["[runner] min_runz: unknown field; did you mean 'min_runs'? valid fields: idle_seconds,"]),
    (('clients = "all"', 'clients = "some"'),
     ["[artifacts[0]] clients: is 'some'; write \"all\" or a list of client ids"]),
    (('run = "run-a"\n', ''), ["[artifacts[0]] run: missing field; add run = … (a string)"]),
    (('retries = 2', 'retries = true'), ["[campaign] retries: must be an integer, not True; write a whole number"]),
    # a client id becomes artifacts/<run>/<client>: the old code accepted these and read outside the run
    (('clients = "all"', 'clients = ["../other-run/client-000"]'),
     ["[artifacts[0]] clients: '../other-run/client-000' is not a plain name"]),
    (('clients = "all"', 'clients = [".."]'), ["[artifacts[0]] clients: '..' is not a plain name"]),
    (('clients = "all"', 'clients = ["/etc"]'), ["[artifacts[0]] clients: '/etc' is not a plain name"]),
    (('name = "camp"', 'name = ".."'), ["[campaign] name: '..' is not a plain name"]),
])
def test_errors_name_file_and_field(tmp_path, edit, words):
    text = pf.campaign_toml().replace(*edit)
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, text)
    msg = str(err.value)
    assert msg.startswith(f"{tmp_path / 'campaign.toml'}: ")  # one wording: <file>: [table] field: wrong; todo
    for w in words:
        assert w in msg, msg


def test_unknown_device_lists_the_inventory(tmp_path):
    with pytest.raises(ConfigError, match=r"'dev-b'; valid names: dev-a, local"):
        _load(tmp_path, pf.campaign_toml(), known=["local", "dev-a"])


def test_plan_expands_the_product_with_stable_unique_ids(tmp_path):
    ws = pf.small_workspace(tmp_path, clients=("client-000", "client-001"))
    cfg = parse_campaign(tomllib.loads(pf.campaign_toml(threads=(1, 2), repetitions=3)))
    jobs = plan_jobs(cfg, ws)
    # 3 artifacts (dense + 2 clients) × 2 formats × 1 variant × 2 devices × 2 threads × 3 reps
    assert len(jobs) == 3 * 2 * 2 * 2 * 3
    assert len({j.job_id for j in jobs}) == len(jobs)
    assert Job("run-a/dense", "onnx", "fp32", "dev-a", 2, 1).job_id == "run-a/dense|onnx|fp32|dev-a|t2|r1"
    assert plan_jobs(cfg, ws) == jobs  # the same plan twice: resume depends on it
    # repetition outermost on each device: every artifact is measured once before any is measured twice
    dev_a = [j for j in jobs if j.device == "dev-a"]
    assert [j.repetition for j in dev_a[:12]] == [0] * 12


def test_plan_skips_formats_the_manifest_lacks_and_says_why(tmp_path):
    pf.write_manifest(tmp_path, "run-a", "dense", kind="dense", formats=(("onnx", "fp32"), ("pte", "fp32")))
    pf.write_manifest(tmp_path, "run-a", "client-000", kind="compacted", formats=(("onnx", "fp32"),))
    cfg = parse_campaign(tomllib.loads(pf.campaign_toml(devices=("dev-a",), repetitions=1)))
    plan = plan_campaign(cfg, tmp_path)
    assert {(j.artifact, j.format) for j in plan.jobs} == {
        ("run-a/dense", "onnx"), ("run-a/dense", "pte"), ("run-a/client-000", "onnx")}
    [skip] = plan.skipped
    assert (skip.artifact, skip.format, skip.device) == ("run-a/client-000", "pte", "dev-a")
    assert "no pte/fp32 file" in skip.reason and "onnx/fp32" in skip.reason


def test_plan_skips_formats_a_device_cannot_run(tmp_path):
    ws = pf.small_workspace(tmp_path, clients=("client-000",))
    cfg = parse_campaign(tomllib.loads(pf.campaign_toml(repetitions=1)))
    inv = {"dev-a": pf.FakeSpec("dev-a", ("onnxruntime",)), "dev-b": pf.FakeSpec("dev-b", ())}
    plan = plan_campaign(cfg, ws, inv)
    assert {j.format for j in plan.jobs if j.device == "dev-a"} == {"onnx"}
    assert {j.format for j in plan.jobs if j.device == "dev-b"} == {"onnx", "pte"}  # () = not declared
    assert all("no executorch runtime" in s.reason for s in plan.skipped) and len(plan.skipped) == 2


def test_missing_dense_baseline_is_an_error(tmp_path):
    pf.write_manifest(tmp_path, "run-a", "client-000", kind="compacted")
    cfg = parse_campaign(tomllib.loads(pf.campaign_toml()))
    with pytest.raises(ConfigError, match="no dense baseline"):
        plan_jobs(cfg, tmp_path)


def test_explicit_client_list(tmp_path):
    ws = pf.small_workspace(tmp_path, clients=("client-000", "client-001", "client-002"))
    text = pf.campaign_toml(devices=("dev-a",), repetitions=1).replace(
        'clients = "all"', 'clients = ["client-002"]').replace("dense = true", "dense = false")
    jobs = plan_jobs(parse_campaign(tomllib.loads(text)), ws)
    assert {j.artifact for j in jobs} == {"run-a/client-002"}
    bad = text.replace('["client-002"]', '["client-009"]')
    with pytest.raises(ConfigError, match="client-009"):
        plan_jobs(parse_campaign(tomllib.loads(bad)), ws)


def test_a_killed_exports_temporary_folder_is_not_a_client(tmp_path):
    ws = pf.small_workspace(tmp_path, clients=("client-000",))
    # what a kill -9 during export leaves: export's own temporary folder, manifest and all
    pf.write_manifest(ws, "run-a", ".client-001.x7k2.partial", kind="compacted")
    cfg = parse_campaign(tomllib.loads(pf.campaign_toml(devices=("dev-a",), repetitions=1)))
    assert {j.artifact for j in plan_jobs(cfg, ws)} == {"run-a/dense", "run-a/client-000"}


def test_trt_jobs_read_the_onnx_file_on_boards_with_tensorrt(tmp_path):
    # the board builds the TensorRT engine from the artifact's ONNX: an artifact with an onnx file has trt jobs
    pf.write_manifest(tmp_path, "run-a", "dense", kind="dense", formats=(("onnx", "fp32"),))
    pf.write_manifest(tmp_path, "run-a", "client-000", kind="compacted", formats=(("pte", "fp32"),))
    cfg = parse_campaign(tomllib.loads(pf.campaign_toml(devices=("tx2", "pi"), formats=("onnx", "trt"),
                                                        repetitions=1)))
    inv = {"tx2": pf.FakeSpec("tx2", ("onnxruntime", "tensorrt")), "pi": pf.FakeSpec("pi", ("onnxruntime",))}
    plan = plan_campaign(cfg, tmp_path, inv)
    assert {(j.artifact, j.device, j.format) for j in plan.jobs} == {
        ("run-a/dense", "tx2", "onnx"), ("run-a/dense", "tx2", "trt"), ("run-a/dense", "pi", "onnx")}
    reasons = {(s.artifact, s.device, s.format): s.reason for s in plan.skipped}
    assert "no tensorrt runtime" in reasons[("run-a/dense", "pi", "trt")]
    assert "no onnx/fp32 file" in reasons[("run-a/client-000", "tx2", "trt")]  # no ONNX: no engine to build


def test_the_schema_is_derived_from_the_dataclasses():
    """One declaration per setting: the file's fields, kinds and defaults are the dataclasses' (issue #31 item 4)."""
    import dataclasses

    from edgemask.devices.records import RunnerSettings
    from edgemask.schema import REQUIRED
    from edgemask.profiling.campaign.config import _CAMPAIGN, _RUNNER, derive_schema
    from edgemask.profiling.records import CampaignConfig

    @dataclasses.dataclass(frozen=True)
    class S:
        need: int
        rate: float = 0  # an int default, a float field: the annotation decides, never the default's type
        sizes: tuple[int, ...] = (1, 2)
        host: str | None = None

    s = derive_schema(S, {"rate": {"minimum": 0}})
    assert [(k, f.kind, f.default, f.items, f.minimum) for k, f in s.items()] == [
        ("need", int, REQUIRED, None, None), ("rate", float, 0, None, 0), ("sizes", list, (1, 2), int, None),
        ("host", str, None, None, None)]
    with pytest.raises(TypeError, match="S has no field speed"):
        derive_schema(S, {"speed": {"minimum": 0}})
    # every RunnerSettings field but threads, with its default; every CampaignConfig field but the two tables
    runner = {f.name: f.default for f in dataclasses.fields(RunnerSettings) if f.name != "threads"}
    assert {k: f.default for k, f in _RUNNER.items()} == runner and runner["sample_min_ms"] == 0.0
    assert _RUNNER["min_runs"].minimum == 1 and _RUNNER["sample_min_ms"].kind is float
    assert _CAMPAIGN["retries"].default == CampaignConfig.__dataclass_fields__["retries"].default == 2
    assert _CAMPAIGN["variants"].default == ("fp32",) and _CAMPAIGN["formats"].default is REQUIRED


def test_a_runner_setting_is_read_with_its_dataclass_type(tmp_path):
    with pytest.raises(ConfigError, match=r"\[runner\] profile_layers: must be true or false, not 1; write true"):
        _load(tmp_path, pf.campaign_toml().replace("min_runs = 5", "min_runs = 5\nprofile_layers = 1"))
    cfg = _load(tmp_path, pf.campaign_toml().replace("min_seconds = 0.01", "min_seconds = 2\nsample_min_ms = 3"))
    assert cfg.runner.min_seconds == 2.0 and isinstance(cfg.runner.sample_min_ms, float)
    assert cfg.runner.sample_min_ms == 3.0 and cfg.runner.profile_runs == 20  # given, given, the default
