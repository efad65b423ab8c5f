"""Batched local training (trainer.batched) against the sequential reference (trainer.local_training)."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from edgemask.errors import EdgemaskError
from edgemask.trainer import batched_ops
from edgemask.trainer.algorithms import ALGORITHMS
from edgemask.trainer.records import LocalTask
from edgemask.trainer.batched import compatible_groups, local_train_batched, step_indices, step_plans
from edgemask.trainer.config import AlgorithmConfig, ModelConfig, RunConfig, TrainConfig, TrainingConfig
from edgemask.trainer.data import DataConfig
from edgemask.trainer.local_training import local_train
from edgemask.trainer.sampling import batch_order
from edgemask.trainer.simulation import simulate
from edgemask.trainer.task_functions import Fn, ModelSpec, model_context, task_function

TOL = 1e-5


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert list(a) == list(b)
    return max((float((a[k].double() - b[k].double()).abs().max()) for k in a if a[k].numel()), default=0.0)


_NAMED: dict[int, tuple[object, Fn]] = {}  # a test function's id -> (the function, its name): held, so ids stay
_LENT: dict[int, tuple[nn.Module, ModelSpec]] = {}


def named(fn) -> Fn:
    """A test's own function (a forward, loss, regularizer or projection) as a registered task function: one
    name per function object, so the tasks holding it are one kind."""
    if id(fn) not in _NAMED:
        name = f"test.{len(_NAMED)}.{getattr(fn, '__name__', 'fn')}"
        task_function(name)(lambda model: fn)
        _NAMED[id(fn)] = (fn, Fn(name))
    return _NAMED[id(fn)][1]


def lend(model: nn.Module | None = None) -> ModelSpec:
    """A model spec standing for a test's own module (lent to the tasks, :func:`model_context`); ``None``: a
    spec for tasks whose functions use no model."""
    model = model if model is not None else nn.Identity()
    if id(model) not in _LENT:
        _LENT[id(model)] = (model, ModelSpec(f"test.model.{len(_LENT)}", (), 0))
    spec = _LENT[id(model)][1]
    model_context(spec, model)
    return spec


def _model_task(model: nn.Module, lr: float = 0.1, **kw) -> LocalTask:
    """The plain model's task (forward ``model``); a ``loss`` or ``project`` callable is :func:`named`."""
    kw = {k: named(v) if callable(v) else v for k, v in kw.items()}
    return LocalTask({k: v.detach().clone() for k, v in model.named_parameters()}, lend(model),
                     buffers={k: v.clone() for k, v in model.named_buffers()}, lr=lr, **kw)


def _clients(sizes: list[int], shape=(6,), seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(n, *shape, generator=g), torch.randint(0, 3, (n,), generator=g)) for n in sizes]


def _check_same(tasks, data, orders, bs, momentum, wd, **kw):
    got = local_train_batched(tasks, data, orders, bs, momentum, wd, **kw)
    for t, (x, y), o, r in zip(tasks, data, orders, got):
        ref = local_train(t, x, y, o, bs, momentum, wd)
        assert _max_diff(r.trained, ref.trained) <= TOL
        assert _max_diff(r.buffers, ref.buffers) <= TOL
        assert r.loss == pytest.approx(ref.loss, rel=1e-5, abs=1e-6)
        assert (r.samples_seen, r.num_samples) == (ref.samples_seen, ref.num_samples)
    return got


def test_step_indices_are_the_sequential_batches():
    orders = [np.array([4, 0, 2, 1, 3]), np.array([1, 2, 3, 4, 0])]
    got = step_indices(orders, epochs=2, max_steps=3, batch_size=2)
    assert got.tolist() == [[4, 0], [2, 1], [3, -1]]  # a partial batch at the epoch's end; 3 steps at most
    assert step_indices(orders, 2, None, 2).tolist()[3:] == [[1, 2], [3, 4], [0, -1]]


def test_all_clients_plans_at_once_are_each_clients_own():
    rng = np.random.default_rng(0)
    sizes, epochs, max_steps = [5, 0, 9, 3, 7], [2, 1, 1, 0, 3], [None, None, 2, None, 4]
    orders = [[rng.permutation(n) for _ in range(max(e, 1))] for n, e in zip(sizes, epochs)]
    got = step_plans(orders, epochs, max_steps, 2)  # (S, C, B)
    assert got.shape == (6, 5, 2)  # client 0: 2 epochs of 3 minibatches; the others end sooner
    assert got[:, 2].tolist() == [orders[2][0][:2].tolist(), orders[2][0][2:4].tolist()] + [[-1, -1]] * 4
    for c in range(5):
        own = step_indices(orders[c], epochs[c], max_steps[c], 2)
        assert np.array_equal(got[: len(own), c], own) and (got[len(own):, c] == -1).all()


def test_unequal_clients_momentum_and_weight_decay_match_sequential():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    sizes = [23, 5, 0, 16, 9]  # 3, 1, 0, 2, 2 steps of batch 8; one client with no data at all
    tasks = [_model_task(model, lr=0.05 + 0.01 * i, epochs=1 + i % 2) for i in range(len(sizes))]
    tasks[3].max_steps = 3
    data = _clients(sizes)
    orders = [batch_order(n, t.epochs, 0, 0, i) for i, (n, t) in enumerate(zip(sizes, tasks))]
    got = _check_same(tasks, data, orders, 8, momentum=0.9, wd=0.01)
    assert got[2].samples_seen == 0 and _max_diff(got[2].trained, tasks[2].trainable) == 0.0


@pytest.mark.parametrize("sizes", [[11, 0, 6, 3], [7], [0, 0]])
def test_clients_that_start_from_the_same_tensors_get_their_own_copies(sizes):
    # FedAvg's tasks all hold the global weights: stacked as one broadcast view, copied per client by the first
    # update; a client with no step (or a round where nobody steps) gets a copy too, never the task's tensor.
    torch.manual_seed(7)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    shared = {k: v.detach().clone() for k, v in model.named_parameters()}
    before = {k: v.clone() for k, v in shared.items()}
    tasks = [LocalTask(dict(shared), lend(model), lr=0.1) for _ in sizes]
    data = _clients(sizes)
    orders = [batch_order(n, 1, 0, 0, i) for i, n in enumerate(sizes)]
    got = _check_same(tasks, data, orders, 4, momentum=0.0, wd=0.0)
    assert _max_diff(shared, before) == 0.0  # the tasks' tensors are untouched
    for r, n in zip(got, sizes):
        assert (_max_diff(r.trained, before) == 0.0) == (n == 0)
        assert all(r.trained[k].untyped_storage().data_ptr() != v.untyped_storage().data_ptr()
                   for k, v in shared.items())
    if len(sizes) > 1 and sizes[0]:  # each client's own memory: training one did not move another
        assert _max_diff(got[0].trained, got[-1].trained) > 1e-4


def test_client_with_fewer_steps_does_not_move_after_its_last_step():
    torch.manual_seed(1)
    model = nn.Linear(6, 3)
    tasks = [_model_task(model) for _ in range(2)]
    data = _clients([40, 8])  # 5 steps vs 1 step of batch 8
    orders = [batch_order(40, 1, 0, 0, 0), batch_order(8, 1, 0, 0, 1)]
    short = local_train_batched(tasks, data, orders, 8, momentum=0.9, weight_decay=0.1)[1]
    # by hand: one SGD step, p − lr·(∇ + wd·p); momentum's buffer is the first gradient, so nothing more
    p = {k: v.clone().requires_grad_(True) for k, v in tasks[1].trainable.items()}
    x, y = data[1]
    loss = nn.functional.cross_entropy(functional_call(model, p, (x[torch.from_numpy(orders[1][0])],)),
                                       y[torch.from_numpy(orders[1][0])])
    grads = torch.autograd.grad(loss, list(p.values()))
    one_step = {k: (v - 0.1 * (g + 0.1 * v)).detach() for (k, v), g in zip(p.items(), grads)}
    assert _max_diff(short.trained, one_step) <= 1e-6
    assert _max_diff(short.trained, tasks[1].trainable) > 1e-3  # it did take its step


def test_batch_norm_running_stats_per_client():
    torch.manual_seed(2)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                          nn.Linear(4 * 4 * 4, 3)).train()
    sizes = [19, 7, 12]
    tasks = [_model_task(model, epochs=2) for _ in sizes]
    data = _clients(sizes, shape=(1, 4, 4))
    orders = [batch_order(n, 2, 0, 0, i) for i, n in enumerate(sizes)]
    got = _check_same(tasks, data, orders, 8, momentum=0.5, wd=0.0)
    assert int(got[0].buffers["1.num_batches_tracked"]) == 6 and int(got[1].buffers["1.num_batches_tracked"]) == 2


def test_own_loss_and_per_tensor_rates():
    torch.manual_seed(3)
    model = nn.Linear(6, 3)

    def loss(p, c, x, y, b):  # a loss that needs the whole batch: the mean of the two halves' losses
        h = x.shape[0] // 2 or 1
        f = nn.functional.cross_entropy
        return 0.5 * (f(functional_call(model, p, (x[:h],)), y[:h]) + f(functional_call(model, p, (x,)), y))

    sizes = [13, 6, 9]
    tasks = [_model_task(model, loss=loss, lrs={"weight": 0.2 + 0.1 * i}) for i in range(3)]
    data = _clients(sizes)
    orders = [batch_order(n, 1, 0, 0, i) for i, n in enumerate(sizes)]
    _check_same(tasks, data, orders, 4, momentum=0.9, wd=0.0)


def test_two_minibatches_per_step_and_projection_match_sequential():
    """``batches_per_step`` (a step's loss sees k consecutive minibatches, the last group wrapping around) and
    ``project`` (after each step, only on the clients that took it) in the stacked loop, clients of unequal plans."""
    torch.manual_seed(5)
    model = nn.Linear(6, 3)

    def loss(p, c, x, y, b):  # depends on which minibatch is which: weight 0.3 on the first, 0.7 on the second
        f = nn.functional.cross_entropy
        return 0.3 * f(functional_call(model, p, (x[0],)), y[0]) + 0.7 * f(functional_call(model, p, (x[1],)), y[1])

    def project(p):
        return {"weight": p["weight"].clamp(-0.2, 0.2)}

    sizes = [13, 6, 9, 0]  # epochs 1, 2, 1, 2: 4, 2+2, 3 and 0 minibatches of 4, i.e. 2, 2, 2 and 0 steps
    tasks = [_model_task(model, lr=0.5, loss=loss, batches_per_step=2, project=project, epochs=1 + i % 2)
             for i in range(4)]
    tasks[3].trainable["weight"] += 1.0  # an idle client outside the box stays there: never projected
    data = _clients(sizes)
    orders = [batch_order(n, t.epochs, 0, 0, i) for i, (n, t) in enumerate(zip(sizes, tasks))]
    got = _check_same(tasks, data, orders, 4, momentum=0.9, wd=0.01)
    assert [r.samples_seen for r in got] == [13, 12, 9 + 4, 0]  # 9 samples: the third minibatch pairs with the first
    assert all(bool(r.trained["weight"].abs().max() <= torch.tensor(0.2)) for r in got[:3])  # float32 0.2
    assert torch.equal(got[3].trained["weight"], tasks[3].trainable["weight"])


def test_chunks_and_groups_give_the_same_result():
    torch.manual_seed(4)
    small, large = nn.Linear(6, 3), nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))
    tasks = [_model_task(small if i % 3 else large) for i in range(7)]
    assert compatible_groups(tasks) == [[0, 3, 6], [1, 2, 4, 5]]
    sizes = [11, 4, 17, 8, 9, 2, 14]
    data = _clients(sizes)
    orders = [batch_order(n, 1, 0, 0, i) for i, n in enumerate(sizes)]
    whole = _check_same(tasks, data, orders, 4, momentum=0.9, wd=0.01)
    for chunk in (1, 3):
        parts = local_train_batched(tasks, data, orders, 4, 0.9, 0.01, max_clients_per_chunk=chunk)
        for a, b in zip(whole, parts):
            assert _max_diff(a.trained, b.trained) <= 1e-6 and a.loss == pytest.approx(b.loss, rel=1e-6)
    tiny_budget = local_train_batched(tasks, data, orders, 4, 0.9, 0.01, memory_budget=1)  # one client a chunk
    for a, b in zip(whole, tiny_budget):
        assert _max_diff(a.trained, b.trained) <= 1e-6


def test_a_chunk_that_runs_out_of_memory_is_trained_again_in_halves(monkeypatch):
    # A device whose memory holds 2 clients' stacked training (the estimate said all 7 fit): a unit test of the
    # retry, so the allocator's failure is a stand-in raised by the stacked loop itself.
    from edgemask.trainer import batched

    torch.manual_seed(4)
    model = nn.Linear(6, 3)
    tasks = [_model_task(model) for _ in range(7)]  # one kind of task: one group of 7
    for i, t in enumerate(tasks):
        t.trainable["weight"] += 0.1 * i
    sizes = [11, 4, 17, 8, 9, 2, 14]
    data = _clients(sizes)
    orders = [batch_order(n, 1, 0, 0, i) for i, n in enumerate(sizes)]
    whole = local_train_batched(tasks, data, orders, 4, 0.9, 0.01)
    real, sizes_tried = batched._train_stacked, []

    def small_device(tasks_, *args):
        sizes_tried.append(len(tasks_))
        if len(tasks_) > 2:
            raise torch.OutOfMemoryError("stand-in: CUDA out of memory")
        return real(tasks_, *args)

    monkeypatch.setattr(batched, "_train_stacked", small_device)
    with pytest.warns(RuntimeWarning, match="ran out of cpu memory: 3 client"):
        halves = local_train_batched(tasks, data, orders, 4, 0.9, 0.01)
    assert sizes_tried == [7, 3, 1, 1, 1, 1, 1, 1, 1]  # 7 fails, 3 fails, then one client at a time
    for a, b in zip(whole, halves):
        assert _max_diff(a.trained, b.trained) <= 1e-6 and a.loss == pytest.approx(b.loss, rel=1e-6)
    monkeypatch.setattr(batched, "_train_stacked", lambda *a: (_ for _ in ()).throw(torch.OutOfMemoryError("x")))
    with pytest.raises(torch.OutOfMemoryError), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        local_train_batched(tasks[:1], data[:1], orders[:1], 4)  # one client that does not fit: the error stands


def test_tasks_group_by_model_function_names_and_settings():
    # One kind of task: the same model spec, function names and settings, and the same tensor layout; nothing is
    # compared by identity, so tasks rebuilt from data (another process, a Flower node) are of the same kind.
    mlp, other = ModelSpec.of("mlp", (6,), 3, {"hidden": [4]}), ModelSpec.of("mlp", (6,), 3, {"hidden": [5]})
    w = {"w": torch.zeros(2, 3)}
    prox = Fn.of("proximal", mu=0.1)
    tasks = [LocalTask(w, mlp), LocalTask(dict(w), ModelSpec.of("mlp", [6], 3, {"hidden": (4,)})),  # equal specs
             LocalTask(w, other),  # another model
             LocalTask({"w": torch.zeros(3, 2)}, mlp),  # another shape
             LocalTask(w, mlp, regularizers=(prox,)), LocalTask(w, mlp, regularizers=(Fn.of("proximal", mu=0.1),)),
             LocalTask(w, mlp, regularizers=(Fn.of("proximal", mu=0.2),)),  # other settings
             LocalTask(w, mlp, regularizers=(prox, Fn("scaffold.control_variate"))),
             LocalTask(w, mlp, regularizers=(Fn("scaffold.control_variate"), prox)),  # summed in another order
             LocalTask(w, mlp, Fn.of("bnn.forward", scale=True)), LocalTask(w, mlp, Fn.of("bnn.forward", scale=False)),
             LocalTask(w, mlp, Fn.of("bnn.forward", scale=True))]
    assert compatible_groups(tasks) == [[0, 1], [2], [3], [4, 5], [6], [7], [8], [9, 11], [10]]


def test_an_unknown_task_function_says_which_names_exist():
    from edgemask.errors import UnknownNameError

    model = nn.Linear(6, 3)
    data = _clients([4])
    for fields, match in [({"loss": Fn("fedmask.no_such_loss")}, r"unknown task function 'fedmask.no_such_loss'; "
                                                                  r"valid names: .*fedmask\.forward.*proximal"),
                          ({"regularizers": (Fn.of("proximal", mu=0.1, nu=2),)},
                           r"task function 'proximal': settings \{'mu': 0.1, 'nu': 2\} do not fit it")]:
        task = _model_task(model, **fields)
        with pytest.raises(UnknownNameError, match=match):
            local_train(task, *data[0], [np.arange(4)], 4)
        with pytest.raises(UnknownNameError, match=match):
            local_train_batched([task], data, [[np.arange(4)]], 4)


def test_random_forward_falls_back_to_the_sequential_loop():
    model = nn.Sequential(nn.Linear(6, 8), nn.Dropout(0.5), nn.Linear(8, 3)).train()
    tasks = [_model_task(model) for _ in range(2)]
    data = _clients([8, 5])
    orders = [batch_order(8, 1, 0, 0, 0), batch_order(5, 1, 0, 0, 1)]
    with pytest.warns(RuntimeWarning, match="falls back to the sequential loop"):
        got = local_train_batched(tasks, data, orders, 4)
    assert [r.samples_seen for r in got] == [8, 5]


# -- every registered algorithm, through the round loop ----------------------------------------------------
# Arguments that make a 2-round run exercise what would otherwise start later (FedPeWS's warmup is τ·T rounds).
ARGS = {"fedpews": {"warmup_rounds": 1}, "fedpews_fixed": {"warmup_rounds": 1}}


MODELS = {"mlp": {"hidden": [16, 12]}, "cnn": {"widths": [4, 6]}}  # the CNN runs the trainer.batched_ops rules
# Batch norm (clients split by batch size, unpadded), depthwise and 1×1 convolutions through the rules, for the
# algorithms whose losses differ in kind. (Deeper batch-norm nets at this learning rate on 8×8 digits are chaotic:
# the sequential loop itself, its weights perturbed by 1e-7, moves by the same amount as batched vs sequential.)
MODELS["tiny_mobilenet"] = {"width": 4, "expand": 2}
BN_ALGORITHMS = ("fedavg", "fedmask", "perfedavg", "fedbabu", "ditto", "moon")


def _config(algorithm: str, batched: bool, model: str = "mlp") -> TrainConfig:
    return TrainConfig(
        run=RunConfig(seed=3),
        data=DataConfig(name="digits", num_clients=4, partition="dirichlet", alpha=0.5, samples_per_client=48),
        model=ModelConfig(model, MODELS[model]), algorithm=AlgorithmConfig(algorithm, ARGS.get(algorithm, {})),
        training=TrainingConfig(rounds=2, batch_size=8, lr=0.05, momentum=0.9, weight_decay=1e-3,
                                participation=0.75, batched=batched))


# BNN-FedAvg's sign(W) and majority vote sign(Σ n_k sign(W_k)) turn a rounding-level difference in a weight near 0
# (a batched matmul or grouped convolution sums in another order than the per-client one) into a flipped binary
# weight: with trainer.batched_ops' rules on both models, and with PyTorch's own vmap rules on the CNN. It is
# compared on the MLP under PyTorch's rules, which sum as the sequential loop does there; the rules themselves are
# checked against PyTorch's, values and gradients, in test_batched_ops.py.
CASES = [(a, m) for a in ALGORITHMS.names() for m in ("mlp", "cnn") if not (a == "bnn_fedavg" and m == "cnn")]
CASES += [(a, "tiny_mobilenet") for a in BN_ALGORITHMS]


@pytest.mark.parametrize(("algorithm", "model"), CASES)
def test_batched_round_loop_matches_sequential(algorithm, model, monkeypatch):
    if algorithm == "bnn_fedavg":
        monkeypatch.setattr(batched_ops, "_ROUTES", {})
    try:
        seq = simulate(_config(algorithm, False, model))
    except EdgemaskError as e:  # an algorithm that needs another model or dataset than this small run's
        pytest.skip(f"{algorithm} does not run on digits/{model}: {e}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bat = simulate(_config(algorithm, True, model))
    fallbacks = [str(w.message) for w in caught if "falls back" in str(w.message)]
    assert not fallbacks  # every registered algorithm trains batched on the CPU (FedPeWS's draws: LocalTask.noise)
    sizes = {c.num_train for c in seq.algorithm.dataset.clients}
    assert len(sizes) > 1  # unequal clients: padding is exercised
    assert [(r["round"], r["client"], r["metric"]) for r in seq.history] == \
           [(r["round"], r["client"], r["metric"]) for r in bat.history]
    for a, b in zip(seq.history, bat.history):
        assert b["value"] == pytest.approx(a["value"], rel=1e-5, abs=1e-5, nan_ok=True), (a, b)
    assert _max_diff(seq.algorithm.shared_state(), bat.algorithm.shared_state()) <= TOL
    for cid in seq.algorithm.client_ids:
        s, b = seq.algorithm.client_state(cid), bat.algorithm.client_state(cid)
        for f in dataclasses.fields(s):
            va, vb = getattr(s, f.name), getattr(b, f.name)
            if isinstance(va, dict) and all(isinstance(v, torch.Tensor) for v in va.values()):
                assert _max_diff(va, vb) <= TOL, (cid, f.name)
    keys = ("bytes_up", "bytes_down", "flops_train", "mean_accuracy")
    assert {k: bat.summary[k] for k in keys} == pytest.approx({k: seq.summary[k] for k in keys}, rel=1e-6)


def _built(algorithm: str, model: str):
    """The algorithm built and set up for the small batched run, or the test skipped where it does not fit it."""
    from edgemask.trainer.simulation import build_algorithm

    try:
        return build_algorithm(_config(algorithm, True, model))
    except EdgemaskError as e:
        pytest.skip(f"{algorithm} does not run on digits/{model}: {e}")


@pytest.mark.parametrize(("algorithm", "model"), CASES)
def test_no_task_keeps_a_tensor_off_the_training_device(algorithm, model):
    # On a CUDA device a task that captured a CPU tensor in its closures would fall back to the sequential loop.
    # The "meta" device mixes with the CPU tensors exactly as CUDA would, so the probe (one vmapped step on the
    # device) catches such a task here without a GPU: every phase of every algorithm must pass it.
    from edgemask.trainer.batched import _probe

    algo = _built(algorithm, model)  # set up once: its device tables exist (a second set-up would make them again)
    cid = algo.client_ids[0]
    data = algo.dataset.client(cid)
    task, phase = algo.local_task(cid, 0), 0
    while task is not None:
        got = _probe(task, (data.train_x, data.train_y), 8, torch.device("meta"))
        assert not isinstance(got, str), f"phase {phase}: {got}"
        res = local_train(task, data.train_x, data.train_y, batch_order(data.num_train, task.epochs, 0, 0, 0), 8)
        phase += 1
        task = algo.next_phases(0, phase, [(cid, res)])[0]
    assert phase >= 1


@pytest.mark.parametrize(("algorithm", "model"), CASES)
def test_no_eval_model_reads_a_tensor_off_the_evaluation_device(algorithm, model):
    # The batched evaluation runs on the training device: every tensor a client's EvalModel reads must be in
    # the model (FedMask's and HeteroFL's masked models carry the global weights). On the "meta" device a
    # captured CPU tensor fails as it would on CUDA.
    from torch.func import vmap

    from edgemask.trainer.batched import _evaluate_stacked, eval_groups
    from edgemask.trainer.simulation import train_clients

    algo = _built(algorithm, model)
    trained = train_clients(algo, algo.client_ids, 0)  # one round: personal state where the algorithm keeps one
    algo.aggregate(0, algo.client_updates(0, trained))
    measures = algo.eval_models(list(algo.client_ids))  # a list, or {measure: list} (FedMask's two)
    tests = [(d.test_x, d.test_y) for d in map(algo.dataset.client, algo.client_ids)]
    for models in measures.values() if isinstance(measures, dict) else [measures]:
        for idx in eval_groups(models):
            correct, loss, n = _evaluate_stacked(vmap(models[idx[0]].forward), [models[i] for i in idx],
                                                 [tests[i] for i in idx], 16, torch.device("meta"))
            assert correct.device.type == loss.device.type == "meta" and correct.shape == (len(idx),)


def test_shared_eval_tensors_go_to_the_device_once_and_personal_ones_stay():
    # The global weights every masked model holds as one object are moved once per evaluate_many, not once per
    # chunk (on CUDA a chunk of 2 full-width VGG16 clients re-sent 59 MB each time); "meta" stands in for CUDA.
    from edgemask.trainer.batched import _shared_on
    from edgemask.trainer.records import EvalModel

    W, fwd = torch.randn(4, 3), lambda p, b, x: x
    models = [EvalModel({"w": W, "bits:w": torch.full((4, 1), i, dtype=torch.uint8)}, {}, fwd) for i in range(3)]
    moved = _shared_on(models, torch.device("meta"))
    assert all(m.params["w"] is moved[0].params["w"] for m in moved) and moved[0].params["w"].device.type == "meta"
    assert [m.params["bits:w"] for m in moved] == [m.params["bits:w"] for m in models]  # the same CPU tensors
    assert list(moved[1].params) == ["w", "bits:w"] and models[0].params["w"] is W  # the inputs are untouched
    assert _shared_on(models, torch.device("cpu")) is models


def test_a_cuda_evaluation_chunk_is_sized_by_the_gpus_free_memory(monkeypatch):
    from edgemask.trainer import batched

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev=None: (40 << 30, 80 << 30))
    assert batched.eval_memory_budget(torch.device("cuda")) == 10 << 30
    assert batched.eval_memory_budget(torch.device("cpu")) == batched.EVAL_MEMORY_BUDGET
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev=None: (1 << 20, 80 << 30))
    assert batched.eval_memory_budget(torch.device("cuda")) == batched.EVAL_MEMORY_BUDGET


def test_clientprunings_top_k_stays_on_the_scores_device():
    # ClientPruning's top-k runs where the engine trained (CUDA on a GPU run); "meta" stands in for it
    from edgemask.trainer.algorithms.fedmask import top_fraction_rows

    score = torch.tensor([[0.1, 0.9, 0.5, 0.3, 0.7], [5.0, 4.0, 3.0, 2.0, 1.0]])
    assert top_fraction_rows(score, 0.4).tolist() == [[False, True, False, False, True],
                                                      [True, True, False, False, False]]
    assert top_fraction_rows(score.to("meta"), 0.4).device.type == "meta"


def test_padded_data_is_kept_only_when_it_comes_again(monkeypatch):
    # ClientPruning pads each chunk once: keeping those filled the cache with the device count (2,000 devices of
    # IC-CIFAR10 at w1/2). Data that come again (a full-participation round, an evaluation part) are kept.
    from edgemask.trainer import batched

    monkeypatch.setattr(batched, "_PADDED", {})
    monkeypatch.setattr(batched, "_ASKED", set())
    once = [(torch.ones(3, 2), torch.zeros(3, dtype=torch.long)), (torch.ones(1, 2), torch.ones(1, dtype=torch.long))]
    X, Y = batched._padded_data(once, torch.device("cpu"))
    assert X.shape == (2, 3, 2) and X[1, 1:].eq(0).all() and Y.tolist() == [[0, 0, 0], [1, 0, 0]]
    assert batched._PADDED == {}  # the first time: not kept
    X2, _ = batched._padded_data(once, torch.device("cpu"))
    assert len(batched._PADDED) == 1 and torch.equal(X2, X)  # the second: kept
    assert batched._padded_data(once, torch.device("cpu"))[0] is X2  # and read back
    other = [(torch.ones(2, 2), torch.zeros(2, dtype=torch.long))]
    for _ in range(3):  # a CPU evaluation's chunk: padded afresh every time, never kept
        batched._padded_data(other, torch.device("cpu"), keep=False)
    assert len(batched._PADDED) == 1


def test_device_is_cuda_only_when_present():
    from edgemask.errors import ConfigError
    from edgemask.trainer.devices import resolve_device

    assert resolve_device("cpu").type == "cpu"
    assert resolve_device("cuda").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ConfigError, match="valid: 'cpu', 'cuda'"):
        resolve_device("tpu")


def test_asking_for_cuda_without_one_says_the_run_is_on_the_cpu():
    cfg = _config("fedavg", True)
    cfg = cfg.replace(training=dataclasses.replace(cfg.training, rounds=0, device="cuda"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        simulate(cfg)
    said = [str(w.message) for w in caught if "training.device" in str(w.message)]
    assert said == ([] if torch.cuda.is_available() else
                    [f"training.device 'cuda': this torch ({torch.__version__}) sees no CUDA device, so the clients "
                     f"train and evaluate on the CPU"])


def test_per_step_noise_is_each_clients_own_stream_in_both_loops():
    # a loss that uses the step's uniforms: batched must draw exactly what each client draws alone
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))

    def loss(p, c, x, y, b):
        logits = functional_call(model, {**p, **b}, (x * (c["u"] < 0.7).float(),))
        return F.cross_entropy(logits, y)

    sizes = [9, 4, 13]
    tasks = [_model_task(model, loss=loss, noise={"u": (6,)}, seed=100 + i) for i in range(3)]
    data = _clients(sizes)
    orders = [batch_order(n, 1, 0, 0, i) for i, n in enumerate(sizes)]
    got = _check_same(tasks, data, orders, 4, 0.0, 0.0)
    other = dataclasses.replace(tasks[0], seed=7)  # another stream: another result
    assert _max_diff(local_train(other, *data[0], orders[0], 4).trained, got[0].trained) > 1e-4


def test_chunk_size_counts_a_constant_every_client_shares_once():
    from edgemask.trainer.batched import clients_per_chunk

    frozen = torch.zeros(1000)  # 4,000 bytes, held by every client (FedMask's frozen weights)
    task = LocalTask({"m": torch.zeros(250)}, lend(), constants={"w": frozen})
    x = torch.zeros(10, 6)
    # per client: 3 × 1,000 (trainable) + 10 samples × (24 + 8) = 3,320 bytes (+ 4,000 when "w" is its own)
    assert clients_per_chunk(task, 10, x, 0, torch.device("cpu"), 100_000) == 100_000 // 7_320
    assert clients_per_chunk(task, 10, x, 0, torch.device("cpu"), 100_000, frozenset({"w"})) == 96_000 // 3_320
