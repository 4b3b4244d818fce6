"""TG-DT's evaluation (paper §4): zero-shot rollouts on the held-out goals, the normalised
score, retrieval and matching of descriptions and trajectories, the leak test of the
description's return field, and description-guided data sharing.

- ``norm_score``: per held-out task (R − R_random)/(R_expert − R_random), with R_random and
  R_expert the mean dataset returns of that task's random and expert tiers; then averaged.
- ``retrieval_top1``: for each of the 50 tasks, its test-time description against one expert
  window (the first K steps of expert episode 0) of every task, by TBC cosine; chance 1/50.
- ``tbm_auc``: per task, ROC-AUC of the matching score of (test-time description, expert
  window) against (description, medium window) of the same task, averaged over the tasks; the
  score is TBM's match probability, or the TBC cosine for a model without a TBM head.
- ``tbm_auc_rtg_blind`` (a diagnostic, not a metric of the table): ``tbm_auc`` with the
  return-to-go tokens of every task's expert and medium windows replaced by their common mean
  (per task and position), so only the states and actions differ between the tiers: how much of
  the matching head's separation of quality is read off R̂ rather than the behaviour.
- ``leak_delta``: the relative change of the mean achieved return when the return field of the
  held-out descriptions is scaled (by 0.5 and 1.5), averaged over the scalings.
- Data sharing: per held-out task, the ``share_k`` training tasks with the most similar
  description embeddings (cosine), their data relabelled with the held-out goal (quality and
  return fields kept), ``share_steps`` fine-tuning steps on a copy of the model (never carried
  to the next task), then the same rollouts.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from .config import TGDTConfig
from .data import QUALITIES, OfflineData, Simulator
from .model import Text, TGDTModel, Window
from .train import Sampler, dt_loss


@dataclass
class Rollouts:
    returns: np.ndarray  # (tasks, episodes)
    states: np.ndarray  # (tasks, episodes, T + 1, state_dim)
    success: np.ndarray  # (tasks, episodes): reached the goal


def encode(model: TGDTModel, texts: list[str]) -> Text:
    uniq = list(dict.fromkeys(texts))
    index = torch.as_tensor([uniq.index(t) for t in texts], dtype=torch.long)
    return model.encode_text(uniq, index)


def history_window(
    rtg: np.ndarray, states: np.ndarray, actions: np.ndarray, t: int, k: int, horizon: int
) -> Window:
    """The decoder's window at step t (0-based) of B episodes: the last k steps up to s_t, left
    padded; a_t (not yet taken) is a zero placeholder that the action at s_t never sees.
    ``rtg``, ``states``, ``actions``: (B, t + 1, ·), R̂ already scaled."""
    b = states.shape[0]
    n = min(k, t + 1)
    lo = t + 1 - n
    pad = k - n

    def padded(x: np.ndarray) -> torch.Tensor:
        out = np.zeros((b, k, *x.shape[2:]), np.float32)
        out[:, pad:] = x[:, lo : t + 1]
        return torch.as_tensor(out)

    steps = np.zeros((b, k), np.int64)
    steps[:, pad:] = np.minimum(np.arange(lo, t + 1), horizon - 1)
    valid = np.zeros((b, k), bool)
    valid[:, pad:] = True
    return Window(padded(rtg), padded(states), padded(actions), torch.as_tensor(steps),
                  torch.as_tensor(valid))  # fmt: skip


@torch.no_grad()
def rollout(
    model: TGDTModel,
    cfg: TGDTConfig,
    sim: Simulator,
    *,
    texts: list[str] | None = None,
    model_goals: np.ndarray | None = None,
    prompts: Window | None = None,
    episodes: int = 1,
    target_return: float | None = None,
) -> Rollouts:
    """Greedy rollouts of the simulator's episodes (``episodes`` per task, task-major, as the
    simulator was built), conditioned on one description (or model goal, or prompt) per task;
    R̂ starts at ``target_return`` (default: the checkpoint's)."""
    states0 = sim.reset()
    b = len(states0)
    n = b // episodes
    rep = np.repeat(np.arange(n), episodes)
    target = float(model.target_return) if target_return is None else target_return
    text = encode(model, [texts[i] for i in rep]) if texts is not None and model.text else None
    goal_t = torch.as_tensor(model_goals[rep], dtype=torch.float32) if model_goals is not None \
        else None  # fmt: skip
    prompt = None
    if prompts is not None:
        prompt = Window(*(getattr(prompts, f)[torch.as_tensor(rep)] for f in
                          ("rtg", "states", "actions", "timesteps", "valid")))  # fmt: skip
    h, bound = cfg.horizon, cfg.max_action
    states = np.zeros((b, h + 1, states0.shape[1]))
    actions = np.zeros((b, h, cfg.act_dim))
    rtg = np.zeros((b, h))
    states[:, 0] = states0
    rtg[:, 0] = target / cfg.rtg_scale
    total = np.zeros(b)
    for t in range(h):
        w = history_window(rtg, states, actions, t, cfg.context, h)
        a = np.clip(model.act(w, text, goal_t, prompt)[:, -1].double().numpy() * bound,
                    -bound, bound)  # fmt: skip
        nxt, r = sim.step(a)
        actions[:, t] = a
        states[:, t + 1] = nxt
        total += r
        if t + 1 < h:
            rtg[:, t + 1] = rtg[:, t] - r / cfg.rtg_scale
    return Rollouts(total.reshape(n, episodes), states.reshape(n, episodes, h + 1, -1),
                    sim.success.reshape(n, episodes).copy())  # fmt: skip


def norm_scores(data: OfflineData, tasks: np.ndarray, returns: np.ndarray) -> np.ndarray:
    """Per task (R − R_random)/(R_expert − R_random) of the mean return over its episodes."""
    rets = data.returns[tasks]
    r_exp, r_rand = rets[:, 0].mean(-1), rets[:, 2].mean(-1)
    return (returns.mean(-1) - r_rand) / (r_exp - r_rand)


def system_inputs(model: TGDTModel, data: OfflineData, tasks: np.ndarray, cfg: TGDTConfig,
                  return_scale: float = 1.0) -> dict:  # fmt: skip
    """What the system is conditioned on for these held-out tasks (zero-shot: the test-time
    description; oracle: the goal; Prompt-DT: an expert segment of the task)."""
    if model.system == "oracle_dt":
        return {"model_goals": data.goals[tasks]}
    if model.system == "prompt_dt":
        s = Sampler(cfg, data)
        w = s.window(tasks, np.zeros(len(tasks), int), np.zeros(len(tasks), int),
                     np.full(len(tasks), data.horizon), cfg.prompt_len)  # fmt: skip
        return {"prompts": w}
    if model.text is not None:
        return {"texts": [data.test_description(int(t), return_scale) for t in tasks]}
    return {}


def zero_shot(model: TGDTModel, cfg: TGDTConfig, data: OfflineData, seed: int,
              texts: list[str] | None = None, return_scale: float = 1.0) -> Rollouts:  # fmt: skip
    tasks = data.test_tasks
    inputs = system_inputs(model, data, tasks, cfg, return_scale)
    if texts is not None:
        inputs["texts"] = texts
    sim = data.simulator(cfg, tasks, cfg.eval_episodes, seed)
    return rollout(model, cfg, sim, episodes=cfg.eval_episodes, **inputs)


def probe_windows(data: OfflineData, cfg: TGDTConfig, quality: int, episodes: int) -> Window:
    """The first K steps of the first ``episodes`` episodes of a tier, for every task
    (task-major)."""
    n = len(data.goals)
    tasks = np.repeat(np.arange(n), episodes)
    ep = np.tile(np.arange(episodes), n)
    return Sampler(cfg, data).window(tasks, np.full(len(tasks), quality), ep,
                                     np.full(len(tasks), cfg.context), cfg.context)  # fmt: skip


@torch.no_grad()
def retrieval_top1(model: TGDTModel, cfg: TGDTConfig, data: OfflineData) -> float | None:
    if not model.has_tbc:
        return None
    n = len(data.goals)
    text = encode(model, [data.test_description(i) for i in range(n)])
    t = model.text_embedding(text)[text.index]  # one row per task (descriptions may repeat)
    v = model.traj_embedding(probe_windows(data, cfg, 0, 1))
    return float(((t @ v.T).argmax(1) == torch.arange(n)).float().mean())


def auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """ROC-AUC (Mann–Whitney, ties count half)."""
    d = pos[:, None] - neg[None, :]
    return float((d > 0).mean() + 0.5 * (d == 0).mean())


@torch.no_grad()
def tbm_auc(
    model: TGDTModel, cfg: TGDTConfig, data: OfflineData, rtg_blind: bool = False
) -> float | None:
    """ROC-AUC of (description, expert window) against (description, medium window), per task,
    averaged. ``rtg_blind``: both tiers' R̂ tokens replaced by their mean over the two tiers and
    the episodes, per task and position (the states and actions are left as they are)."""
    if not (model.has_tbm or model.has_tbc):
        return None
    n, e = len(data.goals), min(cfg.auc_episodes, data.states.shape[2])
    text = encode(model, [data.test_description(i) for i in range(n)])
    windows = [probe_windows(data, cfg, quality, e) for quality in (0, 1)]  # expert, medium
    if rtg_blind:
        both = torch.stack([w.rtg.reshape(n, e, -1) for w in windows])  # (2, n, e, K)
        common = both.mean((0, 2))[:, None].expand(n, e, -1).reshape(n * e, -1)
        windows = [dataclasses.replace(w, rtg=common.clone()) for w in windows]
    scores = []
    for w in windows:
        idx = text.index[torch.as_tensor(np.repeat(np.arange(n), e))]  # each task's description
        if model.has_tbm:
            logits = model.tbm_logits(w, Text(text.tokens, text.valid, idx))
            scores.append(logits.softmax(-1)[:, 1].numpy().reshape(n, e))
        else:
            t = model.text_embedding(text)[idx]
            scores.append((t * model.traj_embedding(w)).sum(-1).numpy().reshape(n, e))
    return float(np.mean([auc(scores[0][i], scores[1][i]) for i in range(n)]))


@torch.no_grad()
def text_similarity(model: TGDTModel, data: OfflineData, task: int) -> np.ndarray:
    """Cosine of the held-out task's description embedding with every training task's (TBC
    projection where there is one, else the pooled text tokens)."""
    texts = [data.test_description(i) for i in [task, *range(data.n_train)]]
    text = encode(model, texts)
    if model.has_tbc:
        emb = model.text_embedding(text)[text.index]
    else:
        tok = text.tokens[text.index]
        valid = text.valid[text.index].float()[..., None]
        emb = F.normalize((tok * valid).sum(1) / valid.sum(1), dim=-1)
    return (emb[1:] @ emb[0]).numpy()


def share_and_rollout(model: TGDTModel, cfg: TGDTConfig, data: OfflineData, seed: int) -> Rollouts:
    """Description-guided data sharing, then zero-shot rollouts, one held-out task at a time."""
    sampler = Sampler(cfg, data)
    returns, states, success = [], [], []
    for j, task in enumerate(data.test_tasks):
        near = np.argsort(-text_similarity(model, data, int(task)))[: cfg.share_k]
        tuned = copy.deepcopy(model).train()
        opt = torch.optim.AdamW(tuned.parameters(), lr=cfg.share_lr, weight_decay=cfg.weight_decay)
        rng = np.random.default_rng([seed, 5, j])
        for _ in range(cfg.share_steps):
            rows = rng.choice(near, cfg.share_batch)
            quality = rng.integers(3, size=len(rows))
            texts = [data.describe(int(task), QUALITIES[q], data.tier_return(int(r), int(q)))
                     for r, q in zip(rows, quality, strict=True)]  # fmt: skip
            b = sampler.dt_batch(rng, rows, quality, texts=texts)
            text = tuned.encode_text(b.texts, b.text_index)
            loss = dt_loss(tuned.act(b.window, text), b.target, b.window.valid)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(tuned.parameters(), cfg.grad_clip)
            opt.step()
        tuned.eval()
        sim = data.simulator(cfg, np.asarray([task]), cfg.eval_episodes, seed)
        one = rollout(tuned, cfg, sim, texts=[data.test_description(int(task))],
                      episodes=cfg.eval_episodes)  # fmt: skip
        returns.append(one.returns[0])
        states.append(one.states[0])
        success.append(one.success[0])
    return Rollouts(np.stack(returns), np.stack(states), np.stack(success))


def evaluate_model(model: TGDTModel, cfg: TGDTConfig, data: OfflineData, seed: int,
                   share: bool = False, shuffled: bool = False,
                   name: str | None = None) -> dict[str, dict]:  # fmt: skip
    """Metrics of one trained system: {row: {metric: value}} (row ``name``, default the
    system); with ``share`` also the data-sharing row, with ``shuffled`` the negative control
    (descriptions permuted among the held-out goals: each goal gets the next goal's
    description). Every row also has ``success`` (the fraction of episodes that reached the
    goal: Meta-World's flag, or PointRobot's ``SUCCESS_RADIUS``)."""
    name = name or model.system
    model.eval()
    torch.manual_seed(seed)
    tasks = data.test_tasks
    base = zero_shot(model, cfg, data, seed)
    row: dict[str, float | None] = {
        "norm_score": None,  # below, with the other rows'
        "return": None,
        "retrieval_top1": retrieval_top1(model, cfg, data),
        "tbm_auc": tbm_auc(model, cfg, data),
        "tbm_auc_rtg_blind": tbm_auc(model, cfg, data, rtg_blind=True),
        "leak_delta": None,
    }
    if model.text is not None:
        ref = base.returns.mean()
        deltas = [abs(zero_shot(model, cfg, data, seed, return_scale=f).returns.mean() - ref)
                  / abs(ref) for f in cfg.leak_factors]  # fmt: skip
        row["leak_delta"] = float(np.mean(deltas))
    out, runs = {name: row}, {name: base}
    if shuffled and model.text is not None and len(tasks) > 1:
        texts = [data.test_description(int(t)) for t in np.roll(tasks, -1)]
        runs[f"{name}_shuffled_text"] = zero_shot(model, cfg, data, seed, texts=texts)
    if share and model.text is not None:
        runs[f"{name}_share_k{cfg.share_k}"] = share_and_rollout(model, cfg, data, seed)
    for row_name, run in runs.items():
        vals = out.setdefault(row_name, {})
        vals["norm_score"] = float(norm_scores(data, tasks, run.returns).mean())
        vals["return"] = float(run.returns.mean())
        vals["success"] = float(run.success.mean())  # held-out episodes that reached the goal
    return out
