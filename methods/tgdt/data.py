"""TG-DT's offline data: the PointRobot meta-RL generator (or the Meta-World track's
collection, ``env=metaworld``: :mod:`nshot.methods.tgdt.metaworld`), the task descriptions,
the batched simulators of the rollouts and the character tokenizer.

PointRobot (the standard meta-RL toy, reconstructed for paper §4's protocol): the state is a
position in R² starting at the origin, an action in [−0.1, 0.1]² (clipped) is added to it, an
episode lasts ``horizon`` steps and the reward is −‖s' − goal‖. Goals are uniform in [−1, 1]²
(fixed by ``data_seed``): the first ``n_train_tasks`` train, the last ``n_test_tasks`` are
held out (described in text at test time, never seen as trajectories by the zero-shot
systems). Per task and quality tier, ``episodes_per_quality`` episodes of a scripted controller
a = clip(k·(goal − s) + σ·ε): expert k = 1, σ = 0.01; medium k = 0.3, σ = 0.05; random:
uniform actions. The table is built once and cached as verified Parquet.

The Meta-World track stores the same columns (goals of 3 coordinates, 39-dimensional states,
4-dimensional actions) plus each episode's ``success``.

Descriptions follow paper §4's data-time template (task, data quality, return, length): the
return is the mean return of that task's tier (a dataset-level statistic, "the data is …"). At
test time the quality is "expert" and the return the mean expert return of the training tasks.
Digits are tokenised one character at a time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pyarrow as pa

from nshot.data.cache import cached_table

from .config import TGDTConfig

DATA_VERSION = "1"
MW_DATA_VERSION = "2"  # the Meta-World tables: 2 adds each task's class (env_name)
QUALITIES = ("expert", "medium", "random")
MAX_ACTION = 0.1  # PointRobot's bound, state and action sizes (the config's ENVS for any env)
STATE_DIM = 2
ACT_DIM = 2
CONTROLLERS = {"expert": (1.0, 0.01), "medium": (0.3, 0.05)}  # (k, σ)
SUCCESS_RADIUS = 0.1  # PointRobot's success: within one full step (0.1) of the goal at some step
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


class Simulator(Protocol):
    """Batched episodes: ``reset`` gives the first states (B, state_dim), ``step`` takes the
    actions (B, act_dim) and gives the next states and the rewards (B,); ``success`` (B,)
    records whether each episode has reached its goal (always False where the environment
    has no such flag)."""

    success: np.ndarray

    def reset(self) -> np.ndarray: ...

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...


class PointSim:
    """Batched PointRobot episodes: ``episodes`` per goal, the first from the origin, the
    others from a start jittered uniformly by ±``jitter``; an episode succeeds once a state
    lies within ``SUCCESS_RADIUS`` of its goal."""

    def __init__(self, goals: np.ndarray, episodes: int = 1, seed: int = 0,
                 jitter: float = 0.0) -> None:  # fmt: skip
        self.goals = np.repeat(np.asarray(goals, np.float64), episodes, axis=0)
        b = len(self.goals)
        first = np.arange(b) % episodes == 0
        rng = np.random.default_rng([seed, 77])
        self.starts = np.where(first[:, None], 0.0, rng.uniform(-jitter, jitter, (b, 2)))
        self.success = np.zeros(b, bool)
        self.s = self.starts.copy()

    def reset(self) -> np.ndarray:
        self.s = self.starts.copy()
        return self.s.copy()

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        self.s, r = env_step(self.s, actions, self.goals)
        self.success |= -r <= SUCCESS_RADIUS
        return self.s.copy(), r


def pointrobot_episodes(cfg: TGDTConfig) -> dict[str, np.ndarray]:
    """Every task's episodes, as :func:`nshot.methods.tgdt.metaworld.collect` gives them."""
    goals = make_goals(cfg)
    n, q, e, h = cfg.n_tasks, len(QUALITIES), cfg.episodes_per_quality, cfg.horizon
    states = np.zeros((n, q, e, h, STATE_DIM), np.float32)
    actions = np.zeros((n, q, e, h, ACT_DIM), np.float32)
    rewards = np.zeros((n, q, e, h), np.float32)
    for task, goal in enumerate(goals):
        for qi, quality in enumerate(QUALITIES):
            rng = np.random.default_rng([cfg.data_seed, 2, task, qi])
            s, a, r = scripted_episodes(goal, quality, e, h, rng)
            states[task, qi], actions[task, qi], rewards[task, qi] = s, a, r
    return {"goals": goals, "states": states, "actions": actions, "rewards": rewards}


def generate(cfg: TGDTConfig) -> pa.Table:
    """One row per episode: task, quality, episode, goal, states, actions, rewards, return
    (and, on Meta-World, whether the episode reached its goal)."""
    if cfg.env == "metaworld":
        from .metaworld import collect

        def progress(done: int, total: int) -> None:
            if done % 10 == 0 or done == total:
                what = cfg.mw_env if cfg.mw_benchmark == "ML1" else "ML10"
                print(f"tgdt: collected Meta-World {what} task {done}/{total}", flush=True)

        ep = collect(cfg, QUALITIES, progress)
    else:
        ep = pointrobot_episodes(cfg)
    n, q, e = ep["rewards"].shape[:3]
    index = np.indices((n, q, e)).reshape(3, -1)
    rows = n * q * e
    cols = {
        "task": pa.array(index[0], pa.int32()),
        "quality": pa.array([QUALITIES[i] for i in index[1]], pa.string()),
        "episode": pa.array(index[2], pa.int32()),
        "goal": pa.array(list(ep["goals"][index[0]].astype(np.float32)),
                         pa.list_(pa.float32(), cfg.goal_dim)),
        "states": pa.array(list(ep["states"].reshape(rows, -1)), pa.list_(pa.float32())),
        "actions": pa.array(list(ep["actions"].reshape(rows, -1)), pa.list_(pa.float32())),
        "rewards": pa.array(list(ep["rewards"].reshape(rows, -1)), pa.list_(pa.float32())),
        "ret": pa.array(ep["rewards"].reshape(rows, -1).sum(-1), pa.float32()),
    }  # fmt: skip
    if "success" in ep:
        cols["success"] = pa.array(ep["success"].reshape(-1), pa.bool_())
        cols["env_name"] = pa.array([ep["names"][i] for i in index[0]], pa.string())
    return pa.table(cols)


def table_key(cfg: TGDTConfig) -> str:
    env = "pointrobot"
    if cfg.env == "metaworld":
        env = f"mw-{cfg.mw_env}" if cfg.mw_benchmark == "ML1" else "mw-ML10"
    return (f"tgdt-{env}-n{cfg.n_train_tasks}-{cfg.n_test_tasks}-e{cfg.episodes_per_quality}"
            f"-T{cfg.horizon}-s{cfg.data_seed}")  # fmt: skip


def data_table(cfg: TGDTConfig) -> pa.Table:
    version = DATA_VERSION if cfg.env == "pointrobot" else MW_DATA_VERSION
    return cached_table(table_key(cfg), lambda: generate(cfg), version=version)


@dataclass
class OfflineData:
    """The episodes as arrays, indexed [task, quality, episode, step]."""

    goals: np.ndarray  # (N, goal_dim)
    states: np.ndarray  # (N, 3, E, T, state_dim)
    actions: np.ndarray  # (N, 3, E, T, act_dim)
    rewards: np.ndarray  # (N, 3, E, T)
    n_train: int
    horizon: int
    env: str = "pointrobot"
    success: np.ndarray | None = None  # (N, 3, E) on Meta-World
    task_names: list[str] | None = None  # each task's Meta-World class

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
        s = self.states[: self.n_train].reshape(-1, self.states.shape[-1])
        return s.mean(0), s.std(0) + 1e-6

    def describe(self, task: int, quality: str, ret: float) -> str:
        """Task ``task``'s goal in the template, with a tier and return."""
        name = self.task_names[task] if self.task_names else "reach-v3"
        return describe(self.goals[task], quality, ret, self.horizon, self.env, name)

    def description(self, task: int, quality: int) -> str:
        return self.describe(task, QUALITIES[quality], self.tier_return(task, quality))

    def test_description(self, task: int, return_scale: float = 1.0) -> str:
        return self.describe(task, "expert", self.test_return() * return_scale)

    def simulator(self, cfg: TGDTConfig, tasks: np.ndarray, episodes: int = 1,
                  seed: int = 0) -> Simulator:  # fmt: skip
        """Batched episodes of these tasks (``episodes`` each, task-major)."""
        if self.env == "metaworld":
            from .metaworld import MetaWorldSim

            expected = np.repeat(self.goals[tasks], episodes, 0)
            return MetaWorldSim(cfg, tasks, episodes, expected)  # type: ignore[return-value]
        return PointSim(self.goals[tasks], episodes, seed, cfg.start_jitter)


def load_data(cfg: TGDTConfig) -> OfflineData:
    t = data_table(cfg)
    n, q, e, h = cfg.n_tasks, len(QUALITIES), cfg.episodes_per_quality, cfg.horizon
    if t.num_rows != n * q * e:
        raise ValueError(f"tgdt data: {t.num_rows} rows, expected {n * q * e}")

    def col(name: str, *shape: int) -> np.ndarray:
        arr = t.column(name).combine_chunks()
        return np.asarray(arr.flatten() if shape else arr, np.float32).reshape(n, q, e, *shape)

    goals = np.asarray(t.column("goal").combine_chunks().flatten(), np.float64)
    goals = goals.reshape(n, q, e, cfg.goal_dim)
    success = names = None
    if "success" in t.column_names:
        success = np.asarray(t.column("success").to_numpy(zero_copy_only=False)).reshape(n, q, e)
        names = t.column("env_name").to_pylist()[:: q * e]
    return OfflineData(goals=goals[:, 0, 0], states=col("states", h, cfg.state_dim),
                       actions=col("actions", h, cfg.act_dim), rewards=col("rewards", h),
                       n_train=cfg.n_train_tasks, horizon=h, env=cfg.env, success=success,
                       task_names=names)  # fmt: skip


# how each Meta-World class's description names its task (ML10's fifteen; any other class: its
# name); the goal position follows
MW_TASK_TEXT = {
    "reach-v3": "Reach with the robot arm's gripper to the goal",
    "push-v3": "Push the puck with the robot arm to the goal",
    "pick-place-v3": "Pick up the puck with the robot arm and place it at the goal",
    "door-open-v3": "Open the door with the robot arm, swinging it to the goal",
    "drawer-close-v3": "Close the drawer with the robot arm, pushing it to the goal",
    "button-press-topdown-v3": "Press the button from the top with the robot arm down to the goal",
    "peg-insert-side-v3": "Insert the peg sideways into the hole with the robot arm, to the goal",
    "window-open-v3": "Open the window with the robot arm, sliding it to the goal",
    "sweep-v3": "Sweep the puck off the table with the robot arm, to the goal",
    "basketball-v3": "Dunk the basketball into the hoop with the robot arm, to the goal",
    "drawer-open-v3": "Open the drawer with the robot arm, pulling it to the goal",
    "door-close-v3": "Close the door with the robot arm, swinging it to the goal",
    "shelf-place-v3": "Pick up the puck with the robot arm and place it on the shelf at the goal",
    "sweep-into-v3": "Sweep the puck into the hole with the robot arm, to the goal",
    "lever-pull-v3": "Pull the lever up with the robot arm to the goal",
}


def describe(goal: np.ndarray, quality: str, ret: float, horizon: int,
             env: str = "pointrobot", mw_env: str = "reach-v3") -> str:  # fmt: skip
    """Paper §4's template (task, data quality, return, length); two decimals locate a goal to
    0.005 (PointRobot's goals span [−1, 1]², Meta-World reach's about 0.2 × 0.1 × 0.25 m)."""
    tail = f"The data is {quality} with return {ret:.1f} over {horizon} steps."
    if env == "metaworld":
        task = MW_TASK_TEXT.get(mw_env, f"Solve the Meta-World task {mw_env}: the goal")
        return f"{task} at x={goal[0]:+.2f}, y={goal[1]:+.2f}, z={goal[2]:+.2f}. {tail}"
    return f"Navigate the point robot to the goal at x={goal[0]:+.2f}, y={goal[1]:+.2f}. {tail}"


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
