"""On which Meta-World ML1 tasks does knowing the goal matter? (the tgdt method's task choice)

    python examples/tgdt_goal_gap.py --out methods/tgdt/results/goal-gap-ml1.json
    python examples/tgdt_goal_gap.py --classes reach-v3 push-v3 --tasks 3 --horizon 50

TG-DT's zero-shot claim can only show on tasks where a policy that does not know the goal
scores far below one that does: on ML1 reach a task-agnostic DT scores about as well as the
oracle DT (the tgdt README, *Meta-World*), so no text-conditioned row can beat the floor by
much there. This measures that gap per candidate class without training anything, with the
class's scripted policy (``metaworld.policies``) on the partially observable environment, the
same way the track collects its data:

- **oracle**: the scripted policy told the true goal (written into a copy of the observation);
- **agnostic**: the same policy told the mean goal of the class's first ``--train`` ML1
  training tasks (the best fixed guess: the policy every task-agnostic imitator of the data
  approaches);
- **random**: uniform actions (the normalisation floor).

Per held-out task (the first ``--tasks`` ML1 test tasks), one deterministic episode of
``--horizon`` steps each; the agnostic policy's normalised score is (R_agnostic − R_random) /
(R_oracle − R_random), and each policy's success rate is the fraction of episodes in which
Meta-World's success flag was raised. The selection rule was declared before the measurement
(the tgdt README, *Meta-World: tasks where the goal matters*): a class qualifies when the oracle
succeeds in ≥ 0.8 of the episodes, the agnostic policy's success is ≤ 0.5 × the oracle's and its
normalised score ≤ 0.5. Needs the metaworld extra.
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np

from nshot.fileio import print_report

#: the ML1 classes whose goal is hidden in the observation and drawn per task (the object's
#: position alone does not say where to take it)
CANDIDATES = (
    "reach-v3", "push-v3", "pick-place-v3", "reach-wall-v3", "push-wall-v3",
    "pick-place-wall-v3", "push-back-v3", "hand-insert-v3", "plate-slide-v3", "sweep-into-v3",
    "soccer-v3", "coffee-push-v3", "bin-picking-v3", "shelf-place-v3", "basketball-v3",
)  # fmt: skip
GOAL = slice(36, 39)
RULE = {"oracle_success_min": 0.8, "success_ratio_max": 0.5, "agnostic_norm_max": 0.5}


def episode(env, policy, goal: np.ndarray | None, horizon: int, rng: np.random.Generator):  # noqa: ANN001, ANN201
    """(return, success, first success step) of one episode; ``goal`` None: random actions."""
    obs, _ = env.reset()
    total, success, first = 0.0, False, None
    for t in range(horizon):
        if goal is None:
            a = rng.uniform(-1.0, 1.0, 4)
        else:
            seen = np.array(obs, np.float64)
            seen[GOAL] = goal
            a = np.clip(policy.get_action(seen), -1.0, 1.0)
        obs, r, _, _, info = env.step(np.asarray(a, np.float32))
        total += float(r)
        if info["success"] and not success:
            success, first = True, t + 1
    return total, success, first


def measure(name: str, n_train: int, n_tasks: int, horizon: int, seed: int) -> dict:
    import metaworld
    import metaworld.policies

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ml1 = metaworld.ML1(name, seed=seed)
        policy = metaworld.policies.ENV_POLICY_MAP[name]()
        env = ml1.train_classes[name]()
        goals = []
        for task in ml1.train_tasks[:n_train]:
            env.set_task(task)
            env.reset()
            goals.append(np.array(env._target_pos, np.float64))
        mean_goal = np.mean(goals, 0)
        env = ml1.test_classes[name]()
        rows = []
        for i, task in enumerate(ml1.test_tasks[:n_tasks]):
            env.set_task(task)
            env.reset()
            true_goal = np.array(env._target_pos, np.float64)
            rng = np.random.default_rng([seed, i])
            rows.append({
                "goal": true_goal.round(4).tolist(),
                "oracle": episode(env, policy, true_goal, horizon, rng),
                "agnostic": episode(env, policy, mean_goal, horizon, rng),
                "random": episode(env, policy, None, horizon, rng),
            })  # fmt: skip
    r = {k: np.array([row[k][0] for row in rows]) for k in ("oracle", "agnostic", "random")}
    s = {k: float(np.mean([row[k][1] for row in rows])) for k in ("oracle", "agnostic")}
    span = r["oracle"] - r["random"]
    norm = float(
        np.mean((r["agnostic"] - r["random"]) / np.where(np.abs(span) > 1e-9, span, np.nan))
    )
    firsts = [row["oracle"][2] for row in rows if row["oracle"][2] is not None]
    qualifies = (
        s["oracle"] >= RULE["oracle_success_min"]
        and s["agnostic"] <= RULE["success_ratio_max"] * s["oracle"]
        and norm <= RULE["agnostic_norm_max"]
    )
    return {
        "oracle_success": s["oracle"], "agnostic_success": s["agnostic"],
        "agnostic_norm_score": norm, "oracle_return": float(r["oracle"].mean()),
        "agnostic_return": float(r["agnostic"].mean()), "random_return": float(r["random"].mean()),
        "oracle_first_success_step": {"median": float(np.median(firsts)), "max": max(firsts)}
        if firsts else None,
        "goal_spread": float(np.linalg.norm(np.std(goals, 0))),
        "qualifies": bool(qualifies),
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--classes", nargs="+", default=list(CANDIDATES))
    ap.add_argument("--train", type=int, default=40, help="training tasks of the mean goal")
    ap.add_argument("--tasks", type=int, default=10, help="held-out (ML1 test) tasks")
    ap.add_argument("--horizon", type=int, default=150)
    ap.add_argument("--seed", type=int, default=0, help="ML1's seed (the track's data_seed)")
    ap.add_argument("--out", default=None, help="write the report here (JSON)")
    args = ap.parse_args()
    t0, c0 = time.time(), time.process_time()
    classes = {}
    for name in args.classes:
        classes[name] = measure(name, args.train, args.tasks, args.horizon, args.seed)
        c = classes[name]
        print(f"{name}: oracle success {c['oracle_success']:.2f}, agnostic "
              f"{c['agnostic_success']:.2f} (norm {c['agnostic_norm_score']:.2f})"
              + ("  qualifies" if c["qualifies"] else ""), flush=True)  # fmt: skip
    report = {
        "rule": RULE, "train_tasks": args.train, "held_out_tasks": args.tasks,
        "horizon": args.horizon, "seed": args.seed, "classes": classes,
        "qualifying": [n for n, c in classes.items() if c["qualifies"]],
        "seconds": round(time.time() - t0, 1), "cpu_seconds": round(time.process_time() - c0, 1),
    }  # fmt: skip
    print_report(report, args.out)


if __name__ == "__main__":
    main()
