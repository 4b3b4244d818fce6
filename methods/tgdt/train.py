"""TG-DT training (paper §3): per step a DT batch (``tasks_per_step`` training tasks ×
``seqs_per_task`` windows of one quality tier per task, each with its task-and-tier
description) for L_DT, and for the systems with alignment heads an expert batch of the same
tasks (one window each) for L_TBC
(symmetric InfoNCE over the batch) and L_TBM (matching) with BLIP-style negatives per positive
pair (description of τ, expert window of τ): a window of another task drawn ∝ softmax of the TBC
similarity (uniformly without TBC), a medium or random window of τ itself, and the description
of another task drawn the same way.

A step draws its batch from a generator seeded by (seed, step, rank), so a resumed run sees what
an uninterrupted one sees. With ``loss_balance=text_grad`` the alignment losses' weights are set
once, before the first step, from their gradient norms on the text encoder at initialisation
(:func:`balance`; the factors are a buffer of the model, so a checkpoint keeps them). With
``loss_balance=text_grad_running`` the same measurement is repeated after every
``balance_every`` steps (on the model as trained so far and the draws of the next steps) and
resets the factors; ``loss_balance=shared_grad_running`` measures on the same schedule on the
text encoder and the decoder blocks and takes, per loss, the smaller factor. The schedule
counts global steps, so a run resumed from a checkpoint re-measures where an uninterrupted one
does. Rows with padding (the first steps of an episode) are left-padded; padding never enters
L_DT.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from nshot.nn.lm import model_device
from nshot.train.session import Restored
from nshot.train.trainer import Recipe, train

from .config import TGDTConfig
from .data import OfflineData, load_data
from .model import Text, TGDTModel, Window


@dataclass
class DTBatch:
    window: Window
    target: torch.Tensor  # (B, K, act_dim) actions / the action bound
    texts: list[str] | None  # the unique descriptions
    text_index: torch.Tensor | None
    goal: torch.Tensor | None
    prompt: Window | None


@dataclass
class AlignBatch:
    expert: Window  # (A, K) one expert window per task
    negative_self: Window  # (A, K) a medium or random window of the same task
    text_index: torch.Tensor  # (A,) the tasks' expert descriptions among the step's texts
    tasks: np.ndarray


class Sampler:
    """Windows and descriptions drawn from the offline data."""

    def __init__(self, cfg: TGDTConfig, data: OfflineData, device: torch.device | str = "cpu"):
        """Batches are drawn on the CPU (numpy) and their tensors sent to ``device``."""
        self.cfg, self.data, self.device = cfg, data, torch.device(device)
        r = data.rewards
        self.rtg = np.flip(np.cumsum(np.flip(r, -1), -1), -1).copy() / cfg.rtg_scale
        self.desc = {(t, q): data.description(t, q)
                     for t in range(len(data.goals)) for q in range(3)}  # fmt: skip

    def window(self, task, quality, episode, end, k: int) -> Window:  # noqa: ANN001
        """Windows of k steps ending (exclusive) at ``end``, left-padded where end < k."""
        task, quality, episode, end = map(np.asarray, (task, quality, episode, end))
        steps = end[:, None] - k + np.arange(k)[None]  # (B, k)
        valid = steps >= 0
        st = np.clip(steps, 0, None)
        idx = (task[:, None], quality[:, None], episode[:, None], st)
        d = self.data
        states = np.where(valid[..., None], d.states[idx], 0.0)
        actions = np.where(valid[..., None], d.actions[idx], 0.0)
        rtg = np.where(valid, self.rtg[idx], 0.0)
        dev = self.device
        return Window(torch.as_tensor(rtg, dtype=torch.float32, device=dev),
                      torch.as_tensor(states, dtype=torch.float32, device=dev),
                      torch.as_tensor(actions, dtype=torch.float32, device=dev),
                      torch.as_tensor(st, dtype=torch.long, device=dev),
                      torch.as_tensor(valid, device=dev))  # fmt: skip

    def texts(self, keys: list[tuple[int, int]]) -> tuple[list[str], torch.Tensor]:
        """(the unique descriptions, index of each key's description)."""
        uniq = list(dict.fromkeys(keys))
        pos = {u: i for i, u in enumerate(uniq)}
        return [self.desc[u] for u in uniq], torch.as_tensor([pos[k] for k in keys],
                                                             device=self.device)  # fmt: skip

    def prompt(self, tasks: np.ndarray, rng: np.random.Generator) -> Window:
        """Prompt-DT's prompt: the last ``prompt_len`` steps of an expert episode of each task."""
        e = rng.integers(self.data.states.shape[2], size=len(tasks))
        return self.window(tasks, np.zeros_like(tasks), e, np.full(len(tasks), self.data.horizon),
                           self.cfg.prompt_len)  # fmt: skip

    def dt_batch(self, rng: np.random.Generator, tasks: np.ndarray, quality: np.ndarray,
                 texts: list[str] | None = None) -> DTBatch:  # fmt: skip
        """Windows of the given (task, tier) rows, each with its description (or ``texts``:
        one description per row, as data sharing relabels them)."""
        cfg, d = self.cfg, self.data
        b = len(tasks)
        episode = rng.integers(d.states.shape[2], size=b)
        end = rng.integers(1, d.horizon + 1, size=b)
        w = self.window(tasks, quality, episode, end, cfg.context)
        uniq = index = goal = prompt = None
        if cfg.uses_text and texts is not None:
            uniq = list(dict.fromkeys(texts))
            index = torch.as_tensor([uniq.index(t) for t in texts], dtype=torch.long,
                                    device=self.device)  # fmt: skip
        elif cfg.uses_text:
            uniq, index = self.texts(list(zip(tasks.tolist(), quality.tolist(), strict=True)))
        if cfg.system == "oracle_dt":
            goal = torch.as_tensor(d.goals[tasks], dtype=torch.float32, device=self.device)
        if cfg.system == "prompt_dt":
            prompt = self.prompt(tasks, rng)
        return DTBatch(w, w.actions / cfg.max_action, uniq, index, goal, prompt)

    def step_batch(
        self, rng: np.random.Generator, align: bool
    ) -> tuple[DTBatch, AlignBatch | None]:
        """One training step's batches: the alignment batch takes the DT batch's tasks, and the
        step's descriptions are encoded once (the DT batch's ``texts`` hold them all)."""
        cfg, d = self.cfg, self.data
        tasks = rng.choice(d.n_train, cfg.tasks_per_step, replace=False)
        tier = rng.integers(3, size=len(tasks))  # a step's windows of one task share its tier
        rows = np.repeat(tasks, cfg.seqs_per_task)
        quality = np.repeat(tier, cfg.seqs_per_task)
        dt = self.dt_batch(rng, rows, quality)
        if not align:
            return dt, None
        a = len(tasks)
        n_ep = d.states.shape[2]
        end = rng.integers(cfg.context, d.horizon + 1, size=a)
        expert = self.window(tasks, np.zeros(a, int), rng.integers(n_ep, size=a), end, cfg.context)
        neg = self.window(tasks, rng.integers(1, 3, size=a), rng.integers(n_ep, size=a),
                          rng.integers(cfg.context, d.horizon + 1, size=a), cfg.context)  # fmt: skip
        keys = [(int(t), int(q)) for t, q in zip(rows, quality, strict=True)]
        keys += [(int(t), 0) for t in tasks]
        uniq, index = self.texts(keys)
        dt.texts, dt.text_index = uniq, index[: len(rows)]
        return dt, AlignBatch(expert, neg, index[len(rows) :], tasks)


def _cat(*ws: Window) -> Window:
    return Window(*(torch.cat([getattr(w, f) for w in ws]) for f in
                    ("rtg", "states", "actions", "timesteps", "valid")))  # fmt: skip


def dt_loss(pred: torch.Tensor, target: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """MSE over the real (non-padded) steps only."""
    m = valid.to(pred.dtype)[..., None]
    return ((pred - target) ** 2 * m).sum() / (m.sum() * pred.shape[-1]).clamp_min(1.0)


def _draw_other(logits: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Per row, an index ≠ the row's own drawn ∝ softmax(logits) (uniform for equal logits)."""
    masked = logits.detach().float().cpu().clone()  # drawn by the CPU generator on any device
    masked.fill_diagonal_(float("-inf"))
    return torch.multinomial(masked.softmax(-1), 1, generator=gen)[:, 0].to(logits.device)


def align_terms(
    model: TGDTModel, b: AlignBatch, encoded: Text, gen: torch.Generator
) -> dict[str, torch.Tensor]:
    """L_TBC, L_TBM and their diagnostics on one expert batch (``encoded``: the step's
    descriptions; ``b.text_index`` picks the tasks' expert descriptions among them)."""
    out: dict[str, torch.Tensor] = {}
    a = len(b.tasks)
    dev = b.expert.states.device
    eye = torch.arange(a, device=dev)
    text = Text(encoded.tokens[b.text_index], encoded.valid[b.text_index], eye)
    sims = torch.zeros(a, a, device=dev)
    if model.has_tbc:
        t = model.text_embedding(text)
        v = model.traj_embedding(b.expert)
        logits = model.logit_scale.exp().clamp(max=100.0) * t @ v.T  # text × trajectory
        out["tbc"] = 0.5 * (F.cross_entropy(logits, eye) + F.cross_entropy(logits.T, eye))
        out["tbc_acc"] = (logits.argmax(1) == eye).float().mean()
        sims = logits
    if model.has_tbm:
        traj_neg = _draw_other(sims, gen)  # per text: a trajectory of another task
        text_neg = _draw_other(sims.T, gen)  # per trajectory: the description of another task
        windows = _cat(b.expert, _index(b.expert, traj_neg), b.negative_self, b.expert)
        index = torch.cat([eye, eye, eye, text_neg])
        labels = torch.cat([torch.ones(a, device=dev), torch.zeros(3 * a, device=dev)]).long()
        logits = model.tbm_logits(windows, Text(text.tokens, text.valid, index))
        out["tbm"] = F.cross_entropy(logits, labels)
        out["tbm_acc"] = (logits.argmax(1) == labels).float().mean()
        out["tbm_positive_fraction"] = labels.float().mean()
    return out


def _index(w: Window, i: torch.Tensor) -> Window:
    return Window(w.rtg[i], w.states[i], w.actions[i], w.timesteps[i], w.valid[i])


class LossModule(torch.nn.Module):
    """The whole objective as one module, so that DDP sees every parameter in each step."""

    def __init__(self, model: TGDTModel, cfg: TGDTConfig) -> None:
        super().__init__()
        self.model, self.cfg = model, cfg

    def forward(self, dt: DTBatch, align: AlignBatch | None, gen: torch.Generator):  # noqa: ANN201
        m, cfg = self.model, self.cfg
        text = m.encode_text(dt.texts, dt.text_index) if dt.texts is not None else None
        pred = m.act(dt.window, text, dt.goal, dt.prompt)
        terms = {"dt": dt_loss(pred, dt.target, dt.window.valid)}
        total = cfg.w_dt * terms["dt"]
        if align is not None:
            terms.update(align_terms(m, align, text, gen))
            w_tbc, w_tbm = loss_weights(m, cfg)
            if "tbc" in terms:
                total = total + w_tbc * terms["tbc"]
            if "tbm" in terms:
                total = total + w_tbm * terms["tbm"]
        terms["loss"] = total + 0.0 * sum(p.sum() for p in m.parameters())
        return terms


def loss_weights(model: TGDTModel, cfg: TGDTConfig) -> tuple[float, float]:
    """(w_tbc, w_tbm) of the objective: the config's, times the factors last measured (at
    initialisation under ``loss_balance=text_grad``; also during training under
    ``text_grad_running`` and ``shared_grad_running``)."""
    if not cfg.balanced:
        return cfg.w_tbc, cfg.w_tbm
    f = model.align_factors
    if bool(torch.isnan(f).any()):
        raise RuntimeError(f"loss_balance={cfg.loss_balance}: the factors were never measured")
    return cfg.w_tbc * float(f[0]), cfg.w_tbm * float(f[1])


def gradient_norms(
    model: TGDTModel, cfg: TGDTConfig, data: OfflineData, batches: int, first_step: int = 1
) -> dict[str, dict[str, float]]:
    """Each loss's gradient norm on the text encoder's trained parameters (the char encoder, or
    MiniLM's projection) and on the decoder blocks, and the cosine of L_DT's and L_TBC's
    gradients on each, the means over ``batches`` training batches: the draws of rank 0 for
    steps ``first_step``, ``first_step + 1``, ... (generator (seed, step, 0); by default the
    first steps), in eval mode (no dropout), unweighted."""
    assert model.text is not None
    was_training = model.training
    model.eval()
    sampler = Sampler(cfg, data, model_device(model))
    groups = {"text_encoder": [p for p in model.text.parameters() if p.requires_grad],
              "decoder_blocks": list(model.blocks.parameters())}  # fmt: skip
    params = [p for g in groups.values() for p in g]
    sizes = [sum(p.numel() for p in g) for g in groups.values()]
    acc: dict[str, dict[str, list[float]]] = {g: {} for g in groups}
    for step in range(first_step, first_step + batches):
        rng = np.random.default_rng([cfg.seed, step, 0, 3])
        gen = torch.Generator().manual_seed(int(rng.integers(2**31)))
        dt, align = sampler.step_batch(rng, align=True)
        text = model.encode_text(dt.texts, dt.text_index)
        losses = {"dt": dt_loss(model.act(dt.window, text), dt.target, dt.window.valid)}
        terms = align_terms(model, align, text, gen)
        losses |= {k: terms[k] for k in ("tbc", "tbm") if k in terms}
        vecs: dict[str, list[torch.Tensor]] = {}
        for k, loss in losses.items():
            grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
            flat = torch.cat([(x if x is not None else torch.zeros_like(p)).flatten()
                              for x, p in zip(grads, params, strict=True)])  # fmt: skip
            vecs[k] = list(flat.split(sizes))
        for i, g in enumerate(groups):
            for k, parts in vecs.items():
                acc[g].setdefault(k, []).append(float(parts[i].norm()))
            if "tbc" in vecs:
                cos = F.cosine_similarity(vecs["dt"][i], vecs["tbc"][i], dim=0)
                acc[g].setdefault("cos_dt_tbc", []).append(float(cos))
    model.train(was_training)
    return {g: {k: float(np.mean(v)) for k, v in d.items()} for g, d in acc.items()}


def balance(
    model: TGDTModel, cfg: TGDTConfig, data: OfflineData, done: int = 0
) -> dict[str, dict[str, float]]:
    """``loss_balance=text_grad`` (and ``text_grad_running``): set the model's (w_tbc, w_tbm)
    factors to the ratio of L_DT's mean gradient norm on the text encoder to each alignment
    loss's (1 for a loss the system does not have); ``shared_grad_running``: to the smaller of
    that ratio and the same ratio on the decoder blocks (which the policy shares too), so each
    weighted alignment loss pulls on neither part harder than L_DT. Measured on the model as it
    is after ``done`` training steps (0: freshly initialised; a resumed run measures the same
    and then restores the saved factors) on the draws of steps done + 1 ... done +
    balance_batches. The measurement is returned."""
    norms = gradient_norms(model, cfg, data, cfg.balance_batches, first_step=done + 1)
    groups = ["text_encoder"]
    if cfg.loss_balance == "shared_grad_running":
        groups.append("decoder_blocks")
    factors = [
        min(norms[g]["dt"] / max(norms[g][k], 1e-12) for g in groups)
        if k in norms["text_encoder"]
        else 1.0
        for k in ("tbc", "tbm")
    ]
    model.align_factors.copy_(torch.as_tensor(factors, dtype=torch.float32))
    return norms


def build_model(cfg: TGDTConfig, data: OfflineData) -> TGDTModel:
    torch.manual_seed(cfg.seed + 31)
    model = TGDTModel(cfg)
    mean, std = data.state_stats()
    model.state_mean.copy_(torch.as_tensor(mean, dtype=torch.float32))
    model.state_std.copy_(torch.as_tensor(std, dtype=torch.float32))
    model.target_return.fill_(data.test_return())
    return model


def new_optimizer(cfg: TGDTConfig, model: TGDTModel, lr: float | None = None):  # noqa: ANN201
    return torch.optim.AdamW(model.parameters(), lr=lr or cfg.lr, weight_decay=cfg.weight_decay)


def lr_at(cfg: TGDTConfig, step: int) -> float:
    return cfg.lr * min(1.0, step / cfg.warmup) if cfg.warmup else cfg.lr


class TGDTRecipe(Recipe):
    """One AdamW step per batch on L_DT (+ L_TBC, L_TBM for the systems with alignment heads),
    at the step's warm-up learning rate, gradients clipped to ``grad_clip``; the batches are
    built on the recipe's device. In process (``data`` given) ``on_step`` sees each step's
    terms; a ``model`` given (with its ``optimizer``, or a fresh one) trains where it is.

    Under a balanced ``loss_balance`` the factors are measured in :meth:`build` (a model whose
    factors are unset) and, under the running balances (``text_grad_running``,
    ``shared_grad_running``), again at the start of each step
    :meth:`TGDTConfig.rebalances_at` names; ``balance_trajectory`` holds one
    ``[steps done, w_tbc, w_tbm]`` per measurement (the checkpoint's extra carries it)."""

    def __init__(
        self,
        cfg: TGDTConfig,
        data: OfflineData | None = None,
        *,
        model: TGDTModel | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        on_step: Callable[[int, dict[str, float]], None] | None = None,
    ) -> None:
        super().__init__(cfg)
        self.data, self.on_step = data, on_step
        self.given = (model, optimizer)
        self.samples_per_step = cfg.tasks_per_step * cfg.seqs_per_task
        self.clip_grad_norm = cfg.grad_clip
        self.placed = False

    def build(self) -> None:
        cfg = self.cfg
        if self.data is None:
            self.data = load_data(cfg)
        model, opt = self.given
        if model is not None and not self.session:  # in process: where the given model is
            self.device = model_device(model)
        self.model = model if model is not None else build_model(cfg, self.data)
        self.balance_norms = None
        self.balance_trajectory: list[list[float]] = []
        if cfg.balanced and bool(torch.isnan(self.model.align_factors).any()):
            self.balance_norms = balance(self.model, cfg, self.data)
            self.balance_trajectory.append([0, *loss_weights(self.model, cfg)])
        self.optimizer = opt if opt is not None else new_optimizer(cfg, self.model)
        self.forward = LossModule(self.model, cfg)  # DDP-wrapped by the trainer
        self.sampler = Sampler(cfg, self.data, self.device)

    def loss(self, step: int, micro: int = 0) -> tuple[torch.Tensor, dict[str, float]]:
        cfg = self.cfg
        rng = np.random.default_rng([cfg.seed, step, self.rank, 3])
        gen = torch.Generator().manual_seed(int(rng.integers(2**31)))
        dt, align = self.sampler.step_batch(rng, align=cfg.tbc or cfg.tbm)
        for g in self.optimizer.param_groups:
            g["lr"] = lr_at(cfg, step)
        terms = self.forward(dt, align, gen)
        return terms["loss"], {k: float(v.detach()) for k, v in terms.items()}

    def step(self, step: int) -> dict[str, float]:
        if not self.placed:  # an in-process run places the model on the CPU: back to its device
            self.model.to(self.device)
            self.placed = True
        if self.cfg.rebalances_at(step):  # the running balances: after every balance_every steps
            balance(self.model, self.cfg, self.data, done=step - 1)
            self.balance_trajectory.append([step - 1, *loss_weights(self.model, self.cfg)])
        stats = super().step(step)
        if self.on_step is not None:
            self.on_step(step, stats)
        return stats

    def extra(self) -> dict:
        out: dict = {"system": self.cfg.system}
        if self.cfg.balanced:
            out["loss_weights"] = list(loss_weights(self.model, self.cfg))
            out["balance_trajectory"] = [list(e) for e in self.balance_trajectory]
        return out

    def on_restore(self, restored: Restored) -> None:
        """A resumed run continues the checkpoint's trajectory (its factors come back with
        the weights; the measurement :meth:`build` made on the fresh model is replaced)."""
        kept = (restored.extra or {}).get("balance_trajectory")
        if kept is not None:
            self.balance_trajectory = [list(e) for e in kept]


def fit(
    cfg: TGDTConfig,
    data: OfflineData | None = None,
    *,
    model: TGDTModel | None = None,
    opt: torch.optim.Optimizer | None = None,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> TGDTModel:
    """Train ``cfg.system`` for ``cfg.steps`` steps in this process (a row of the experiments),
    a fresh model or ``model`` (with ``opt``) on its device; the model comes back in eval
    mode."""
    recipe = TGDTRecipe(cfg, data, model=model, optimizer=opt, on_step=on_step)
    return train(recipe, session=False).model.eval()


def train_loop(cfg: TGDTConfig) -> None:
    """One system under Ray Train: L_DT, L_TBC, L_TBM and the TBC in-batch retrieval accuracy
    every ``log_every`` steps; a checkpoint (weights with the state statistics and the target
    return, optimiser) every ``checkpoint_every`` and at the end. With several workers DDP
    averages the gradients and each worker draws its own batches; on a GPU worker the model
    and its batches are on the GPU."""
    train(TGDTRecipe(cfg))


__all__ = [
    "Sampler",
    "TGDTRecipe",
    "balance",
    "build_model",
    "dt_loss",
    "fit",
    "gradient_norms",
    "loss_weights",
    "train_loop",
]
