"""FedSelect (Tamirisa et al., "FedSelect: Customized Selection of Parameters for Fine-Tuning during
Personalized Federated Learning", 2023), Algorithms 1 (GradLTN) and 2 (FedSelect).

Each round, every sampled client k, starting from its model θ_0 = θ_k^{t−1}:

* GradLTN(θ_0, L, r = 1 − p) (Alg. 1): m_0 = 1; iteration i trains E epochs with gradients masked by m_i; then
  γ = |θ_trained − θ_0| ⊙ m_i and m_{i+1} keeps the largest (1 − r) = p fraction of the m_i candidates (over the
  whole model); the model is reset to θ_0. After L iterations m_L marks the personal parameters v_k = θ_0 ⊙ m_L;
  the rest u = θ_0 ⊙ ¬m_L is shared. (Alg. 1's training after computing m_L is skipped: it returns θ_0.)
* LocalAlt (Pillutla et al., 2022): a pass over v_k (u frozen), then a pass over u (v_k frozen), each
  ``localalt_epochs`` epochs.
* The server averages each shared position over the clients that share it (mask 0 there), weighted by sample
  count (:func:`shared_average`); a position no sampled client shares keeps θ_G. Each sampled client then holds
  θ_k ⊙ ¬m_k = θ_G ⊙ ¬m_k and θ_k ⊙ m_k = v_k^+.

Choices stated here: a client not sampled in a round keeps its personal parameters and takes θ_G on its shared
ones (Alg. 2's m_G branch only matters under partial participation); a never-sampled client uses θ_G. So θ_k is
where(m_k, v_k, θ_G) at every moment: the run's device store keeps m_k (``personal``, bits) and v_k (``models``, the
whole tensors as the client last left them), and θ_k is built from them and the current θ_G when it is used. Batch-norm
running statistics are the client's own: its local training resumes from them, and it is evaluated and saved
(its personalized model) with them; the server averages them like FedAvg's for the clients never sampled.
The paper's backbone is an ImageNet-pretrained ResNet18, which cannot be downloaded here: ``init_weights`` loads a
local file (safetensors, or a ``torch.load``-able state dict read with ``weights_only=True``; torchvision's ResNet
names are mapped to the zoo's), from scratch by default.
The paper's setting: 10 clients, s = 2 or 4 classes each, 20 train / 100 test samples per class
(``data.options`` ``train_per_class``/``test_per_class``), L = 5, E = 5, LocalAlt 5 epochs, p ∈ {0.25, 0.5, 0.75}.
"""

from __future__ import annotations

import pickle
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError

from edgemask.errors import ConfigError
from edgemask.schema import setting
from edgemask.trainer.accounting import mask_bytes, state_layout, tensor_bytes
from edgemask.trainer.aggregation import average_buffers, stack_rows
from edgemask.trainer.algorithms.base import ALGORITHMS, Algorithm
from edgemask.trainer.device_store import record_bytes
from edgemask.trainer.records import ClientState, ClientUpdate, EvalModel, LocalResult, LocalTask

Tensors = dict[str, torch.Tensor]


@dataclass(frozen=True)
class FedSelectArgs:
    # personalization rate: GradLTN keeps a fraction p of the candidates each iteration (r = 1 − p)
    p: float = setting(0.5, above=0, below=1)
    L: int = setting(5, minimum=1)  # GradLTN iterations
    E: int = 5  # epochs per GradLTN iteration
    localalt_epochs: int = 5  # epochs of each LocalAlt pass (v_k, then u)
    init_weights: str = ""  # a local weights file (pretrained backbone); empty: from scratch


def top_candidates(gamma: Tensors, candidates: Tensors, keep: float) -> Tensors:
    """The largest ``keep`` fraction (rounded, at least 1) of ``gamma`` among the candidate elements (mask 1),
    over all tensors together. Returns boolean masks."""
    stacked = top_candidates_many({n: g.unsqueeze(0) for n, g in gamma.items()},
                                  {n: c.unsqueeze(0) for n, c in candidates.items()}, keep)
    return {n: m[0] for n, m in stacked.items()}


def top_candidates_many(gamma: Tensors, candidates: Tensors, keep: float) -> Tensors:
    """:func:`top_candidates` of K clients at once, on their stacked ``(K, *shape)`` tensors: one top-k over each
    client's row of all its tensors (its own selection, as alone), one op for clients with as many candidates."""
    names = list(gamma)
    K = gamma[names[0]].shape[0]
    flat_g = torch.cat([gamma[n].reshape(K, -1) for n in names], dim=1)
    flat_c = torch.cat([candidates[n].reshape(K, -1).bool() for n in names], dim=1)
    score = torch.where(flat_c, flat_g.float(), torch.full_like(flat_g, -1.0, dtype=torch.float32))
    n_keep = [max(1, int(round(keep * c))) for c in flat_c.sum(1).tolist()]
    out = torch.zeros_like(flat_c)
    for k in sorted(set(n_keep)):  # clients with as many candidates: one top-k over their rows
        rows = [i for i, n in enumerate(n_keep) if n == k]
        sel = torch.tensor(rows)
        # a set, not a ranking: unsorted (PyTorch selects the same k either way, then sorts them on request)
        out[sel[:, None], torch.topk(score[sel], k, dim=1, sorted=False).indices] = True
    res, off = {}, 0
    for n in names:
        size = gamma[n][0].numel()
        res[n] = out[:, off: off + size].reshape(gamma[n].shape)
        off += size
    return res


def shared_average(global_value: torch.Tensor, values: list[torch.Tensor], personal: list[torch.Tensor],
                   weights: list[float]) -> torch.Tensor:
    """Each element averaged over the clients that share it (personal mask 0 there), weighted; elements no
    client shares keep ``global_value``."""
    share = [(~m).float() * w for m, w in zip(personal, weights)]
    den = torch.stack(share).sum(0)
    num = torch.stack([v.float() * s for v, s in zip(values, share)]).sum(0)
    return torch.where(den > 0, num / den.clamp(min=1e-12), global_value)


def _torchvision_name(name: str) -> str:
    name = re.sub(r"^layer(\d)\.(\d)\.", r"layer\1_\2.", name)
    name = name.replace("downsample.0.", "short_conv.").replace("downsample.1.", "short_bn.")
    return re.sub(r"^fc\.", "out.", name)


def load_init_weights(path: str, params: Tensors, buffers: Tensors) -> tuple[int, list[str]]:
    """Copy the tensors of a local weights file into ``params``/``buffers`` (in place) where name and shape fit.
    Returns (how many loaded, names skipped for their shape)."""
    f = Path(path)
    if not f.is_file():
        raise ConfigError(f"fedselect: algorithm.args.init_weights {path!r}: file not found")
    try:  # torch.load's weights_only refuses a pickle that would run code; that refusal is one line here
        if f.suffix == ".safetensors":
            from safetensors.torch import load_file
            state = load_file(str(f))
        else:
            with warnings.catch_warnings():  # torch warns (2 lines) of a pickle protocol it then refuses
                warnings.simplefilter("ignore", UserWarning)
                state = torch.load(str(f), map_location="cpu", weights_only=True)
            state = state.get("state_dict", state) if isinstance(state, dict) else state
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, OSError, SafetensorError) as e:
        raise ConfigError(f"fedselect: algorithm.args.init_weights {path!r}: cannot be read as a state dict of "
                          f"tensors ({type(e).__name__}; a pickle is read only if it holds nothing but tensors); "
                          "give a .safetensors file") from None
    if not isinstance(state, dict):
        raise ConfigError(f"fedselect: {path}: not a state dict of tensors")
    loaded, skipped = 0, []
    for k, v in state.items():
        name = k if (k in params or k in buffers) else _torchvision_name(k)
        target = params if name in params else buffers if name in buffers else None
        if target is None or not torch.is_tensor(v):
            continue
        if tuple(v.shape) != tuple(target[name].shape):
            skipped.append(name)
            continue
        target[name] = v.detach().to(target[name].dtype).clone()
        loaded += 1
    if loaded == 0:
        raise ConfigError(f"fedselect: {path}: no tensor matches the model's names and shapes")
    return loaded, skipped


@ALGORITHMS.register("fedselect")
class FedSelect(Algorithm):
    name = "fedselect"
    Args = FedSelectArgs

    def client_state_bytes(self) -> int:
        """Its records in the device store (:meth:`_layouts`): its personal mask m_k in bits, v_k and its batch-norm
        statistics."""
        return sum(map(record_bytes, self._layouts().values()))

    def _layouts(self) -> dict[str, dict]:
        """The device store's tables: m_k (bool, packed), v_k (the client's model as it last left it: θ_k takes its
        values where m_k is set) and the client's own batch-norm statistics."""
        return {"personal": {k: (tuple(v.shape), torch.bool) for k, v in self.global_params.items()},
                "models": state_layout(self.global_params), "buffers": state_layout({}, buffers=self.global_buffers)}

    def setup(self) -> None:
        self.init_report = {}
        if self.args.init_weights:
            n, skipped = load_init_weights(self.args.init_weights, self.global_params, self.global_buffers)
            self.init_report = {"init_weights": self.args.init_weights, "loaded": n, "skipped_shape": skipped}
        layouts = self._layouts()
        self.personal = self.store.table("personal", layouts["personal"])  # m_k, as θ_k holds it
        self.models = self.store.table("models", layouts["models"])  # v_k
        self.buffers = self.store.table("buffers", layouts["buffers"])
        self.round_state: dict[str, dict] = {}  # a round's GradLTN state per client, until its upload
        self.uploaded: dict[str, Tensors] = {}  # the masks uploaded since the last aggregate (until it)

    def client_model(self, cid: str) -> Tensors:
        """θ_k = where(m_k, v_k, θ_G); θ_G for a client that has not uploaded yet."""
        m = self.personal.get(cid)
        if m is None:
            return self.global_params
        v = self.models[cid]
        return {k: torch.where(m[k], v[k], g) for k, g in self.global_params.items()}

    def personal_mask(self, cid: str) -> Tensors | None:
        """The client's latest m_k (None before its first upload)."""
        m = self.uploaded.get(cid)
        return m if m is not None else self.personal.get(cid)

    def _task(self, start: Tensors, buffers: Tensors, keep: Tensors, epochs: int) -> LocalTask:
        return LocalTask(trainable=dict(start),  # the loops train copies: θ_0 itself stays as it is
                         model=self.model_spec, buffers=dict(buffers), epochs=epochs,
                         lr=self.cfg.training.lr, grad_keep={k: m.float() for k, m in keep.items()})

    def local_task(self, cid: str, rnd: int) -> LocalTask:
        theta0 = {k: v.clone() for k, v in self.client_model(cid).items()}
        buf0 = self.client_buffers(cid)
        ones = {k: torch.ones_like(v, dtype=torch.bool) for k, v in theta0.items()}
        self.round_state[cid] = {"theta0": theta0, "buf0": buf0, "mask": ones}
        return self._task(theta0, buf0, ones, self.args.E)  # GradLTN iteration 0, m_0 = 1

    def next_phases(self, rnd: int, phase: int, results: list[tuple[str, LocalResult]]) -> list[LocalTask | None]:
        """GradLTN's pruning after iteration ``phase`` − 1 (Alg. 1: γ = |θ_trained − θ_0| ⊙ m_i, keep the largest p
        of the candidates, reset to θ_0) for the phase's clients at once, on their stacked tensors (read in place
        from the batched loop's results); then LocalAlt's two passes."""
        L = self.args.L
        if phase <= L:  # GradLTN
            states = [self.round_state[cid] for cid, _ in results]
            if not states:
                return []
            gamma = {k: (stack_rows([res.trained[k] for _, res in results])
                         - stack_rows([st["theta0"][k] for st in states])).abs() for k in states[0]["theta0"]}
            masks = top_candidates_many(gamma, {k: stack_rows([st["mask"][k] for st in states]) for k in gamma},
                                        self.args.p)
            epochs = self.args.E if phase < L else self.args.localalt_epochs  # the last: LocalAlt on v_k
            out = []
            for i, st in enumerate(states):
                st["mask"] = {k: m[i] for k, m in masks.items()}
                out.append(self._task(st["theta0"], st["buf0"], st["mask"], epochs))
            return out
        if phase == L + 1:  # LocalAlt: u, from the v_k pass
            return [self._task(res.trained, res.buffers, {k: ~m for k, m in self.round_state[cid]["mask"].items()},
                               self.args.localalt_epochs) for cid, res in results]
        return [None] * len(results)

    def client_updates(self, rnd: int, results: list[tuple[str, LocalResult]]) -> list[ClientUpdate]:
        return [self._upload(cid, res) for cid, res in results]

    def _upload(self, cid: str, result: LocalResult) -> ClientUpdate:
        """The shared part of θ_k (4 bytes an element) and the personal mask m_k (1 bit an element)."""
        m = self.round_state.pop(cid)["mask"]
        self.uploaded[cid] = m
        self.buffers[cid] = result.buffers
        n_shared = sum(int((~v).sum()) for v in m.values())
        return ClientUpdate(cid, result.num_samples, {**result.trained, **result.buffers},
                            bytes_up=4 * n_shared + mask_bytes(m), bytes_down=tensor_bytes(self.global_params),
                            train_loss=result.loss, samples_seen=result.samples_seen, extra={"personal": m})

    def aggregate(self, rnd: int, updates: list[ClientUpdate]) -> None:
        """θ_G from the shared parts; then every client holds θ_G on its shared parameters (θ_k ⊙ ¬m_k = θ_G ⊙ ¬m_k,
        :meth:`client_model`) and on its personal ones v_k^+ (uploaded) or what it held (kept)."""
        masks = {**self.uploaded, **{u.client_id: u.extra["personal"] for u in updates}}
        trained = {u.client_id: u.payload for u in updates}
        # an upload that did not arrive (a deadline missed): the client keeps the model it held, under its new mask
        kept = {cid: self.client_model(cid) for cid in masks if cid not in trained and cid in self.personal}
        w = [float(u.num_samples) for u in updates]
        for k, g in self.global_params.items():
            self.global_params[k] = shared_average(g, [u.payload[k] for u in updates],
                                                   [u.extra["personal"][k] for u in updates], w)
        self.global_buffers = average_buffers(self.global_buffers, [u.payload for u in updates],
                                              [u.num_samples for u in updates])
        for cid, m in masks.items():
            src = trained.get(cid, kept.get(cid, self.global_params))
            self.personal[cid] = m
            self.models[cid] = {k: src[k] for k in self.global_params}
        self.uploaded.clear()

    def client_buffers(self, cid: str) -> Tensors:
        """The batch-norm statistics of the client's personalized model: its own from its last local training
        (where the next one resumes), the server's average for a client never sampled."""
        return self.buffers.get(cid, self.global_buffers)

    def eval_models(self, cids: list[str]) -> list[EvalModel]:
        return [EvalModel(self.client_model(cid), self.client_buffers(cid), self.model_context.call) for cid in cids]

    def client_state(self, cid: str) -> ClientState:
        """The personal parameters (where m_k keeps any element) and the client's own buffers: with the shared
        model they rebuild exactly the model it was evaluated with."""
        m = self.personal_mask(cid)
        if m is None:
            return ClientState()
        personal = {k: v for k, v in self.client_model(cid).items() if m[k].any()}
        return ClientState(params={**personal, **self.client_buffers(cid)})

    def summary_extra(self) -> dict:
        total = sum(v.numel() for v in self.global_params.values())
        frac = {cid: sum(int(v.sum()) for v in m.values()) / total
                for cid in self.client_ids if (m := self.personal_mask(cid)) is not None}
        return {"personal_fraction": frac, **self.init_report}
