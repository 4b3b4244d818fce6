"""TG-DT's Meta-World track (paper §4's benchmark): ML1 or ML10 tasks collected with
Meta-World's scripted policies, and a batched simulator for the zero-shot rollouts.

Tasks: ``metaworld.ML1(mw_env, seed=data_seed)`` gives 50 training and 50 test tasks of one
class (goal positions drawn from the class's goal space); the first ``n_train_tasks`` training
tasks train, the first ``n_test_tasks`` test tasks are held out. With ``mw_benchmark="ML10"``,
``metaworld.ML10(seed=data_seed)``: the first ``n_train_tasks / 10`` tasks of each of its 10
training classes train, the first ``n_test_tasks / 5`` of each of its 5 test classes (skills
never trained on) are held out. The classic ``ML1`` / ``ML10`` + ``set_task`` API is used (Meta-World 3.1.1's vectorised ``make_vec`` ML benchmarks fail: ML1's
at construction, ML10's at ``reset``).

The environments are Meta-World's partially observable ones: the last three entries of the
39-dimensional observation (the goal) are 0, so the goal is known only from the description.
The scripted policies need it: they are given a copy of the observation with the true goal
(``env._target_pos``) written in, and the stored states are the goal-free observations.
Quality tiers (per task, ``episodes_per_quality`` episodes each): expert a = π(o) + 0.1·ε;
medium a = 0.3·π(o) + 0.5·ε (a slow, noisy reach); random a ~ U[−1, 1]⁴; every action is
clipped to [−1, 1]. Needs the ``metaworld`` extra (metaworld 3.1.1, mujoco 3.3.0); nothing
renders.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from nshot.errors import ConfigError

from .config import TGDTConfig

TIERS = {"expert": (1.0, 0.1), "medium": (0.3, 0.5)}  # (gain on the scripted action, noise σ)
GOAL_SLICE = slice(36, 39)  # the observation's goal entries (0 in the ML environments)


def require() -> Any:
    """The ``metaworld`` module, or a ConfigError that says how to install it."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import metaworld  # noqa: PLC0415
            import metaworld.policies  # noqa: F401, PLC0415
    except ImportError as err:
        raise ConfigError(
            "field 'env': metaworld needs the metaworld extra (pip install 'nshot[metaworld]': "
            f"metaworld 3.1.1 with mujoco 3.3.0); import failed: {err}"
        ) from None
    return metaworld


def _per_class(tasks: list, classes: list[str], n: int) -> list:
    """The first ``n / len(classes)`` tasks of each class, class by class."""
    k = n // len(classes)
    out = []
    for name in classes:
        out += [task for task in tasks if task.env_name == name][:k]
    return out


class Benchmark:
    """The run's tasks: training tasks first, held-out (test) tasks last. ML1: goal positions
    of one class (held out: ML1's test tasks); ML10: tasks of its 10 training classes (held out:
    its 5 test classes)."""

    def __init__(self, cfg: TGDTConfig) -> None:
        mw = require()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                if cfg.mw_benchmark == "ML10":
                    b = mw.ML10(seed=cfg.data_seed)
                    train = _per_class(b.train_tasks, list(b.train_classes), cfg.n_train_tasks)
                    test = _per_class(b.test_tasks, list(b.test_classes), cfg.n_test_tasks)
                else:
                    b = mw.ML1(cfg.mw_env, seed=cfg.data_seed)
                    train, test = (
                        b.train_tasks[: cfg.n_train_tasks],
                        b.test_tasks[: cfg.n_test_tasks],
                    )
            except (KeyError, ValueError) as err:
                raise ConfigError(f"field 'mw_env': not a Meta-World ML1 class: {err}") from None
        self.tasks = [*train, *test]
        self.names = [t.env_name for t in self.tasks]  # each task's class
        missing = sorted(set(self.names) - set(mw.policies.ENV_POLICY_MAP))
        if missing:
            raise ConfigError(f"field 'mw_env': Meta-World ships no scripted policy for "
                              f"{missing}")  # fmt: skip
        self.classes = ([b.train_classes[t.env_name] for t in train]
                        + [b.test_classes[t.env_name] for t in test])  # fmt: skip
        self.policies = {n: mw.policies.ENV_POLICY_MAP[n]() for n in sorted(set(self.names))}
        self._envs: dict[type, Any] = {}

    def env(self, task: int) -> Any:
        """A (cached, one per class) environment set to ``task``."""
        cls = self.classes[task]
        if cls not in self._envs:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self._envs[cls] = cls()
        env = self._envs[cls]
        env.set_task(self.tasks[task])
        return env

    def new_env(self, task: int) -> Any:
        """A fresh environment of its own set to ``task`` (for batched rollouts)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            env = self.classes[task]()
        env.set_task(self.tasks[task])
        return env

    def expert_action(self, task: int, env: Any, obs: np.ndarray) -> np.ndarray:
        """The task's scripted policy's action on the observation with the true goal written
        in."""
        seen = np.array(obs, np.float64)
        seen[GOAL_SLICE] = env._target_pos
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return np.asarray(self.policies[self.names[task]].get_action(seen), np.float64)


_BENCHMARKS: dict[tuple, Benchmark] = {}


def benchmark(cfg: TGDTConfig) -> Benchmark:
    """The run's benchmark, built once per process (building ML1 takes about a second)."""
    key = (cfg.mw_benchmark, cfg.mw_env, cfg.data_seed, cfg.n_train_tasks, cfg.n_test_tasks)
    if key not in _BENCHMARKS:
        _BENCHMARKS[key] = Benchmark(cfg)
    return _BENCHMARKS[key]


def tier_action(bench: Benchmark, task: int, env: Any, obs: np.ndarray, quality: str,
                rng: np.random.Generator) -> np.ndarray:  # fmt: skip
    if quality == "random":
        return rng.uniform(-1.0, 1.0, 4)
    gain, sigma = TIERS[quality]
    a = gain * bench.expert_action(task, env, obs) + sigma * rng.standard_normal(4)
    return np.clip(a, -1, 1)


def collect(cfg: TGDTConfig, qualities: tuple[str, ...],
            progress: Callable[[int, int], None] | None = None) -> dict[str, np.ndarray]:  # fmt: skip
    """Every task's episodes: goals (N, 3), states (N, 3, E, T, 39), actions (N, 3, E, T, 4),
    rewards (N, 3, E, T) and success (N, 3, E: the episode reached the goal at some step)."""
    bench = benchmark(cfg)
    n, q, e, h = cfg.n_tasks, len(qualities), cfg.episodes_per_quality, cfg.horizon
    goals = np.zeros((n, 3))
    states = np.zeros((n, q, e, h, cfg.state_dim), np.float32)
    actions = np.zeros((n, q, e, h, cfg.act_dim), np.float32)
    rewards = np.zeros((n, q, e, h), np.float32)
    success = np.zeros((n, q, e), bool)
    for task in range(n):
        env = bench.env(task)
        for qi, quality in enumerate(qualities):
            rng = np.random.default_rng([cfg.data_seed, 2, task, qi])
            for ep in range(e):
                obs, _ = env.reset()
                goals[task] = env._target_pos
                if np.any(obs[GOAL_SLICE] != 0):
                    raise RuntimeError("metaworld: the environment shows the goal")
                for t in range(h):
                    a = tier_action(bench, task, env, obs, quality, rng)
                    states[task, qi, ep, t] = obs
                    actions[task, qi, ep, t] = a
                    obs, r, _, _, info = env.step(a.astype(np.float32))
                    rewards[task, qi, ep, t] = r
                    success[task, qi, ep] |= bool(info["success"])
        if progress is not None:
            progress(task + 1, n)
    return {"goals": goals, "states": states, "actions": actions, "rewards": rewards,
            "success": success, "names": bench.names}  # fmt: skip


class MetaWorldSim:
    """Batched episodes of held-out tasks (one environment per episode); ``step`` takes the
    actions of every episode and answers the next observations and rewards."""

    def __init__(self, cfg: TGDTConfig, tasks: np.ndarray, episodes: int,
                 goals: np.ndarray | None = None) -> None:  # fmt: skip
        """``goals``: the goals the data recorded for these episodes, checked at every reset."""
        self.goals = goals
        self.bench = benchmark(cfg)
        self.tasks = [int(t) for t in np.repeat(tasks, episodes)]
        self.envs = [self.bench.new_env(t) for t in self.tasks]
        self.success = np.zeros(len(self.envs), bool)

    def reset(self) -> np.ndarray:
        self.success[:] = False
        obs = np.stack([env.reset()[0] for env in self.envs]).astype(np.float64)
        if self.goals is not None:
            now = np.stack([env._target_pos for env in self.envs])
            if np.abs(now - self.goals).max() > 1e-5:
                raise RuntimeError("metaworld: the benchmark's goals differ from the data's "
                                   "(another metaworld version?)")  # fmt: skip
        return obs

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        obs, rew = [], []
        for i, (env, a) in enumerate(zip(self.envs, actions, strict=True)):
            o, r, _, _, info = env.step(np.clip(a, -1.0, 1.0).astype(np.float32))
            obs.append(o)
            rew.append(r)
            self.success[i] |= bool(info["success"])
        return np.stack(obs).astype(np.float64), np.asarray(rew, np.float64)

    def expert_actions(self, obs: np.ndarray) -> np.ndarray:
        """The noise-free scripted policy's actions (the expert reference)."""
        return np.stack([self.bench.expert_action(t, env, o) for t, env, o in
                         zip(self.tasks, self.envs, obs, strict=True)])  # fmt: skip
