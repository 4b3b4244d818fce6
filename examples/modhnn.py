"""Meta-train a modulated HNN, then adapt it to a pendulum it never saw from one trajectory.

    python examples/modhnn.py                   # smoke preset: seconds
    python examples/modhnn.py --preset small    # the small preset: a few minutes on 2 cores

The same from the command line: `nshot train modhnn --preset small`, then
`nshot eval modhnn --checkpoint ~/.cache/nshot/runs/modhnn-small`; the comparison with the
baselines is `nshot reproduce modhnn --preset small`.
"""

from __future__ import annotations

import argparse

import numpy as np

from nshot.method import get
from nshot.methods.modhnn.systems import SYSTEMS
from nshot.train import Scaling, fit, load_checkpoint


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="smoke")
    ap.add_argument("--workers", type=int, default=0, help="Ray Train workers (0: in-process)")
    ap.add_argument("--storage", "--output", help="run storage (default: the nshot cache)")
    args = ap.parse_args()

    method = get("modhnn")
    cfg = method.config(args.preset)
    result = fit(
        "modhnn",
        cfg,
        scaling=Scaling(workers=args.workers),
        storage=args.storage,
        name=f"example-modhnn-{args.preset}",
        overwrite=True,
    )
    ckpt = load_checkpoint(result.checkpoint, method="modhnn")
    print("held-out metrics:", method.evaluate(ckpt, cfg))

    # a pendulum with parameters outside the training draws' seeds: observe one trajectory
    pendulum = SYSTEMS["pendulum"]
    mu = np.array([1.2, 0.8])  # mass, length
    x0 = pendulum.initial_states(mu, 1, np.random.default_rng(7))
    observed = pendulum.trajectories(mu, x0, 30, 0.1)[0]
    predictor = method.predictor(ckpt)
    request = predictor.Request(
        trajectory={"states": observed.tolist(), "dt": 0.1},
        initial_state=observed[0].tolist(),
        horizon=300,
        dt=0.1,
        integrator="midpoint",
    )
    response = predictor(request)
    truth = pendulum.trajectories(mu, x0, 301, 0.1)[0]
    pred = np.asarray(response.trajectory)
    energy = np.asarray(response.energy)
    H = pendulum.hamiltonian(pred[:, 0], pred[:, 1], mu)
    print(f"adapted z = {np.round(response.z, 3).tolist()}, fit loss {response.fit_loss:.2e}")
    print(f"rollout error after 30 steps: {np.abs(pred[30] - truth[30]).max():.3f}")
    print(f"learned energy range along 300 steps: {np.ptp(energy) / abs(energy.mean()):.2e}")
    print(f"true energy range along 300 steps:    {np.ptp(H) / abs(H.mean()):.2e}")


if __name__ == "__main__":
    main()
