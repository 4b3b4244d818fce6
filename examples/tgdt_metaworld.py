"""TG-DT on Meta-World: train on ML1 reach tasks collected with Meta-World's scripted policies,
evaluate zero-shot on held-out goal positions described in text, then drive one held-out
episode of the real environment through the predictor, step by step, as a client would, and
ask the predictor for a rollout of the same held-out task (the server runs the episodes).

    pip install 'nshot[metaworld]'                   # metaworld 3.1.1 + mujoco 3.3.0
    python examples/tgdt_metaworld.py --quick        # a few tasks, short training: ~1 minute
    python examples/tgdt_metaworld.py                # the small-metaworld preset: minutes
    python examples/tgdt_metaworld.py --workers 2    # two Ray Train workers (DDP)

The comparison with every baseline is `nshot reproduce tgdt --preset small-metaworld`.
"""

from __future__ import annotations

import argparse

import numpy as np

from nshot.method import get, parse_overrides
from nshot.methods.tgdt.data import load_data
from nshot.methods.tgdt.metaworld import benchmark
from nshot.train import Scaling, fit, load_checkpoint

QUICK = {"n_train_tasks": 8, "n_test_tasks": 2, "episodes_per_quality": 3, "steps": 60,
         "warmup": 10, "log_every": 20, "checkpoint_every": 60, "tasks_per_step": 4}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="a few tasks and 60 steps")
    ap.add_argument("--workers", type=int, default=0, help="Ray Train workers (0: in-process)")
    ap.add_argument("--storage", "--output", help="run storage (default: the nshot cache)")
    ap.add_argument("--set", action="append", default=[], help="override a field: KEY=VALUE")
    args = ap.parse_args()

    tg = get("tgdt")
    cfg = tg.config("small-metaworld", **{**(QUICK if args.quick else {}),
                                          **parse_overrides(args.set)})  # fmt: skip
    data = load_data(cfg)  # collected once (about a minute for the preset), then cached
    res = fit("tgdt", cfg, scaling=Scaling(workers=args.workers), storage=args.storage,
              name="example-tgdt-metaworld", overwrite=True)  # fmt: skip
    ckpt = load_checkpoint(res.checkpoint, method="tgdt")
    metrics = tg.evaluate(ckpt, cfg)
    print("zero-shot on the held-out goals:", {k: round(v, 4) for k, v in metrics.items()})

    # one held-out episode in the real environment, every action asked of the predictor
    predictor = tg.predictor(ckpt)
    task = int(data.test_tasks[0])
    desc = data.test_description(task)
    env = benchmark(cfg).new_env(task)
    obs, _ = env.reset()
    states, actions, rewards, success = [obs.tolist()], [], [], False
    for _ in range(cfg.horizon):
        # the whole history so far (the predictor keeps the last K steps, and counts the time
        # step and the return-to-go from the start of the episode)
        answer = predictor(predictor.Request(description=desc, states=states, actions=actions,
                                             rewards=rewards))  # fmt: skip
        obs, r, _, _, info = env.step(np.asarray(answer.action, np.float32))
        states.append(obs.tolist())
        actions.append(answer.action)
        rewards.append(float(r))
        success |= bool(info["success"])
    goal = data.goals[task]
    print(f"description: {desc!r}")
    print(f"return {sum(rewards):.1f}, reached the goal: {success}, final distance "
          f"{np.linalg.norm(np.asarray(states[-1][:3]) - goal):.3f} m")  # fmt: skip

    # the same held-out task as one rollout request: the server runs the episodes itself
    held_out = predictor.metadata()["held_out_tasks"][0]
    answer = predictor(predictor.Request(mode="rollout", description=desc,
                                         task=held_out["task"], episodes=2))  # fmt: skip
    print(f"rollout request on held-out task {held_out['task']} ({held_out['class']}, goal "
          f"{held_out['goal']}): returns {[round(r, 1) for r in answer.returns]}, "
          f"success {answer.success}")  # fmt: skip


if __name__ == "__main__":
    main()
