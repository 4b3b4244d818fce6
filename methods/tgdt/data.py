"""TG-DT's offline data: the PointRobot meta-RL generator, its task descriptions and the
character tokenizer.

PointRobot (the standard meta-RL toy, reconstructed for paper §4's protocol): the state is a
position in R² starting at the origin, an action in [−0.1, 0.1]² (clipped) is added to it, an
episode lasts ``horizon`` steps and the reward is −‖s' − goal‖. Goals are uniform in [−1, 1]²
(fixed by ``data_seed``): the first ``n_train_tasks`` train, the last ``n_test_tasks`` are
held out (described in text at test time, never seen as trajectories by the zero-shot
systems). Per task and quality tier, ``episodes_per_quality`` episodes of a scripted controller
a = clip(k·(goal − s) + σ·ε): expert k = 1, σ = 0.01; medium k = 0.3, σ = 0.05; random:
uniform actions. The table is built once and cached as verified Parquet.

Descriptions follow paper §4's data-time template (task, data quality, return, length): the
return is the mean return of that task's tier (a dataset-level statistic, "the data is …"). At
test time the quality is "expert" and the return the mean expert return of the training tasks.
Digits are tokenised one character at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from nshot.data.cache import cached_table

from .config import TGDTConfig

DATA_VERSION = "1"
QUALITIES = ("expert", "medium", "random")
MAX_ACTION = 0.1
STATE_DIM = 2
ACT_DIM = 2
CONTROLLERS = {"expert": (1.0, 0.01), "medium": (0.3, 0.05)}  # (k, σ)
MAX_DESC_LEN = 512
PAD, UNK = 0, 1
VOCAB = 2 + 95  # pad, unknown, printable ASCII 32..126


def env_step(s: np.ndarray, a: np.ndarray, goal: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """PointRobot: (next states, rewards) of a batch; the action is clipped to the bounds."""
    nxt = s + np.clip(a, -MAX_ACTION, MAX_ACTION)
    return nxt, -np.linalg.norm(nxt - goal, axis=-1)


def make_goals(cfg: TGDTConfig) -> np.ndarray:
    """(n_tasks, 2): training goals first, held-out goals last."""
    return np.random.default_rng([cfg.data_seed, 1]).uniform(-1.0, 1.0, (cfg.n_tasks, 2))


def scripted_episodes(
    goal: np.ndarray, quality: str, n: int, horizon: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(states (n, T, 2), actions (n, T, 2), rewards (n, T)) of the tier's controller; states
    are those the actions were taken in (s_0 = origin)."""
    s = np.zeros((n, STATE_DIM))
    states, actions, rewards = [], [], []
    for _ in range(horizon):
        if quality == "random":
            a = rng.uniform(-MAX_ACTION, MAX_ACTION, (n, ACT_DIM))
        else:
            k, sigma = CONTROLLERS[quality]
            a = k * (goal - s) + sigma * rng.standard_normal((n, ACT_DIM))
        a = np.clip(a, -MAX_ACTION, MAX_ACTION)
        states.append(s)
        actions.append(a)
        s, r = env_step(s, a, goal)
        rewards.append(r)
    return np.stack(states, 1), np.stack(actions, 1), np.stack(rewards, 1)


def generate(cfg: TGDTConfig) -> pa.Table:
    """One row per episode: task, quality, episode, goal, states, actions, rewards, return."""
    goals = make_goals(cfg)
    cols: dict[str, list] = {k: [] for k in ("task", "quality", "episode", "goal", "states",
                                             "actions", "rewards", "ret")}  # fmt: skip
    for task, goal in enumerate(goals):
        for qi, quality in enumerate(QUALITIES):
            rng = np.random.default_rng([cfg.data_seed, 2, task, qi])
            s, a, r = scripted_episodes(goal, quality, cfg.episodes_per_quality, cfg.horizon, rng)
            for e in range(cfg.episodes_per_quality):
                cols["task"].append(task)
                cols["quality"].append(quality)
                cols["episode"].append(e)
                cols["goal"].append(goal.astype(np.float32).tolist())
                cols["states"].append(s[e].astype(np.float32).ravel().tolist())
                cols["actions"].append(a[e].astype(np.float32).ravel().tolist())
                cols["rewards"].append(r[e].astype(np.float32).tolist())
                cols["ret"].append(float(r[e].astype(np.float32).sum()))
    return pa.table({
        "task": pa.array(cols["task"], pa.int32()),
        "quality": pa.array(cols["quality"], pa.string()),
        "episode": pa.array(cols["episode"], pa.int32()),
        "goal": pa.array(cols["goal"], pa.list_(pa.float32(), 2)),
        "states": pa.array(cols["states"], pa.list_(pa.float32())),
        "actions": pa.array(cols["actions"], pa.list_(pa.float32())),
        "rewards": pa.array(cols["rewards"], pa.list_(pa.float32())),
        "ret": pa.array(cols["ret"], pa.float32()),
    })  # fmt: skip


def table_key(cfg: TGDTConfig) -> str:
    return (f"tgdt-pointrobot-n{cfg.n_train_tasks}-{cfg.n_test_tasks}-e{cfg.episodes_per_quality}"
            f"-T{cfg.horizon}-s{cfg.data_seed}")  # fmt: skip


def data_table(cfg: TGDTConfig) -> pa.Table:
    return cached_table(table_key(cfg), lambda: generate(cfg), version=DATA_VERSION)


@dataclass
class PointData:
    """The episodes as arrays, indexed [task, quality, episode, step]."""

    goals: np.ndarray  # (N, 2)
    states: np.ndarray  # (N, 3, E, T, 2)
    actions: np.ndarray  # (N, 3, E, T, 2)
    rewards: np.ndarray  # (N, 3, E, T)
    n_train: int
    horizon: int

    @property
    def returns(self) -> np.ndarray:
        return self.rewards.sum(-1)

    @property
    def train_tasks(self) -> np.ndarray:
        return np.arange(self.n_train)

    @property
    def test_tasks(self) -> np.ndarray:
        return np.arange(self.n_train, len(self.goals))

    def tier_return(self, task: int, quality: int) -> float:
        return float(self.returns[task, quality].mean())

    def test_return(self) -> float:
        """The return written into test-time descriptions: the mean expert return of the
        training tasks."""
        return float(self.returns[: self.n_train, 0].mean())

    def state_stats(self) -> tuple[np.ndarray, np.ndarray]:
        """Mean and std of the states over every training task (never per task: that would
        leak the goal)."""
        s = self.states[: self.n_train].reshape(-1, STATE_DIM)
        return s.mean(0), s.std(0) + 1e-6

    def description(self, task: int, quality: int) -> str:
        return describe(self.goals[task], QUALITIES[quality], self.tier_return(task, quality),
                        self.horizon)  # fmt: skip

    def test_description(self, task: int, return_scale: float = 1.0) -> str:
        return describe(self.goals[task], "expert", self.test_return() * return_scale,
                        self.horizon)  # fmt: skip


def load_data(cfg: TGDTConfig) -> PointData:
    t = data_table(cfg)
    n, q, e, h = cfg.n_tasks, len(QUALITIES), cfg.episodes_per_quality, cfg.horizon
    if t.num_rows != n * q * e:
        raise ValueError(f"tgdt data: {t.num_rows} rows, expected {n * q * e}")

    def col(name: str, *shape: int) -> np.ndarray:
        arr = t.column(name).combine_chunks()
        return np.asarray(arr.flatten() if shape else arr, np.float32).reshape(n, q, e, *shape)

    goals = np.asarray(t.column("goal").combine_chunks().flatten(), np.float64).reshape(n, q, e, 2)
    return PointData(goals=goals[:, 0, 0], states=col("states", h, STATE_DIM),
                     actions=col("actions", h, ACT_DIM), rewards=col("rewards", h),
                     n_train=cfg.n_train_tasks, horizon=h)  # fmt: skip


def describe(goal: np.ndarray, quality: str, ret: float, horizon: int) -> str:
    """Paper §4's template for PointRobot; two decimals locate a goal to 0.005."""
    return (f"Navigate the point robot to the goal at x={goal[0]:+.2f}, y={goal[1]:+.2f}. "
            f"The data is {quality} with return {ret:.1f} over {horizon} steps.")  # fmt: skip


def tokenize(texts: list[str]) -> np.ndarray:
    """Character ids (B, L) padded with 0 to the longest text (at most MAX_DESC_LEN)."""
    if not texts:
        raise ValueError("tokenize: no text")
    width = max(1, min(MAX_DESC_LEN, max(len(t) for t in texts)))
    out = np.zeros((len(texts), width), np.int64)
    for i, text in enumerate(texts):
        codes = np.frombuffer(text[:width].encode("utf-32-le"), np.uint32).astype(np.int64)
        ids = np.where((codes >= 32) & (codes <= 126), codes - 30, UNK)
        out[i, : len(ids)] = ids
    return out
