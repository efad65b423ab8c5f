"""trainer.flower: the round loop with the clients' local training on Flower nodes gives simulate()'s history and
state. Three levels: the task as it crosses the network, to a client side that holds only the data (no algorithm),
for every registered algorithm (no Flower needed); Flower's records and ClientApp answered in this process (a stand-in Grid, no Ray);
Flower's simulation engine (Ray), slow."""

from __future__ import annotations

import dataclasses
import json
import sys

import pytest
import torch

from edgemask.errors import EdgemaskError
from edgemask.trainer.algorithms import ALGORITHMS
from edgemask.trainer.records import TENSOR_FIELDS, LocalResult, LocalTask
from edgemask.trainer.flower import SETTING_FIELDS, ClientSide, TaskMessage, loopback_phases
from edgemask.trainer.local_training import local_train
from edgemask.trainer.sampling import batch_order
from edgemask.trainer.simulation import SimulationResult, build_algorithm, simulate
from edgemask.trainer.task_functions import Fn, ModelSpec

from test_batched import TOL, _config, _max_diff  # the tiny digits run: 4 clients, 2 rounds, participation 0.75

FLOWER_ALGORITHMS = ["fedavg", "fedmask", "ditto"]  # Ditto: two local phases per round


def assert_same_run(ref: SimulationResult, got: SimulationResult) -> None:
    """History values, shared state and every client's state within TOL."""
    assert [(r["round"], r["client"], r["metric"]) for r in ref.history] == \
           [(r["round"], r["client"], r["metric"]) for r in got.history]
    for a, b in zip(ref.history, got.history):
        assert b["value"] == pytest.approx(a["value"], rel=TOL, abs=TOL, nan_ok=True), (a, b)
    assert _max_diff(ref.algorithm.shared_state(), got.algorithm.shared_state()) <= TOL
    for cid in ref.algorithm.client_ids:
        s, g = ref.algorithm.client_state(cid), got.algorithm.client_state(cid)
        for f in dataclasses.fields(s):
            va, vb = getattr(s, f.name), getattr(g, f.name)
            if isinstance(va, dict) and va and all(isinstance(v, torch.Tensor) for v in va.values()):
                assert _max_diff(va, vb) <= TOL, (cid, f.name)


# -- the task as it crosses the network (no Flower) --------------------------------------------------------------

def test_every_task_field_travels():
    names = {f.name for f in dataclasses.fields(LocalTask)}
    assert set(TENSOR_FIELDS) | set(SETTING_FIELDS) == names and not set(TENSOR_FIELDS) & set(SETTING_FIELDS)
    spec = ModelSpec.of("mlp", (64,), 10, {"hidden": [8]}, seed=4)
    task = LocalTask({"w": torch.ones(2)}, spec, Fn.of("bnn.forward", scale=False),
                     (Fn.of("proximal", mu=0.25), Fn("scaffold.control_variate")), epochs=3, lr=0.2, max_steps=5,
                     lrs={"w": 0.01}, loss=Fn.of("perfedavg.fo_maml", alpha=0.5), batches_per_step=2,
                     project=Fn("bnn.clip"), noise={"u": (3, 2)}, seed=11, grad_keep={"w": torch.tensor([1.0, 0.0])})
    msg = TaskMessage.of("c1", 4, 1, task)
    wire = json.loads(json.dumps(msg.settings))  # what to_records sends
    back = TaskMessage(msg.client_id, msg.round, msg.phase, msg.tensors, wire).task()
    for f in SETTING_FIELDS:
        assert getattr(back, f) == getattr(task, f), f
    assert torch.equal(back.grad_keep["w"], task.grad_keep["w"]) and back.constants == {}


def _fresh_node_trains(task: LocalTask, data, order) -> LocalResult:
    """``task`` trained as a Flower node trains it: rebuilt from its records (tensors and JSON), its model built
    from the spec in this process (the server's model context dropped), the sequential loop."""
    from edgemask.trainer import task_functions

    msg, _ = TaskMessage.from_records(TaskMessage.of("c", 0, 0, task).to_records("x = 1\n"))
    lent = task_functions._CONTEXTS.pop(task.model)  # as on a node: no algorithm's model to borrow
    try:
        return local_train(msg.task(), *data, order, 8, 0.9, 1e-3)
    finally:
        task_functions._CONTEXTS[task.model] = lent


@pytest.mark.parametrize("algorithm", ["fedmask", "fedpews", "bnn_fedavg", "moon"])
def test_a_task_survives_a_round_trip_through_records_and_trains_the_same(algorithm, flower_messages):
    """A task is data: through Flower's records (ArrayRecords and JSON) and trained on a model built from its spec,
    it gives the very bits the algorithm's own task gives (FedMask: a forward and a regularizer over the frozen
    weights in its constants; FedPeWS: its own loss, per-tensor rates and noise draws; BNN: a projection;
    MOON: a loss over the model's head)."""
    algo = build_algorithm(_config(algorithm, False))
    cid = algo.client_ids[1]
    task = algo.local_task(cid, 0)
    task.seed = 5
    d = algo.dataset.client(cid)
    order = batch_order(d.num_train, task.epochs, 0, 0, 1)
    ref = local_train(task, d.train_x, d.train_y, order, 8, 0.9, 1e-3)
    got = _fresh_node_trains(task, (d.train_x, d.train_y), order)
    assert list(got.trained) == list(ref.trained) and got.samples_seen == ref.samples_seen > 0
    for k, v in ref.trained.items():
        assert torch.equal(got.trained[k], v), k
    assert got.loss == ref.loss
    assert max(float((got.trained[k] - task.trainable[k]).abs().max()) for k in got.trained) > 1e-4  # it trained


def test_a_node_without_the_named_function_says_which_exist(flower_messages):
    """A message naming a function no module of the node registers (another edgemask on the node) fails with the
    names the node knows, which the server reports with the node."""
    from edgemask.errors import UnknownNameError

    cfg = _config("fedavg", False)
    algo = build_algorithm(cfg)
    task = algo.local_task(algo.client_ids[0], 0)
    task.loss = Fn.of("fedfuture.loss", beta=2)
    msg, _ = TaskMessage.from_records(TaskMessage.of(algo.client_ids[0], 0, 0, task).to_records(cfg.to_toml()))
    with pytest.raises(UnknownNameError, match=r"unknown task function 'fedfuture.loss'; valid names: bnn.clip, "):
        ClientSide(cfg).train(msg)




@pytest.mark.parametrize("algorithm", [pytest.param(a, marks=pytest.mark.slow) if a in ("bnn_fedavg", "fedrep", "fedselect")
                                       else a for a in ALGORITHMS.names()])
def test_clients_without_an_algorithm_train_as_simulate(algorithm):
    """A task is data (tensors, settings, registered function names), so a client that holds only its data and
    receives the task's tensors and settings trains exactly as simulate()."""
    try:
        ref = simulate(_config(algorithm, False))
    except EdgemaskError as e:  # an algorithm that needs another model or dataset than this small run's
        pytest.skip(f"{algorithm} does not run on digits/mlp: {e}")
    cfg = _config(algorithm, False)
    side_phases = loopback_phases(cfg)
    assert_same_run(ref, simulate(cfg, train_phase=side_phases))


def test_without_flower_the_engine_says_how_to_install_it(monkeypatch, tmp_path, capsys):
    from edgemask.cli.main import main
    from edgemask.trainer.flower import require_flwr

    monkeypatch.setitem(sys.modules, "flwr", None)  # import flwr raises ImportError
    with pytest.raises(EdgemaskError, match=r"pip install -e \.\[flower\]"):
        require_flwr()
    cfg = tmp_path / "c.toml"
    cfg.write_text(_config("fedavg", True).to_toml())
    assert main(["train", "--config", str(cfg), "--engine", "flower", "--workspace", str(tmp_path / "ws")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pip install -e .[flower]" in err
    assert main(["train", "--config", str(cfg), "--engine", "flower", "--sequential"]) == 2
    assert "--engine flower" in capsys.readouterr().err


# -- Flower's records and ClientApp, answered in this process ----------------------------------------------------

class StandInGrid:
    """Flower's Grid, answered in this process by trainer.flower's ClientApp: node 100 + p holds partition p of
    ``partitions`` (or ``nodes``: node id -> partition). A handler's exception becomes an error reply, as Flower's
    runtimes send it."""

    def __init__(self, partitions: int, nodes: dict[int, int] | None = None) -> None:
        self.partitions = partitions
        self.nodes = nodes if nodes is not None else {100 + p: p for p in range(partitions)}
        self.sent: list = []

    def get_node_ids(self):
        return list(self.nodes)

    def send_and_receive(self, messages, *, timeout=None):
        from flwr.app import Context, Error, Message, RecordDict

        from edgemask.trainer.flower import client_app

        replies = []
        for m in messages:
            self.sent.append(m)
            node = m.metadata.dst_node_id
            ctx = Context(run_id=1, node_id=node, state=RecordDict(), run_config={},
                          node_config={"partition-id": self.nodes[node], "num-partitions": self.partitions})
            try:
                replies.append(client_app(m, ctx))
            except EdgemaskError as e:
                replies.append(Message(Error(code=1, reason=str(e)), reply_to=m))
        return replies


@pytest.fixture
def flower_messages():
    """Messages need the identity of the task that sends them, which Flower's runtimes set (flwr 1.41)."""
    pytest.importorskip("flwr")
    from flwr.supercore.task_identity import TaskIdentity

    saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    yield
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved


def test_records_carry_tensors_dtypes_and_settings_exactly(flower_messages):
    from edgemask.trainer.flower import result_from_records, result_records

    task = LocalTask({"w": torch.randn(3, 2), "o:x": torch.randn(0)}, ModelSpec.of("mlp", (6,), 3),
                     constants={"g:w": torch.randn(3, 2)}, buffers={"n": torch.tensor(7)},
                     grad_keep={"w": torch.tensor([[1.0, 0.0]] * 3)}, lrs={"w": 0.3}, max_steps=None)
    msg, toml = TaskMessage.from_records(TaskMessage.of("client-002", 1, 2, task).to_records("x = 1\n"))
    assert (msg.client_id, msg.round, msg.phase, toml) == ("client-002", 1, 2, "x = 1\n")
    for f in TENSOR_FIELDS:
        sent = getattr(task, f)
        assert list(msg.tensors[f]) == list(sent)
        for k, v in sent.items():
            assert msg.tensors[f][k].dtype == v.dtype and torch.equal(msg.tensors[f][k], v)
    assert msg.settings["lrs"] == {"w": 0.3} and msg.settings["max_steps"] is None
    res = LocalResult({"w": torch.randn(3, 2)}, {"n": torch.tensor(9)}, 0.123456789012345, 40, 17)
    cid, back = result_from_records(result_records("client-002", res))
    assert cid == "client-002" and (back.loss, back.samples_seen, back.num_samples) == (res.loss, 40, 17)
    assert torch.equal(back.trained["w"], res.trained["w"]) and back.buffers["n"].dtype == torch.int64


@pytest.mark.parametrize("algorithm", FLOWER_ALGORITHMS)
def test_deployed_server_app_writes_simulates_run(algorithm, flower_messages, tmp_path):
    """trainer.flower:server_app as a deployment runs it (config path and runs-root in the run config), on 2 nodes
    that hold 2 clients each (index mod 2): the run directory's history and state are simulate()'s."""
    from flwr.app import Context, RecordDict

    from edgemask.trainer.flower import server_app
    from edgemask.trainer.run_dir import Run

    cfg = _config(algorithm, True)
    path = tmp_path / "c.toml"
    path.write_text(cfg.to_toml())
    grid = StandInGrid(partitions=2)
    server_app(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                             run_config={"config": str(path), "runs-root": str(tmp_path / "runs")}))
    ref = simulate(cfg)
    train = [m for m in grid.sent if m.metadata.message_type == "train"]
    assert {m.metadata.dst_node_id for m in train} == {100, 101}
    for m in train:  # each client went to the node holding it
        cid = m.content.config_records["task"]["client-id"]
        assert ref.algorithm.client_ids.index(cid) % 2 == m.metadata.dst_node_id - 100
    if algorithm == "ditto":  # its personal model is a second message per client and round
        assert {m.content.config_records["task"]["phase"] for m in train} == {0, 1}
    run = Run(tmp_path / "runs" / cfg.run_id)
    assert run.summary["engine"] == "flower 1.41.0 deployment"
    assert run.summary["mean_accuracy"] == pytest.approx(ref.summary["mean_accuracy"], abs=TOL)
    hist = run.history()
    assert len(hist) == len(ref.history)
    for (_, r), a in zip(hist.iterrows(), ref.history):
        assert (r["round"], r["client"], r["metric"]) == (a["round"], a["client"], a["metric"])
        assert r["value"] == pytest.approx(a["value"], rel=TOL, abs=TOL, nan_ok=True)


def test_client_errors_and_missing_nodes_name_the_node_and_the_fix(flower_messages, tmp_path):
    from edgemask.trainer.flower import FlowerTrainer, client_nodes

    from flwr.app import Context, RecordDict

    from edgemask.trainer.flower import server_app

    with pytest.raises(EdgemaskError, match=r"needs the training config: set config = "):
        server_app(StandInGrid(1), Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={}))
    cfg = _config("fedavg", True)
    algo = build_algorithm(cfg)
    with pytest.raises(EdgemaskError, match="no node: start a flower-supernode for each partition"):
        client_nodes(StandInGrid(2, nodes={}), algo.client_ids, timeout=0.0)
    with pytest.raises(EdgemaskError, match=r"partitions \[1\] of 2: start a flower-supernode"):
        client_nodes(StandInGrid(2, nodes={101: 1}), algo.client_ids, timeout=0.0)
    with pytest.raises(EdgemaskError, match="give each node its own partition-id"):
        client_nodes(StandInGrid(2, nodes={100: 0, 101: 0}), algo.client_ids, timeout=5.0)
    assert client_nodes(StandInGrid(3), algo.client_ids) == dict(zip(algo.client_ids, [100, 101, 102, 100]))
    trainer = FlowerTrainer(StandInGrid(2))
    trainer(algo, 0, 0, [])  # finds the nodes
    trainer.nodes = {cid: 100 for cid in trainer.nodes}  # the server sends every client to partition 0's node
    cid = algo.client_ids[1]
    with pytest.raises(EdgemaskError, match=rf"node 100 failed in round 0, phase 0.*does not hold client '{cid}'"):
        trainer(algo, 0, 0, [(cid, algo.local_task(cid, 0))])


# -- Flower's simulation engine (Ray) --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ray_runs(tmp_path_factory):
    """FedAvg, FedMask and Ditto in one Flower simulation (one Ray start-up), 2 workers."""
    pytest.importorskip("flwr")
    from edgemask.trainer.flower import simulate_flower

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_TMPDIR", str(tmp_path_factory.mktemp("ray")))  # Ray's sockets and logs
        mp.setenv("FLWR_HOME", str(tmp_path_factory.mktemp("flwr")))  # Flower writes its telemetry id there
        results = simulate_flower([_config(a, True) for a in FLOWER_ALGORITHMS], workers=2)
    return dict(zip(FLOWER_ALGORITHMS, results))


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", FLOWER_ALGORITHMS)
def test_flower_simulation_matches_simulate(algorithm, ray_runs):
    got = ray_runs[algorithm]
    assert got.summary["engine"].startswith("flower 1.41.0 simulation")
    assert_same_run(simulate(_config(algorithm, True)), got)
