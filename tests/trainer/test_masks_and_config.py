from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch

from edgemask.errors import ConfigError, UnknownNameError
from edgemask.trainer.config import TrainConfig
from edgemask.trainer.masks import binarize, pack_bits, packed_nbytes, unpack_bits
from edgemask.trainer.models import MaskedModel, build_model, model_sites
from edgemask.trainer.models.masking import any_nonzero, effective_params, unit_alive


def test_pack_bits_uses_one_bit_per_element():
    m = torch.tensor([[1, 0, 1, 1, 0, 0, 0, 1, 1]], dtype=torch.float32)  # 9 elements -> 2 bytes
    packed = pack_bits(m)
    assert packed.tolist() == [0b10110001, 0b10000000]
    assert packed_nbytes(9) == 2
    assert torch.equal(unpack_bits(packed, (1, 9)), m)
    with pytest.raises(ValueError):
        unpack_bits(packed, (3, 9))


def test_binarize_threshold_is_inclusive_at_one_half():
    assert binarize(torch.tensor([0.49, 0.5, 0.51])).tolist() == [0.0, 1.0, 1.0]


def test_any_nonzero_is_ne_any_for_every_kind_of_value():
    x = torch.tensor([[0.0, -0.0, 0.0], [0.0, float("nan"), 0.0], [1e-45, 0.0, 0.0], [0.0, 0.0, float("-inf")],
                      [-0.0, -0.0, -0.0], [0.0, 0.0, -1e-30]])  # -0.0 is zero; NaN, a denormal and -inf are not
    assert any_nonzero(x, 1).tolist() == x.ne(0).any(1).tolist() == [False, True, True, True, False, True]
    assert any_nonzero(x, 0).tolist() == x.ne(0).any(0).tolist()
    soft = torch.rand(4, 6, requires_grad=True)  # a soft training mask: no autograd graph through the gate
    assert not any_nonzero(soft, 1).requires_grad
    ints = torch.tensor([[0, 3], [0, 0]])
    assert any_nonzero(ints, 1).tolist() == [True, False]


def test_dead_unit_outputs_exactly_zero_bias_and_batchnorm_included():
    torch.manual_seed(0)

    class ConvBN(torch.nn.Module):
        norm_after = {"conv": "bn"}

        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(2, 4, 3)
            self.bn = torch.nn.BatchNorm2d(4)

        def forward(self, x):
            return self.bn(self.conv(x))

    m = ConvBN().eval()
    with torch.no_grad():
        m.bn.bias.fill_(0.7)
        m.bn.running_mean.fill_(0.3)
    sites = model_sites(m)
    masks = {"conv.weight": torch.ones(4, 2, 3, 3)}
    masks["conv.weight"][2] = 0  # filter 2 dead
    out = MaskedModel(m, sites, masks)(torch.randn(3, 2, 5, 5))
    assert torch.count_nonzero(out[:, 2]) == 0  # no β − γ·μ/σ leak, no bias leak
    assert torch.count_nonzero(out[:, 1]) > 0
    assert unit_alive(sites[0], masks).tolist() == [True, True, False, True]


def test_lstm_dead_hidden_unit_outputs_zero():
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(3, 4, batch_first=True)
    sites = model_sites(lstm)
    masks = {w: torch.ones(12, *p.shape[1:]) for w, p in lstm.named_parameters() if "weight" in w}
    for w in masks:  # hidden unit 1: g rows (8 + 1) zero
        masks[w][8 + 1] = 0
    out, _ = MaskedModel(lstm, sites, masks)(torch.randn(2, 5, 3))
    assert torch.count_nonzero(out[..., 1]) == 0
    assert torch.count_nonzero(out[..., 0]) > 0
    eff = effective_params(dict(lstm.named_parameters()), masks, sites)
    assert eff["bias_ih_l0"][9] == 0 and eff["bias_ih_l0"][13] != 0  # g gated, o untouched


@pytest.mark.parametrize("section, line, message", [
    ("training", "participation = 0", "[training] participation: 0 is out of range; use a value > 0 and <= 1"),
    ("training", "participation = 1.5", "[training] participation: 1.5 is out of range; use a value > 0 and <= 1"),
    ("training", "lr = -0.1", "[training] lr: -0.1 is out of range; use a value > 0"),
    ("training", "local_epochs = 0", "[training] local_epochs: 0 is out of range; use a value >= 1"),
    ("training", "batched = 1", "[training] batched: must be true or false, not 1; write true or false"),
    ("data", "test_fraction = 1.0", "[data] test_fraction: 1.0 is out of range; use a value between 0 and 1, both"),
    ("data", "num_clients = 0", "[data] num_clients: 0 is out of range; use a value >= 1"),
    ("data", "test_fraction = 0", "[data] test_fraction: 0 is out of range; use a value between 0 and 1, both "
     "excluded"),
    # the valid partitions are declared once (trainer.data.partition.PARTITIONERS) and checked when the file is read
    ("data", 'partition = "shards"', "[data] partition: unknown partition 'shards'; valid names: dirichlet, iid, "
     "natural, pathological"),
])
def test_config_mistakes_read_one_way(tmp_path, section, line, message):
    """The training config is checked by edgemask.schema like the campaign and the inventory: one wording,
    ``<file>: [section] field: what is wrong; what to do``."""
    bad = tmp_path / "c.toml"
    bad.write_text(f"[{section}]\n{line}\n")
    with pytest.raises(ConfigError) as e:
        TrainConfig.load(bad)
    assert str(e.value).startswith(f"{bad}: {message}")


def test_config_rejects_unknown_names_with_valid_ones(tmp_path):
    bad = tmp_path / "c.toml"
    bad.write_text('[algorithm]\nname = "fedmagic"\n')
    with pytest.raises(UnknownNameError, match="valid names: .*fedavg"):
        TrainConfig.load(bad)
    bad.write_text('[training]\nroundz = 3\n')
    with pytest.raises(ConfigError, match=r"c\.toml: \[training\] roundz: unknown field; did you mean 'rounds'\?"):
        TrainConfig.load(bad)
    bad.write_text('[training]\nrounds = "ten"\n')
    with pytest.raises(ConfigError, match=r"\[training\] rounds: must be an integer, not 'ten'; write a whole"):
        TrainConfig.load(bad)
    bad.write_text('[trainig]\nrounds = 3\n')
    with pytest.raises(ConfigError, match=r"c\.toml: trainig: unknown field; did you mean 'training'\?"):
        TrainConfig.load(bad)
    bad.write_text('[data]\nname = "digits"\npartition = "pathological"\nbalance_rate = 0.5\n'
                   '[algorithm]\nname = "fedmask"\n[algorithm.args]\nprune_rate = 0.3\n')
    cfg = TrainConfig.load(bad)
    again = tmp_path / "again.toml"
    again.write_text(cfg.to_toml())
    assert TrainConfig.load(again).to_dict() == cfg.to_dict()
    # the dict form round-trips too: None is "not set" where None is the default, an error elsewhere
    assert cfg.to_dict()["data"]["samples_per_client"] is None
    assert TrainConfig.from_dict(cfg.to_dict()).to_dict() == cfg.to_dict()
    broken = cfg.to_dict()
    broken["training"]["rounds"] = None
    with pytest.raises(ConfigError, match=r"\[training\] rounds: must be an integer, not None"):
        TrainConfig.from_dict(broken)


@pytest.mark.parametrize("section, lines, message", [
    # the same mistake in [training] and in [algorithm.args]: the same words
    ("training", "lr = 'fast'", "[training] lr: must be a number, not 'fast'; write a number, without quotes"),
    ("algorithm.args", "mu = 'fast'", "[algorithm.args] mu: must be a number, not 'fast'; write a number, without "
                                      "quotes"),
    ("algorithm.args", "muu = 0.1", "[algorithm.args] muu: unknown field; did you mean 'mu'? valid fields: mu"),
    # a bool is no count: the old check let `true` through as 1 epoch (bool is an int in Python)
    ("algorithm.args", "head_epochs = true", "[algorithm.args] head_epochs: must be an integer, not True; write a "
                                             "whole number, without quotes"),
    # limits declared on the Args field (they were if-statements in each algorithm's setup, each worded its own way)
    ("algorithm.args", "p = 1.0", "[algorithm.args] p: 1.0 is out of range; use a value between 0 and 1, both "
                                  "excluded"),
    ("algorithm.args", "L = 0", "[algorithm.args] L: 0 is out of range; use a value >= 1"),
    ("algorithm.args", "mu = -0.1", "[algorithm.args] mu: -0.1 is out of range; use a value >= 0"),
    ("algorithm.args", "warmup_fraction = 1.5", "[algorithm.args] warmup_fraction: 1.5 is out of range; use a value "
                                                "between 0 and 1"),
    ("algorithm.args", "objective = 'tight'", "[algorithm.args] objective: unknown value 'tight'; valid names: bound, "
                                              "printed"),
    ("algorithm.args", "base = 'scaffold'", "[algorithm.args] base: unknown value 'scaffold'; valid names: fedavg, "
                                            "fedprox"),
    # a list's items are typed too (HeteroFL's float(r) once raised a ValueError traceback in setup)
    ("algorithm.args", "rates = [1.0, 'half']", "[algorithm.args] rates: must be a list of numbers, not [1.0, 'half']; "
                                                "write a number, without quotes, for each item"),
    ("algorithm.args", "mu = 0.1", "[algorithm.args] mu: unknown field; [algorithm.args] takes no fields; remove it"),
    # [model.args] against the builder's signature: a typo was a TypeError traceback from build_model
    ("model.args", "hiden = [8]", "[model.args] hiden: unknown field; did you mean 'hidden'? valid fields: hidden"),
    ("model.args", "hidden = 8", "[model.args] hidden: must be a list, not 8; write a list in [ ]"),
])
def test_algorithm_and_model_args_read_like_training(tmp_path, section, lines, message):
    algorithm = {"mu = 'fast'": "fedprox", "muu = 0.1": "fedprox", "mu = -0.1": "fedprox", "head_epochs = true": "fedrep", "p = 1.0":
                 "fedselect", "L = 0": "fedselect", "warmup_fraction = 1.5": "lg_fedavg",
                 "objective = 'tight'": "perfedmask", "base = 'scaffold'": "fedpews",
                 "rates = [1.0, 'half']": "heterofl"}.get(lines, "fedavg")
    bad = tmp_path / "c.toml"
    bad.write_text(f'[model]\nname = "mlp"\n[algorithm]\nname = "{algorithm}"\n[{section}]\n{lines}\n')
    with pytest.raises(ConfigError) as e:
        TrainConfig.load(bad)
    assert str(e.value) == f"{bad}: {message}"


def test_a_config_built_in_code_is_checked_when_its_algorithm_is_built():
    """``TrainConfig(...)`` is not read from a file: the algorithm's ``Args`` and the model builder check it, in the
    same words, naming the algorithm or the model where a file would be named."""
    from edgemask.trainer.config import AlgorithmConfig, DataConfig, ModelConfig
    from edgemask.trainer.simulation import build_algorithm

    data = DataConfig(num_clients=2, samples_per_client=20)
    with pytest.raises(ConfigError) as e:
        build_algorithm(TrainConfig(data=data, algorithm=AlgorithmConfig("fedprox", {"mu": "0.1"})))
    assert str(e.value) == ("algorithm 'fedprox': [algorithm.args] mu: must be a number, not '0.1'; write a number, "
                            "without quotes")
    with pytest.raises(ConfigError) as e:
        build_algorithm(TrainConfig(data=data, model=ModelConfig("cnn", {"width": [8, 16]})))
    assert str(e.value) == ("model 'cnn': [model.args] width: unknown field; did you mean 'widths'? valid fields: "
                            "widths")
    # tuples, as code writes them, stand for TOML's lists
    algo = build_algorithm(TrainConfig(data=data, model=ModelConfig("mlp", {"hidden": (8,)}),
                                       algorithm=AlgorithmConfig("heterofl", {"rates": (1.0, 0.5)})))
    assert algo.args.rates == (1.0, 0.5) and algo.model.fc1.out_features == 8


def test_every_algorithm_argument_has_a_type_toml_can_check():
    """Each ``Args`` field is annotated with a type the schema checks (not ``Any``): its one declaration."""
    from dataclasses import fields

    from edgemask.schema import ANY, schema_of
    from edgemask.trainer.algorithms import ALGORITHMS

    for name in ALGORITHMS.names():
        args = ALGORITHMS.get(name).Args
        schema = schema_of(args)
        assert set(schema) == {f.name for f in fields(args)}, name
        assert all(f.kind != ANY for f in schema.values()), (name, schema)


def test_build_model_unknown_name_lists_models():
    with pytest.raises(UnknownNameError, match="valid names: .*mlp"):
        build_model("resnet9000", (1, 8, 8), 10)


# training configs; the example inventory and campaign (*.example.toml) are loaded by their own loaders in
# tests/edgemask/test_example_configs.py
CONFIGS = sorted(p for p in (Path(__file__).resolve().parents[2] / "configs").glob("*.toml")
                 if not p.name.endswith(".example.toml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_every_shipped_config_loads_and_validates(path):
    """Every training config in configs/ passes the loader (sections, fields, names), its algorithm's argument check and
    its model builder's signature; the embedded datasets (no files needed) are built."""
    from edgemask.trainer.algorithms import ALGORITHMS
    from edgemask.trainer.algorithms.base import parse_args
    from edgemask.trainer.data import build_dataset
    from edgemask.trainer.models import MODELS

    cfg = TrainConfig.load(path)
    parse_args(ALGORITHMS.get(cfg.algorithm.name).Args, cfg.algorithm.args, cfg.algorithm.name)
    inspect.signature(MODELS.get(cfg.model.name)).bind((1,), 2, **cfg.model.args)
    if cfg.data.name in ("digits", "synthetic"):
        ds = build_dataset(cfg.data, cfg.run.seed)
        assert len(ds.clients) == cfg.data.num_clients


def test_the_paper_settings_are_shipped():
    names = {p.name for p in CONFIGS}
    assert {"perfedmask-cifar10-c1.toml", "perfedmask-cifar10-c01.toml", "fedpews-synthetic32k-n4.toml"} <= names
    n4 = TrainConfig.load(Path(CONFIGS[0]).parent / "fedpews-synthetic32k-n4.toml")
    assert (n4.data.num_clients, n4.algorithm.args["lambda_div"]) == (4, 0.0)
    assert TrainConfig.load(Path(CONFIGS[0]).parent / "fedselect-cifar10-resnet18.toml").training.rounds == 200
    assert [TrainConfig.load(Path(CONFIGS[0]).parent / f"perfedmask-cifar10-{c}.toml").training.participation
            for c in ("c1", "c01")] == [1.0, 0.1]
    ic = TrainConfig.load(Path(CONFIGS[0]).parent / "ic-cifar10-fedmask.toml").data  # 25 training samples (#26)
    assert (ic.samples_per_client, ic.balance_rate) == (33, 0.25)


def test_the_schema_declares_every_config_field_and_no_other():
    """A field added to a section's dataclass but not to its schema would be refused as unknown in every file."""
    from dataclasses import fields

    from edgemask.trainer.config import _SCHEMAS, _SECTIONS

    assert set(_SCHEMAS) == set(_SECTIONS)
    for name, typ in _SECTIONS.items():
        assert set(_SCHEMAS[name]) == {f.name for f in fields(typ)}, name


def test_fedpews_mu_is_fedprox_mu_declared_once():
    """FedPeWS's μ (its FedProx base) takes FedProx's default and limit from FedProx's one declaration: the same
    value, and a negative one refused by both in the same words."""
    from edgemask.errors import ConfigError
    from edgemask.trainer.algorithms.base import parse_args
    from edgemask.trainer.algorithms.fedpews import FedPeWSArgs
    from edgemask.trainer.algorithms.fedprox import FedProxArgs

    assert FedPeWSArgs().mu == FedProxArgs().mu == 0.01
    for typ in (FedProxArgs, FedPeWSArgs):
        with pytest.raises(ConfigError, match=r"^t.toml: \[algorithm.args\] mu: -0.1 is out of range; use a value "
                                              r">= 0$"):
            parse_args(typ, {"mu": -0.1}, "x", "t.toml")
