"""TG-DT predictor (paper §3, zero-shot inference): a task description, the trajectory so far
and a target return → the next action; or, with ``mode: "rollout"``, episodes in the
environment: PointRobot at the request's ``goal``, or Meta-World on one of the checkpoint's
held-out tasks (``task``; the metaworld extra must be installed where it is served). A
Meta-World state is the environment's 39 observation values with the goal entries 0.

``act``: ``states`` holds s_0 … s_t (1 or more; longer histories are truncated to the last K
steps), ``actions`` and ``rewards`` the len(states) − 1 steps taken; the return-to-go starts at
``target_return`` (default: the checkpoint's, the mean expert return of the training tasks) and
falls by each reward. The answer is the action at s_t (within the environment's bounds:
[−0.1, 0.1]² on PointRobot, [−1, 1]⁴ on Meta-World) and the return-to-go it was conditioned on. ``rollout``: ``goal`` is used by the environment only (and,
for an ``oracle_dt`` checkpoint, by the model, which is conditioned on it).
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch
from pydantic import BaseModel, Field, model_validator

from nshot.errors import ConfigError
from nshot.method import Predictor
from nshot.serve.schema import StrictRequest, check_finite
from nshot.train.checkpoint import LoadedCheckpoint

from .data import MAX_DESC_LEN, PointSim
from .evaluation import encode, history_window, rollout
from .model import load_model

MAX_HISTORY = 1000


# every real input is finite and within check_finite's ±1e6: beyond any state, action, reward
# or return of the environments here (Meta-World's returns reach a few thousand)
def _finite_rows(name: str, rows: list[list[float]]) -> None:
    for i, row in enumerate(rows):
        check_finite(f"{name}[{i}]", row)


def _check_dims(name: str, rows: list[list[float]], dim: int) -> None:
    for i, row in enumerate(rows):
        if len(row) != dim:
            raise ValueError(f"{name}[{i}]: {len(row)} values, the environment's {name} have {dim}")


class TGDTRequest(StrictRequest):
    mode: Literal["act", "rollout"] = Field("act", description="next action, or episodes")
    description: str = Field(..., min_length=1, max_length=MAX_DESC_LEN,
                             description="the task in words (1–512 characters)")  # fmt: skip
    states: list[list[float]] | None = Field(
        None,
        min_length=1,
        max_length=MAX_HISTORY,
        description="act: s_0 … s_t, each of the environment's state size (2; Meta-World 39)",
    )
    actions: list[list[float]] | None = Field(
        None,
        max_length=MAX_HISTORY,
        description="act: len(states) − 1 actions, each of the action size (2; Meta-World 4)",
    )
    rewards: list[float] | None = Field(
        None, max_length=MAX_HISTORY, description="act: len(states) − 1 rewards"
    )
    target_return: float | None = Field(None, description="return-to-go at s_0")
    goal: list[float] | None = Field(
        None,
        min_length=2,
        max_length=3,
        description="rollout: PointRobot's goal in [−1, 1]²; an oracle_dt checkpoint's goal "
        "(3 coordinates on Meta-World)",
    )
    episodes: int = Field(1, ge=1, le=20, description="rollout: episodes (1–20)")
    task: int | None = Field(
        None, ge=0, le=999,
        description="rollout on Meta-World: which of the checkpoint's held-out tasks (0 … "
        "n_test_tasks − 1; metadata lists them)",
    )  # fmt: skip

    @model_validator(mode="after")
    def _check(self) -> TGDTRequest:
        if not self.description.strip():
            raise ValueError("description: empty (only white space)")
        if self.target_return is not None:
            check_finite("target_return", [self.target_return])
        if self.goal is not None:
            check_finite("goal", self.goal)
        if self.mode == "rollout":
            if self.goal is None and self.task is None:
                raise ValueError("goal: a rollout needs the environment's goal (PointRobot) or "
                                 "a held-out task (Meta-World: field task)")  # fmt: skip
            return self
        if self.states is None:
            raise ValueError("states: the act mode needs the states so far")
        _finite_rows("states", self.states)
        n = len(self.states) - 1
        actions, rewards = self.actions or [], self.rewards or []
        if len(actions) != n:
            raise ValueError(f"actions: {len(actions)} given for {len(self.states)} states "
                             f"(need len(states) − 1 = {n})")  # fmt: skip
        if len(rewards) != n:
            raise ValueError(f"rewards: {len(rewards)} given for {len(self.states)} states "
                             f"(need len(states) − 1 = {n})")  # fmt: skip
        _finite_rows("actions", actions)
        for i, r in enumerate(rewards):
            check_finite(f"rewards[{i}]", [r])
        return self


class TGDTResponse(BaseModel):
    action: list[float] | None = Field(None, description="act: the action at s_t")
    rtg: float | None = Field(None, description="act: the return-to-go at s_t")
    returns: list[float] | None = Field(None, description="rollout: return of each episode")
    trajectory: list[list[float]] | None = Field(None, description="rollout: first episode")
    success: list[bool] | None = Field(
        None, description="rollout on Meta-World: whether each episode reached the goal"
    )


class TGDTPredictor(Predictor[TGDTRequest, TGDTResponse]):
    Request = TGDTRequest
    Response = TGDTResponse

    def __init__(self, checkpoint: LoadedCheckpoint) -> None:
        self.model, self.cfg = load_model(checkpoint)
        self._held_out: list[dict[str, Any]] | None = None

    @classmethod
    def from_checkpoint(cls, checkpoint: LoadedCheckpoint) -> TGDTPredictor:
        return cls(checkpoint)

    def metadata(self) -> dict[str, Any]:
        out = {"system": self.cfg.system, "context": self.cfg.context,
               "env": self.cfg.env, "horizon": self.cfg.horizon,
               "state_dim": self.cfg.state_dim, "action_dim": self.cfg.act_dim,
               "max_action": self.cfg.max_action,
               "target_return": round(float(self.model.target_return), 4)}  # fmt: skip
        if self.cfg.env == "metaworld":
            try:
                out["held_out_tasks"] = self.held_out_tasks()
            except ConfigError:  # served without the metaworld extra: act requests only
                out["held_out_tasks"] = None
        return out

    def example_request(self) -> dict[str, Any]:
        from .data import describe

        cfg = self.cfg
        if cfg.env == "metaworld":
            desc = describe(np.array([0.0, 0.85, 0.15]), "expert", float(self.model.target_return),
                            cfg.horizon, cfg.env, cfg.mw_env)  # fmt: skip
            state = [0.0, 0.6, 0.2, 1.0, 0.0, 0.6, 0.02, 1.0] + [0.0] * 31
            out = {"description": desc, "states": [state, state], "actions": [[0.0] * 4],
                   "rewards": [1.0]}  # fmt: skip
            if cfg.system == "oracle_dt":
                out["goal"] = [0.0, 0.85, 0.15]
            return out
        desc = describe(np.array([0.3, -0.7]), "expert", float(self.model.target_return),
                        cfg.horizon)  # fmt: skip
        return {"description": desc, "states": [[0.0, 0.0], [0.1, -0.1]],
                "actions": [[0.1, -0.1]], "rewards": [-0.67], "target_return": -2.5}  # fmt: skip

    def _check_system(self, request: TGDTRequest) -> None:
        if self.cfg.system == "prompt_dt":
            raise ValueError("mode: a prompt_dt checkpoint needs a prompt of expert steps, "
                             "which this endpoint does not take")  # fmt: skip
        cfg = self.cfg
        if cfg.system == "oracle_dt" and request.goal is None:
            raise ValueError("goal: an oracle_dt checkpoint is conditioned on the goal")
        if request.mode == "rollout" and cfg.env == "metaworld":
            if request.task is None:
                raise ValueError(f"task: a Meta-World rollout runs one of the checkpoint's "
                                 f"{cfg.n_test_tasks} held-out tasks; name it")  # fmt: skip
            if request.task >= cfg.n_test_tasks:
                raise ValueError(f"task: {request.task}, the checkpoint holds out "
                                 f"{cfg.n_test_tasks} tasks (0 … {cfg.n_test_tasks - 1})")  # fmt: skip
            if request.goal is not None:
                raise ValueError("goal: a Meta-World rollout takes the held-out task's own "
                                 "goal (field task), not one of the request's")  # fmt: skip
            try:
                from .metaworld import require

                require()
            except ConfigError:
                raise ValueError("mode: a Meta-World rollout needs the metaworld extra where the "
                                 "checkpoint is served (pip install 'nshot[metaworld]'); act "
                                 "requests do not") from None  # fmt: skip
        elif request.mode == "rollout" and request.task is not None:
            raise ValueError("task: PointRobot rollouts take a goal, not a task")
        if request.goal is not None:
            want = 2 if request.mode == "rollout" else cfg.goal_dim
            if len(request.goal) != want:
                raise ValueError(f"goal: {len(request.goal)} values, the environment's goal "
                                 f"has {want}")  # fmt: skip
            if cfg.env == "pointrobot" and any(abs(v) > 1.0 for v in request.goal):
                raise ValueError("goal: outside [-1, 1]²")
        if request.mode == "act":
            assert request.states is not None
            _check_dims("states", request.states, cfg.state_dim)
            _check_dims("actions", request.actions or [], cfg.act_dim)

    def held_out_tasks(self) -> list[dict[str, Any]]:
        """A Meta-World checkpoint's held-out tasks: index, class and goal (what a rollout's
        ``task`` names and its description should say)."""
        from .metaworld import benchmark

        if self._held_out is None:
            bench, n = benchmark(self.cfg), self.cfg.n_train_tasks
            self._held_out = [
                {"task": i, "class": bench.names[n + i],
                 "goal": [round(float(v), 4) for v in self._task_goal(bench, n + i)]}
                for i in range(self.cfg.n_test_tasks)]  # fmt: skip
        return self._held_out

    @staticmethod
    def _task_goal(bench: Any, task: int) -> np.ndarray:
        env = bench.env(task)
        env.reset()
        return np.asarray(env._target_pos, np.float64)

    @torch.no_grad()
    def _metaworld_rollout(self, request: TGDTRequest, target: float) -> TGDTResponse:
        from .metaworld import MetaWorldSim, benchmark

        cfg, model = self.cfg, self.model
        task = cfg.n_train_tasks + int(request.task)
        sim = MetaWorldSim(cfg, np.array([task]), request.episodes)
        oracle = cfg.system == "oracle_dt"  # conditioned on the task's goal
        r = rollout(model, cfg, sim, texts=[request.description],
                    model_goals=self._task_goal(benchmark(cfg), task)[None] if oracle else None,
                    episodes=request.episodes, target_return=target)  # fmt: skip
        return TGDTResponse(returns=[round(float(v), 6) for v in r.returns[0]],
                            trajectory=np.round(r.states[0, 0], 6).tolist(),
                            success=[bool(v) for v in r.success[0]])  # fmt: skip

    @torch.no_grad()
    def __call__(self, request: TGDTRequest) -> TGDTResponse:
        self._check_system(request)
        cfg, model = self.cfg, self.model
        target = float(model.target_return) if request.target_return is None \
            else request.target_return  # fmt: skip
        goal = None if request.goal is None else np.asarray([request.goal], np.float64)
        if request.mode == "rollout" and cfg.env == "metaworld":
            return self._metaworld_rollout(request, target)
        if request.mode == "rollout":
            assert goal is not None
            sim = PointSim(goal, request.episodes, seed=0, jitter=cfg.start_jitter)
            r = rollout(model, cfg, sim, texts=[request.description],
                        model_goals=goal if cfg.system == "oracle_dt" else None,
                        episodes=request.episodes, target_return=target)  # fmt: skip
            return TGDTResponse(returns=[round(float(v), 6) for v in r.returns[0]],
                                trajectory=np.round(r.states[0, 0], 6).tolist())  # fmt: skip
        assert request.states is not None
        states = np.asarray(request.states, np.float64)[None]
        n = states.shape[1]
        actions = np.zeros((1, n, cfg.act_dim))
        if n > 1:
            actions[0, :-1] = np.asarray(request.actions)
        rtg = np.empty((1, n))
        rtg[0, 0] = target
        if n > 1:
            rtg[0, 1:] = target - np.cumsum(np.asarray(request.rewards, np.float64))
        t = n - 1
        w = history_window(rtg / cfg.rtg_scale, states, actions, t, cfg.context, cfg.horizon)
        text = encode(model, [request.description]) if model.text is not None else None
        goal_t = torch.as_tensor(goal, dtype=torch.float32) if goal is not None else None
        a = model.act(w, text, goal_t if cfg.system == "oracle_dt" else None)[0, -1]
        action = np.clip(a.double().numpy() * cfg.max_action, -cfg.max_action, cfg.max_action)
        return TGDTResponse(action=[round(float(v), 6) for v in action],
                            rtg=round(float(rtg[0, -1]), 6))  # fmt: skip
