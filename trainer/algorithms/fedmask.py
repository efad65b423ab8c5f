"""FedMask (Li et al., "FedMask: Joint Computation and Communication-Efficient Personalized Federated
Learning via Heterogeneous Masking", SenSys 2021), Algorithm 1.

* Frozen weights W, shared by every client through the seed (or a warm start); only masks are learned.
* Real-valued masks m^r; the feedforward runs the binary mask 1[σ(m^r) ≥ 0.5] (§3.3: "when transmitting m
  ... and performing the feedforward operation, the result from Equation 6 will be binarized"), and
  ∂L/∂m^r = Ψ ⊙ ∂L/∂m with Ψ = σ(m^r)(1 − σ(m^r)) (Eq. 7-8) and ∂L/∂m at that binary mask: σ′ straight through
  (:func:`binary_ste`). ``forward = "soft"`` runs W ⊙ σ(m^r) instead (a deviation, kept to measure it). Binarized
  at 0.5 for transmission and inference too (Eq. 3).
* One-shot pruning at initialization (§3.4, Alg. 1 lines 21-28): one epoch of mask updates, then in the last
  ``prune_last`` masked layers keep the largest ``prune_rate`` fraction of |Δ(W ⊙ m^r)| — the change, as the
  text says — and set the rest to zero, frozen for good.
* Structured sparsity (Eq. 9-10): loss + λ_R·R_g(m), group lasso over conv filters and input channels, FC rows
  and columns, so masks die in whole units that export can remove.
* LSTM partial mask (Table 3): W_o (the o-gate rows) real-valued and trained, shared by averaging; masks on the
  i, f, g gates.
* Personalization-preserving aggregation (§3.6, Fig. 7-8) into the server's one global mask m^T (Alg. 1 lines
  2 and 12): each element averaged over the round's uploads whose pruned structure keeps it (kept by one alone:
  that upload's value, the paper's "unchanged"), binarized at 0.5 (Eq. 3); an element no upload keeps stays as
  it was. Every selected device, sampled in the round the mask was formed or not, starts its next local update
  from the *current* m^T under its own structure, m^T ⊙ m_k (Alg. 1 line 11), so the downlink is 1 bit per
  element too. The device infers with its latest locally trained mask, which is what personalized accuracy is
  measured on (``local_mask``) and what the run directory stores; the mask the server sends back, m^T ⊙ m_k, is
  scored too (``returned_mask``; the paper does not say which one its figures use: docs/fedmask.md).

Choices the paper leaves open, stated here: the real-valued mask starts at m^r = s·(2m − 1) for the binary
mask m it is initialized from (Alg. 1 lines 14, 22), s = ``init_scale``; so σ(m^r) ≥ 0.5 ⇔ m = 1, and 0 where
pruned. In m^T ⊙ m_k, m_k's role is the structure (which elements the device keeps): on an element some upload
has kept, the start is m^T's value; on an element no upload has kept yet (before the first aggregation, or a
pruned-layer element only unsampled devices keep), m^T is still m^0 = 1, so the start is m_k itself, the
device's ClientPruning mask. Batch-norm running statistics are local to each client. Bytes up and down: every
mask element, 1 bit, packed; ClientPruning's upload (Alg. 1 line 28) once, as ``bytes_up_setup``. The group lasso
(Eq. 9-10) is taken on σ(m^r) whichever the forward. Every choice with its measured effect: docs/fedmask.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from edgemask.schema import setting
from edgemask.trainer.accounting import tensor_bytes
from edgemask.trainer.aggregation import average_state, personalization_preserving, stack_rows
from edgemask.trainer.algorithms.base import ALGORITHMS, Algorithm
from edgemask.trainer.device_store import record_bytes
from edgemask.trainer.devices import resolve_device
from edgemask.trainer.masks import (BitMasks, binarize, pack_rows, packed_masked_model, packed_nbytes,
                                    sigmoid_at_least, unpack_rows)
from edgemask.trainer.models.masking import MaskSite, dead_layers, effective_params
from edgemask.trainer.records import ClientState, ClientUpdate, EvalModel, LocalResult, LocalTask
from edgemask.trainer.task_functions import Fn, ModelContext, task_function
from edgemask.trainer.sampling import batch_order, drop_one_sample_batches

PRUNING_ROUND = 1 << 30  # shuffle-stream tag of the one-shot pruning epoch (distinct from every round)
PRUNING_CHUNK_BYTES = 512 << 20  # float32 scores of the devices one ClientPruning call trains, at most


FROZEN = "frozen:"  # the constants' prefix of the frozen weights W


FORWARDS = ("binary", "soft")  # FedMaskArgs.forward
RESTARTS = ("reset", "keep_agreeing")  # FedMaskArgs.restart
PRUNE_BY = ("delta", "magnitude")  # FedMaskArgs.prune_by
START_MASKS = ("structure", "product")  # FedMaskArgs.start_mask
VOTE_TIES = ("keep", "drop")  # FedMaskArgs.vote_tie


@dataclass(frozen=True)
class FedMaskArgs:
    prune_rate: float = 0.2  # p_r: fraction of mask elements kept in the pruned layers (§4.2)
    prune_last: int = 2  # L: one-shot pruning applies to the last L masked layers (paper: 8 for VGG16, 2 for HAR/NCP)
    lambda_r: float = 2e-4  # λ_R of Eq. 10 (2e-4: the paper's centralized MNIST study, §3.5 / Table 2)
    init_scale: float = 1.0  # s in m^r = s·(2m − 1)
    lstm_real_output_gate: bool = True  # Table 3: W_o real-valued
    # The local training's feedforward mask. "binary" (the paper, §3.3: "when transmitting m ... and performing
    # the feedforward operation, the result from Eq. 6 will be binarized"): W ⊙ 1[σ(m^r) ≥ 0.5], the gradient
    # σ′(m^r) ⊙ ∂L/∂m at the binary mask (Eq. 7-8, straight through). "soft" (a deviation, kept to measure it):
    # W ⊙ σ(m^r), the gradient of that soft forward.
    forward: str = setting("binary", choices=FORWARDS, what="value")
    # How a round's real-valued mask restarts from the binary start mask b = m^T ⊙ m_k (Alg. 1 line 14 leaves
    # m^r's magnitude open). "reset": m^r = s·(2b − 1) every round. "keep_agreeing": the device keeps its own last
    # trained scores where their sign agrees with b (1[m^r ≥ 0] = b), ±s elsewhere and in its first round.
    restart: str = setting("reset", choices=RESTARTS, what="value")
    # ClientPruning's score (§3.4 / Alg. 1 line 26). "delta": |Δ(W ⊙ m^r)| over the pruning epoch (§3.4's text:
    # the change the epoch made). "magnitude": |W ⊙ m^r| after it (Alg. 1 line 26: "preserving the largest p_r
    # portion of elements in |W_ij · m^r_ij|").
    prune_by: str = setting("delta", choices=PRUNE_BY, what="value")
    # The role of m_k in a round's start m^T ⊙ m_k (Alg. 1 line 11). "structure": m_k's pruning structure selects
    # the elements; on them the start is m^T's value (m_k itself where no upload has kept the element yet).
    # "product": the literal elementwise product of the binary masks, so an element ClientPruning turned off
    # never comes back.
    start_mask: str = setting("structure", choices=START_MASKS, what="value")
    # The server's vote (§3.6, Eq. 3 with τ = 0.5) on an exact tie (half of the uploads keeping an element set
    # it). "keep": 1 (Eq. 3's σ ≥ τ). "drop": 0.
    vote_tie: str = setting("keep", choices=VOTE_TIES, what="value")


def binary_ste(soft: torch.Tensor) -> torch.Tensor:
    """Eq. 3 in the forward, Eq. 7-8 in the backward: the value is the binary mask 1[σ(m^r) ≥ 0.5] exactly (the
    added ``soft − soft`` is an exact 0), the gradient is that of ``soft`` = σ(m^r), so ∂L/∂m^r = σ′(m^r) ⊙ ∂L/∂m
    with ∂L/∂m taken at the binary mask (a straight-through estimator, as in Piggyback)."""
    return binarize(soft).to(soft.dtype) + (soft - soft.detach())


def group_lasso(site: MaskSite, masks: dict[str, torch.Tensor]) -> torch.Tensor:
    """R_g for one layer (Eq. 9): Σ over output units ‖m_row‖₂ + Σ over input units ‖m_col‖₂.

    Conv (N, C, kh, kw): filters m[n,:,:,:] and channels m[:,c,:,:]; FC (rows, cols): rows and columns;
    LSTM: rows and columns of each masked gate matrix."""
    total = torch.zeros(())
    for w in site.weights:
        m = masks[w]
        flat = m.reshape(m.shape[0], m.shape[1], -1)  # (out, in, k)
        total = total + flat.pow(2).sum(dim=(1, 2)).add(1e-12).sqrt().sum()
        total = total + flat.pow(2).sum(dim=(0, 2)).add(1e-12).sqrt().sum()
    return total


class MaskedTask:
    """The functions of FedMask's local task on a model: real-valued masks m^r (trainable, by weight name) over
    the frozen weights (constants ``FROZEN`` + name), pruning structures in the constants by weight name, and
    with ``real_output_gate`` the LSTM's W_o rows trained directly (trainable ``o:`` + name, Table 3)."""

    def __init__(self, m: ModelContext, real_output_gate: bool, binary: bool = True) -> None:
        self.m, self.sites, self.binary = m, m.sites, binary
        self.mask_names = tuple(w for s in m.sites for w in s.weights)  # every mask, in the sites' order
        self.real_o = {w: s.hidden for s in m.sites if s.kind == "lstm" for w in s.weights} if real_output_gate \
            else {}

    def soft_masks(self, tr: dict[str, torch.Tensor], c: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """m = σ(m^r) (Eq. 6) of every mask, times its pruning structure where the constants hold one (pruned
        elements stay 0)."""
        return {w: torch.sigmoid(tr[w]) * c[w] if w in c else torch.sigmoid(tr[w]) for w in self.mask_names}

    def params_with_o(self, tr: dict[str, torch.Tensor], c: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        params = {k: c[FROZEN + k] for k in self.m.param_names}
        for w, h in self.real_o.items():
            params[w] = torch.cat([params[w][: 3 * h], tr[f"o:{w}"]], dim=0)
        return params

    def forward_masks(self, tr: dict[str, torch.Tensor], c: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The masks the feedforward runs: binary, 1[σ(m^r) ≥ 0.5] with the straight-through gradient of σ
        (:func:`binary_ste`, §3.3 and Eq. 7-8), or with ``binary`` False the soft σ(m^r) (a deviation); pruned
        elements 0 either way."""
        if not self.binary:
            return self.soft_masks(tr, c)
        out = {}
        for w in self.mask_names:
            m = binary_ste(torch.sigmoid(tr[w]))
            out[w] = m * c[w] if w in c else m
        return out

    def forward(self, tr: dict[str, torch.Tensor], c: dict[str, torch.Tensor], x: torch.Tensor,
                buffers: dict[str, torch.Tensor]) -> torch.Tensor:
        """The frozen weights under the forward masks (Eq. 2; binary by Eq. 3 and §3.3, or soft by Eq. 6). With
        binary masks a unit whose row is all zero is dead in that step: its bias and batch-norm affine are gated
        to zero (:func:`~edgemask.trainer.models.masking.effective_params`), as at inference and in export."""
        eff = effective_params(self.params_with_o(tr, c), self.forward_masks(tr, c), self.sites)
        return self.m.call(eff, buffers, x)


@task_function("fedmask.forward")
def masked_forward(m: ModelContext, real_output_gate: bool = True, binary: bool = True):
    """The task's forward (:meth:`MaskedTask.forward`)."""
    return MaskedTask(m, real_output_gate, binary).forward


@task_function("fedmask.group_lasso")
def group_lasso_term(m: ModelContext, lambda_r: float, real_output_gate: bool = True):
    """The task's regularizer: λ_R · R_g(m) over every masked layer (Eq. 10)."""
    task = MaskedTask(m, real_output_gate)

    def regularizer(tr: dict[str, torch.Tensor], c: dict[str, torch.Tensor]) -> torch.Tensor:
        soft = task.soft_masks(tr, c)
        return lambda_r * sum(group_lasso(site, soft) for site in task.sites)

    return regularizer


@ALGORITHMS.register("fedmask")
class FedMask(Algorithm):
    name = "fedmask"
    Args = FedMaskArgs
    uploads_alone = True  # a device's upload is its own scores binarized (client_updates): 1 bit of 32
    # the [algorithm.args] a collapse (a layer with no live unit) is named with: λ_R of Eq. 10 kills whole units,
    # p_r keeps few elements of the last layers (trainer.simulation.CollapseWatch; docs/fedmask.md, "Collapse")
    collapse_settings = ("lambda_r", "prune_rate")

    def client_state_bytes(self) -> int:
        """Its records in the device store (:meth:`_layouts`: masks in bits, the pruned layers' structure, its
        batch-norm statistics, with ``restart`` "keep_agreeing" its last scores m^r in float32) and, while its round
        lasts, the bits of the mask its first step ran."""
        shapes = {w: s.mask_shape(self.global_params[w]) for s in self.sites for w in s.weights}
        return (sum(map(record_bytes, self._layouts(shapes).values()))
                + sum(packed_nbytes(math.prod(s)) for s in shapes.values()))

    def _layouts(self, shapes: dict[str, tuple[int, ...]]) -> dict[str, dict]:
        """The device store's tables (:mod:`edgemask.trainer.device_store`) and their layouts: ClientPruning's
        pruning structure (the pruned masks only, bits), m_k and the mask the device infers with (bits), its
        batch-norm statistics and, restarting "keep_agreeing", its last scores m^r."""
        out = {"keep": BitMasks.layout(shapes, self._pruned()), "masks": BitMasks.layout(shapes),
               "local": BitMasks.layout(shapes),
               "buffers": {k: (tuple(v.shape), v.dtype) for k, v in self.global_buffers.items()}}
        if self.args.restart == "keep_agreeing":
            out["scores"] = {w: (tuple(s), torch.float32) for w, s in shapes.items()}
        return out

    def setup_bytes(self, devices: int, engine_pass) -> int:
        """ClientPruning's peak (:meth:`setup`): a chunk's trained scores (:meth:`_pruning_chunks`: float32, at most
        :data:`PRUNING_CHUNK_BYTES`), the engine's training of the chunk (whose freed blocks the tuned allocator
        keeps: :mod:`edgemask.trainer.allocator`), and each mask's top-k on the chunk's stacked scores (fresh
        blocks, larger than the kept ones): per element the stack, W ⊙ m^r, W ⊙ m^0 and σ (float32), the kept
        bool, and the top-k's values and indices of the ``prune_rate`` kept, of the largest mask."""
        sizes = [math.prod(s.mask_shape(self.global_params[w])) for s in self.sites for w in s.weights]
        scores = 4 * sum(sizes)
        chunk = min(devices, max(1, PRUNING_CHUNK_BYTES // max(scores, 1)))
        top_k = int(chunk * max(sizes, default=0) * (4 * 4 + 1 + 12 * self.args.prune_rate))
        return chunk * scores + engine_pass(chunk) + top_k

    def _pruned(self) -> list[str]:
        """The masks with a one-shot pruning structure: those of the last ``prune_last`` sites, in order."""
        pruned_sites = self.sites[-self.args.prune_last:] if self.args.prune_last > 0 else ()
        return [w for s in pruned_sites for w in s.weights]

    def setup(self) -> None:
        self.weights = {k: v for k, v in self.global_params.items()}  # frozen W
        masked = [w for s in self.sites for w in s.weights]
        self.mask_names = tuple(masked)  # every mask, in the sites' order
        shapes = {w: s.mask_shape(self.weights[w]) for s in self.sites for w in s.weights}
        self.pruned = self._pruned()  # the masks with a one-shot pruning structure
        ones = {w: torch.ones(shapes[w]) for w in masked}  # one tensor every client holds: stacked as a view
        # Per device, bits (trainer.masks.BitMasks, 1 bit an element): the pruning structure of the pruned masks
        # (an unpruned mask's reads as the shared ``ones``), ClientPruning's m_k (Alg. 1 line 6), the mask the
        # device infers with, and the mask a round's first step ran (for its FLOPs). A start m^r is computed from
        # them when the device is selected (:meth:`start_scores`), never stored for every device.
        # The first three live in the run's device store (off the heap, trainer.device_store), as do each device's
        # batch-norm statistics and, restarting "keep_agreeing", its last scores; the round's start only while its
        # round lasts, in RAM.
        layouts = self._layouts(shapes)
        self.keep = BitMasks(shapes, ones, self.store.table("keep", layouts["keep"]))
        self.masks = BitMasks(shapes, None, self.store.table("masks", layouts["masks"]))
        self.local = BitMasks(shapes, None, self.store.table("local", layouts["local"]))
        self.round_start = BitMasks(shapes)
        self.buffers = self.store.table("buffers", layouts["buffers"])
        self.scores = self.store.table("scores", layouts["scores"]) if "scores" in layouts else {}
        first = self._start_scores(ones, ones)
        # ClientPruning (Alg. 1 lines 21-28): one epoch of mask updates from the all-ones global mask m^0, plain
        # SGD, by the framework's engines (a chunk of devices together when training is batched, as the rounds
        # are); each chunk's top-k and binarization run on its stacked scores, and only its bits are kept.
        for part in self._pruning_chunks(shapes):
            self._client_pruning(part, first)
        # ClientPruning's upload (Alg. 1 line 28: "return m_k to server"), 1 bit per element, packed, per device:
        # before the first round, so in summary.json's ``bytes_up_setup``, not in a round's history.
        self.setup_bytes_up = len(self.client_ids) * sum(packed_nbytes(math.prod(s)) for s in shapes.values())
        # The server's global mask m^T (Alg. 1 line 2: m^0 = 1), and per mask where some upload has kept an
        # element (None: nowhere yet). A device's next start is m^T ⊙ m_k (:meth:`start_scores`).
        self.global_mask = {w: ones[w] for w in masked}
        self.covered: dict[str, torch.Tensor | None] = {w: None for w in masked}
        self.shared_start: dict[str, torch.Tensor] = {}  # an unpruned mask's start, m^T for every device
        self._packed: dict[tuple[str, str], tuple[torch.Tensor, torch.Tensor]] = {}  # _bits' (tensor, its bits)

    def _pruning_chunks(self, shapes: dict[str, tuple[int, ...]]) -> list[list[str]]:
        """The devices ClientPruning trains in one call: as many as :data:`PRUNING_CHUNK_BYTES` of their trained
        float32 scores allow (the engine stacks them further within its own budget)."""
        per_device = 4 * sum(math.prod(s) for s in shapes.values())
        step = max(1, PRUNING_CHUNK_BYTES // max(per_device, 1))
        ids = self.client_ids
        return [ids[s: s + step] for s in range(0, len(ids), step)]

    def _client_pruning(self, cids: list[str], first: dict[str, torch.Tensor]) -> None:
        """ClientPruning for ``cids``: one epoch of mask training from m^r = ``first`` (m^0 = 1, nothing pruned,
        no group lasso), then in the pruned masks the top ``prune_rate`` of the score kept (Alg. 1 line 26),
        m_k = 1[σ(m^r) ≥ 0.5] under it (Eq. 3), each device's kept as bits."""
        index = {cid: i for i, cid in enumerate(self.client_ids)}
        data = [self.dataset.client(cid) for cid in cids]
        orders = [batch_order(d.num_train, 1, self.cfg.run.seed, PRUNING_ROUND, index[cid])
                  for cid, d in zip(cids, data)]
        if self.drop_one_sample:  # training.one_sample_batch
            orders = drop_one_sample_batches(orders, self.cfg.training.batch_size)
        tasks = []
        for cid in cids:
            task = self._task(cid, first, {}, regularize=False)  # m^0: nothing pruned yet
            task.epochs = 1
            tasks.append(task)
        results = self.engine.train(tasks, [(d.train_x, d.train_y) for d in data], orders,
                                    self.cfg.training.batch_size)
        keep, bits = {}, {}
        dev = resolve_device(getattr(self.engine, "device", "cpu"))  # the top-k on the device that trained
        for w in self.mask_names:
            trained = stack_rows([res.trained[w] for res in results]).to(dev)  # (K, *shape)
            m = sigmoid_at_least(trained)  # Eq. 3, as bool
            if w in self.pruned:
                W = self._weight_rows(w).to(dev)
                after = W * trained
                # Alg. 1 line 26, |W ⊙ m^r| ("magnitude"), or §3.4, the change of W ⊙ m^r over the epoch ("delta")
                score = after.abs_() if self.args.prune_by == "magnitude" else after.sub_(W * first[w].to(dev)).abs_()
                k = top_fraction_rows(score, self.args.prune_rate)
                m &= k
                keep[w] = pack_rows(k, 1).cpu().unbind(0)
            bits[w] = pack_rows(m, 1).cpu().unbind(0)
        for i, (cid, res) in enumerate(zip(cids, results)):
            self.keep.set_packed(cid, {w: rows[i] for w, rows in keep.items()})
            self.masks.set_packed(cid, {w: rows[i] for w, rows in bits.items()})
            self.local.set_packed(cid, {w: rows[i] for w, rows in bits.items()})  # it infers with m_k until it trains
            self.buffers[cid] = res.buffers

    # -- the local task -------------------------------------------------------------------------------
    def _weight_rows(self, w: str) -> torch.Tensor:
        """The part of W a mask covers (the i, f, g rows of an LSTM weight)."""
        site = next(s for s in self.sites if w in s.weights)
        W = self.weights[w]
        return W[: 3 * site.hidden] if site.kind == "lstm" else W

    def _start_scores(self, masks: dict[str, torch.Tensor], keep: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The real-valued mask m^r a local update starts from (Alg. 1 line 14): ``±init_scale`` where the binary
        mask is 1 / 0, and 0 where pruned (a mask missing from ``keep`` has no pruned element). Works on one
        client's masks or on the clients' stacked ``(K, ...)``."""
        s = self.args.init_scale
        return {w: (s * (2 * m - 1)) * keep[w] if w in keep else s * (2 * m - 1) for w, m in masks.items()}

    def _task(self, cid: str, start: dict[str, torch.Tensor], keep: dict[str, torch.Tensor],
              regularize: bool = True) -> LocalTask:
        """``start``: the scores m^r (:meth:`_start_scores`), trained by the loops on their own copies; ``keep``:
        the pruning structure of the masks that have one (a mask without keeps every element, and multiplying
        by its all-ones structure would change nothing but the time: half of a step's large products). Every
        client's task names the same functions and settings (``fedmask.forward``, ``fedmask.group_lasso``): one kind
        of task to the batched engine."""
        trainable = dict(start)
        real_o = self._real_output_gates()
        for w in real_o:  # Table 3: W_o trained directly
            trainable[f"o:{w}"] = self.global_params[w][3 * self._hidden(w):].clone()
        grad_keep = dict(keep)
        real_o = self.args.lstm_real_output_gate
        regs = (Fn.of("fedmask.group_lasso", lambda_r=self.args.lambda_r, real_output_gate=real_o),
                ) if regularize and self.args.lambda_r > 0 else ()
        # The frozen weights ride in the constants (the same tensors for every client: stacked as a stride-0 view,
        # never copied on the CPU), so a task captures no tensor and trains on whatever device the loop uses.
        constants = {**keep, **{FROZEN + k: v for k, v in self.global_params.items()}}
        fwd = Fn.of("fedmask.forward", real_output_gate=real_o, binary=self.args.forward == "binary")
        return LocalTask(trainable, self.model_spec, fwd, regs,
                         constants=constants, buffers=self._buffers(cid), epochs=self.cfg.training.local_epochs,
                         lr=self.cfg.training.lr, grad_keep=grad_keep)

    def _buffers(self, cid: str) -> dict[str, torch.Tensor]:
        """The device's batch-norm statistics: its own once it has trained (ClientPruning's), the server's before."""
        own = self.buffers.get(cid)
        return own if own is not None else {k: v.clone() for k, v in self.global_buffers.items()}

    def _hidden(self, w: str) -> int:
        return next(s.hidden for s in self.sites if w in s.weights)

    def _real_output_gates(self) -> list[str]:
        if not self.args.lstm_real_output_gate:
            return []
        return [w for s in self.sites if s.kind == "lstm" for w in s.weights]

    def returned_mask(self, cid: str) -> dict[str, torch.Tensor]:
        """The binary mask the server sends device ``cid`` (§3.6: "the updated binary masks ... will be sent back
        to devices"; Alg. 1 line 11): the current global mask under the device's structure, m^T ⊙ m_k (see the
        module docstring for an element no upload has kept yet: m_k itself). Float 0 / 1 (:meth:`returned_bits`
        unpacked)."""
        return {w: unpack_rows(b, self.masks.shapes[w]) for w, b in self.returned_bits(cid).items()}

    def returned_bits(self, cid: str) -> dict[str, torch.Tensor]:
        """:meth:`returned_mask` as packed bits, computed on bits: ``(c ∧ m^T) ∨ (¬c ∧ m_k)`` under the pruning
        structure, c where some upload has kept the element; m^T ∧ m_k with ``start_mask`` "product"."""
        own, keep, out = self.masks.packed(cid), self.keep.packed(cid), {}
        for w, m_k in own.items():
            covered = self.covered[w]
            if self.args.start_mask == "product":  # the literal product of the binary masks (m^0 = 1)
                out[w] = self._bits("global", w, self.global_mask[w]) & m_k
            elif covered is None:  # m^0 ⊙ m_k = m_k
                out[w] = m_k
            elif w not in self.pruned:  # every upload keeps every element: m^T itself
                out[w] = self._bits("global", w, self.global_mask[w])
            else:
                c = self._bits("covered", w, covered)
                out[w] = ((c & self._bits("global", w, self.global_mask[w])) | (~c & m_k)) & keep[w]
        return out

    def _bits(self, kind: str, w: str, t: torch.Tensor) -> torch.Tensor:
        """``pack_rows(t)`` of the server's mask ``kind`` of ``w``, packed once for as long as it is that tensor."""
        held = self._packed.get((kind, w))
        if held is None or held[0] is not t:
            held = self._packed[(kind, w)] = (t, pack_rows(t))
        return held[1]

    def start_scores(self, cid: str) -> dict[str, torch.Tensor]:
        """The real-valued masks m^r the device's next local update starts from (Alg. 1 lines 11 and 14): the
        returned mask m^T ⊙ m_k (:meth:`returned_mask`) as ±``init_scale``, 0 where pruned; with ``restart``
        "keep_agreeing", the device's own last scores where their sign agrees with it. An unpruned mask every
        upload keeps whole, so after the first aggregation all devices start from one tensor under "reset"
        (stacked as a view)."""
        keep, start = self.keep[cid], {}
        bits = self.returned_bits(cid)
        own = self.scores.get(cid) if self.args.restart == "keep_agreeing" else None
        for w, packed in bits.items():
            if own is None and w in self.shared_start and self.args.start_mask == "structure":
                start[w] = self.shared_start[w]  # its bits need no unpacking
                continue
            b = unpack_rows(packed, self.masks.shapes[w])
            if own is not None:
                reset = self._start_scores({w: b}, {w: keep[w]})[w]
                agree = (own[w] >= 0).to(b.dtype).eq(b) & keep[w].bool()
                start[w] = torch.where(agree, own[w], reset)
            else:  # m^T ⊙ m_k (m_k itself before any upload kept the element)
                start[w] = self._start_scores({w: b}, {w: keep[w]})[w]
        self.round_start.set_packed(cid, bits)
        return start

    def device_task(self, cid: str | None, state: ClientState) -> LocalTask:
        """A round's step from what the run directory keeps of the device: its scores start from its stored binary
        mask (Alg. 1 line 14, ±``init_scale``), and the pruned layers' structure is read as that mask (the run
        keeps m_k only as the mask it infers with, a subset of the structure). The values differ from a real
        round's start; the tensors, their shapes and the step's operations do not, so its cost is the round's. The
        dense baseline (``cid`` None): the step from m^0 = 1, ClientPruning's first epoch without the group lasso's
        pruned structure."""
        self.weights = dict(self.global_params)
        shapes = {w: s.mask_shape(self.weights[w]) for s in self.sites for w in s.weights}
        masks = {w: state.masks[w].float() if w in state.masks else torch.ones(shapes[w]) for w in shapes}
        keep = {w: masks[w].bool() for w in self._pruned()} if cid is not None else {}
        self.buffers = {cid or "dense": dict(state.params) or dict(self.global_buffers)}
        return self._task(cid or "dense", self._start_scores(masks, keep), keep)

    def local_task(self, cid: str, rnd: int) -> LocalTask:
        # the pruning structure as bool: the task multiplies by it (the same values as float 0 / 1), a quarter the bytes
        return self._task(cid, self.start_scores(cid), self.keep.unpacked(cid, self.pruned, torch.bool))

    def client_updates(self, rnd: int, results: list[tuple[str, LocalResult]]) -> list[ClientUpdate]:
        """Every client's upload, Eq. 3's binarization of σ(m^r) (and the pruned layers' structure) done once on
        the clients' stacked scores: the batched loop's results are rows of one tensor, read in place
        (``stack_rows``). Elementwise ops, so each client's masks are what it alone would get."""
        if not results:
            return []
        rows = {}
        for w in self.mask_names:
            bits = sigmoid_at_least(stack_rows([res.trained[w] for _, res in results]))  # Eq. 3, bool
            if w in self.pruned:
                bits &= unpack_rows(torch.stack([self.keep.packed(cid)[w] for cid, _ in results]), bits.shape[1:],
                                    torch.bool)
            rows[w] = bits
        packed = {w: pack_rows(r, 1) for w, r in rows.items()}
        return [self._upload(cid, res, {w: r[i] for w, r in rows.items()}, {w: p[i] for w, p in packed.items()})
                for i, (cid, res) in enumerate(results)]

    def _upload(self, cid: str, result: LocalResult, masks: dict[str, torch.Tensor],
                packed: dict[str, torch.Tensor]) -> ClientUpdate:
        """The client's new binary masks (``packed``: the same, as bits) become its inference masks and its upload
        (1 bit each, packed)."""
        o = {k: v for k, v in result.trained.items() if k.startswith("o:")}
        self.buffers[cid] = result.buffers
        self.local.set_packed(cid, packed)
        if self.args.restart == "keep_agreeing":
            self.scores[cid] = {w: result.trained[w].detach().clone() for w in masks}
        size = sum(p.nbytes for p in packed.values()) + tensor_bytes(o)  # the same both ways
        return ClientUpdate(cid, result.num_samples, masks, bytes_up=size, bytes_down=size, train_loss=result.loss,
                            samples_seen=result.samples_seen, extra={"o": o})

    def aggregate(self, rnd: int, updates: list[ClientUpdate]) -> None:
        """m^{T+1} from the round's uploads (Alg. 1 line 12, §3.6): one global mask, each element averaged over
        the uploads that keep it and binarized (Eq. 3, τ = 0.5); elements no upload keeps stay m^T."""
        for w in self.global_mask if updates else ():
            masks = stack_rows([u.payload[w] for u in updates])
            if w not in self.pruned:
                # Every upload keeps every element: §3.6's average over the clients that keep it is the plain
                # average, written so (the same bits), and the whole mask is covered.
                merged = self._vote(masks.sum(0) / torch.full(masks.shape[1:], float(len(updates))))
                self.global_mask[w] = merged
                if self.covered[w] is None:
                    self.covered[w] = torch.ones(merged.shape, dtype=torch.bool)
                self.shared_start[w] = self._start_scores({w: merged}, {})[w]
                continue
            keep = unpack_rows(torch.stack([self.keep.packed(u.client_id)[w] for u in updates]),
                               masks.shape[1:], torch.bool)  # (K, *shape)
            merged, kept = personalization_preserving(self.global_mask[w], masks, keep)
            self.global_mask[w] = self._vote(merged)
            covered = self.covered[w]
            self.covered[w] = kept if covered is None else covered | kept
        self.round_start.clear()  # the round's FLOPs are counted (simulation.RoundCosts, before the aggregate)
        real_o = self._real_output_gates()
        if real_o:
            avg = average_state([u.extra["o"] for u in updates], [u.num_samples for u in updates])
            for w in real_o:
                h = self._hidden(w)
                self.global_params[w] = torch.cat([self.global_params[w][: 3 * h], avg[f"o:{w}"]], dim=0)

    def _vote(self, mean: torch.Tensor) -> torch.Tensor:
        """Eq. 3 on the averaged uploads: 1 where the mean is ≥ 0.5 (``vote_tie`` "keep") or > 0.5 ("drop")."""
        return binarize(mean) if self.args.vote_tie == "keep" else (mean > 0.5).to(torch.float32)

    # -- evaluation and storage -----------------------------------------------------------------------
    def eval_masks(self, cid: str) -> dict[str, torch.Tensor]:
        """The mask it infers with, as bool (for the accounting: kept parameters)."""
        return self.local.unpacked(cid, list(self.mask_names), torch.bool)

    def dead_layers(self, cid: str) -> list[str]:
        """From the bits of m_k (no unpacking where a layer's rows are whole bytes: every 400-device evaluation
        checks every device)."""
        return dead_layers(self.sites, self.mask_names, lambda site: self.local.unit_alive(cid, site))

    def eval_models(self, cids: list[str]) -> dict[str, list[EvalModel]]:
        """Two measures. ``local_mask``, the personalized model: W ⊙ m (Eq. 2) with the device's last locally
        trained binary mask (``accuracy`` in the history); ``returned_mask``: the mask the server sends back,
        m^T ⊙ m_k (:meth:`returned_mask`), with the device's own batch-norm statistics."""
        ctx, w = self.model_context, self.global_params  # masks as bits, unpacked a chunk of devices at a time
        bufs = {cid: self.buffers[cid] for cid in cids}  # the device's statistics, read once for both measures
        return {"local_mask": [packed_masked_model(ctx, w, self.local.packed(cid), bufs[cid]) for cid in cids],
                "returned_mask": [packed_masked_model(ctx, w, self.returned_bits(cid), bufs[cid]) for cid in cids]}

    def train_masks(self, cid: str) -> dict[str, torch.Tensor]:
        """The binary mask the round's forward passes computed with, for the training FLOPs: binary forward,
        the union of the mask the round started from (m^T ⊙ m_k, its first step's) and the one it ended with
        (the upload): an element either step ran counts (a unit alive only in between is not seen). Soft
        forward: σ(m^r) > 0 everywhere, so every element the pruning structure keeps ran. As bool, the union taken
        on bits."""
        names = list(self.mask_names)
        if self.args.forward == "soft":
            return self.keep.unpacked(cid, names, torch.bool)
        local = self.local.packed(cid)
        start = self.round_start.packed(cid) if cid in self.round_start else local
        return {w: unpack_rows(start[w] | local[w], self.local.shapes[w], torch.bool) for w in names}

    def client_state(self, cid: str) -> ClientState:
        return ClientState(masks=dict(self.local[cid]), params=dict(self.buffers[cid]))

    def summary_extra(self) -> dict:
        kept = {cid: self.local.count(cid) for cid in self.client_ids}
        total = sum(math.prod(s) for s in self.local.shapes.values())
        return {"mask_density": float(np.mean([k / total for k in kept.values()])),
                "bytes_up_setup": self.setup_bytes_up}


def top_fraction_rows(score: torch.Tensor, fraction: float) -> torch.Tensor:
    """Bool ``(K, *shape)``: in each row ``score[i]`` of the clients' stacked scores, exactly round(fraction·n) (at
    least 1) largest entries kept, in one ``topk``."""
    K = score.shape[0]
    n = score[0].numel()
    k = max(1, int(round(fraction * n)))
    idx = torch.topk(score.reshape(K, n), k, dim=1, sorted=False).indices  # the set topk keeps; its order unused
    return torch.zeros(K, n, dtype=torch.bool, device=score.device).scatter_(1, idx, True).reshape(score.shape)
