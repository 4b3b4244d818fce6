"""The physical systems of modhnn (the paper's benchmarks): exact Hamiltonians, ground-truth trajectories.

Every system is one degree of freedom, state ``x = (q, p)``. The conservative systems
(mass-spring, pendulum, Duffing) have the exact Hamiltonian ``H(q, p; μ)``; the damped nonlinear
oscillator (``dno``) is the one dissipative system: ``ṗ = −∂H/∂q − c p`` with the energy ``H``
decaying.

Ground truth comes from ``scipy.integrate.solve_ivp`` (DOP853, rtol = atol = 1e-10); the targets
``(q̇, ṗ)`` are the analytic vector field at the sampled states. Initial conditions have their
energy drawn in a fixed band per system (the pendulum's band stays below the separatrix) and a
random phase on the level set. Training and test instances draw μ uniformly from the system's
ranges with disjoint seed streams, so every test instance has an unseen parameter value.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

G = 9.81


@dataclass(frozen=True)
class System:
    name: str
    params: tuple[str, ...]
    ranges: tuple[tuple[float, float], ...]
    energy_band: tuple[float, float]  # in units of energy_unit(μ)
    dissipative: bool = False

    # ------------------------------------------------------------------ physics
    def hamiltonian(self, q: np.ndarray, p: np.ndarray, mu: np.ndarray) -> np.ndarray:
        """The exact energy ``H(q, p; μ)`` (elementwise)."""
        q, p = np.asarray(q, np.float64), np.asarray(p, np.float64)
        if self.name == "mass_spring":
            m, k = mu
            return p**2 / (2 * m) + k * q**2 / 2
        if self.name == "pendulum":
            m, ell = mu
            return p**2 / (2 * m * ell**2) + m * G * ell * (1 - np.cos(q))
        if self.name == "duffing":
            a, b = mu
            return p**2 / 2 + a * q**2 / 2 + b * q**4 / 4
        if self.name == "dno":
            a, _c = mu
            return p**2 / 2 + a * q**2 / 2 + DNO_BETA * q**4 / 4
        raise ValueError(self.name)

    def field(self, q: np.ndarray, p: np.ndarray, mu: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The exact vector field ``(q̇, ṗ)``."""
        q, p = np.asarray(q, np.float64), np.asarray(p, np.float64)
        if self.name == "mass_spring":
            m, k = mu
            return p / m, -k * q
        if self.name == "pendulum":
            m, ell = mu
            return p / (m * ell**2), -m * G * ell * np.sin(q)
        if self.name == "duffing":
            a, b = mu
            return p, -a * q - b * q**3
        if self.name == "dno":
            a, c = mu
            return p, -a * q - DNO_BETA * q**3 - c * p
        raise ValueError(self.name)

    def energy_unit(self, mu: np.ndarray) -> float:
        if self.name == "pendulum":
            m, ell = mu
            return 2 * m * G * ell  # the separatrix energy
        return 1.0

    # ------------------------------------------------------------------ sampling
    def sample_mu(self, n: int, rng: np.random.Generator) -> np.ndarray:
        lo = np.array([r[0] for r in self.ranges])
        hi = np.array([r[1] for r in self.ranges])
        return lo + (hi - lo) * rng.random((n, len(self.ranges)))

    def q_max(self, energy: np.ndarray, mu: np.ndarray) -> np.ndarray:
        """Turning point of the orbit of energy ``energy`` (potential = energy)."""
        if self.name == "mass_spring":
            _, k = mu
            return np.sqrt(2 * energy / k)
        if self.name == "pendulum":
            m, ell = mu
            return np.arccos(1 - energy / (m * G * ell))
        a, b = (mu[0], mu[1]) if self.name == "duffing" else (mu[0], DNO_BETA)
        # b/4 x^2 + a/2 x - E = 0 for x = q^2
        x = (-a / 2 + np.sqrt(a**2 / 4 + b * energy)) / (b / 2)
        return np.sqrt(x)

    def initial_states(self, mu: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` states ``[n, 2]`` with energy in the band and a random phase on the orbit."""
        lo, hi = self.energy_band
        energy = self.energy_unit(mu) * (lo + (hi - lo) * rng.random(n))
        theta = rng.random(n) * 2 * np.pi
        q = self.q_max(energy, mu) * np.cos(theta)
        kinetic = np.maximum(energy - self.hamiltonian(q, np.zeros_like(q), mu), 0.0)
        p_abs = np.sqrt(2 * kinetic * self.mass(mu))
        p = np.where(np.sin(theta) >= 0, p_abs, -p_abs)
        return np.stack([q, p], axis=-1)

    def mass(self, mu: np.ndarray) -> float:
        """``p²/(2·mass)`` is the kinetic energy."""
        if self.name == "mass_spring":
            return float(mu[0])
        if self.name == "pendulum":
            return float(mu[0] * mu[1] ** 2)
        return 1.0

    def trajectories(self, mu: np.ndarray, x0: np.ndarray, n_steps: int, dt: float) -> np.ndarray:
        """Ground-truth states ``[n, n_steps, 2]`` at ``t = 0, dt, ..., (n_steps − 1)·dt``."""
        from scipy.integrate import solve_ivp

        n = len(x0)

        def rhs(_t: float, y: np.ndarray) -> np.ndarray:
            s = y.reshape(n, 2)
            dq, dp = self.field(s[:, 0], s[:, 1], mu)
            return np.stack([dq, dp], axis=-1).reshape(-1)

        t_eval = np.arange(n_steps) * dt
        sol = solve_ivp(
            rhs,
            (0.0, float(t_eval[-1]) if n_steps > 1 else 0.0),
            np.asarray(x0, np.float64).reshape(-1),
            method="DOP853",
            t_eval=t_eval,
            rtol=1e-10,
            atol=1e-10,
        )
        if not sol.success:  # pragma: no cover - smooth systems on short horizons
            raise RuntimeError(f"{self.name}: solve_ivp failed: {sol.message}")
        return sol.y.T.reshape(n_steps, n, 2).transpose(1, 0, 2)


DNO_BETA = 0.5

SYSTEMS: dict[str, System] = {
    "mass_spring": System("mass_spring", ("m", "k"), ((0.5, 2.0), (0.5, 2.0)), (0.2, 1.0)),
    "pendulum": System("pendulum", ("m", "l"), ((0.5, 2.0), (0.5, 2.0)), (0.2, 0.8)),
    "duffing": System("duffing", ("alpha", "beta"), ((0.5, 2.0), (0.1, 1.0)), (0.2, 1.0)),
    "dno": System("dno", ("alpha", "c"), ((0.5, 2.0), (0.05, 0.3)), (0.2, 1.0), dissipative=True),
}
CONSERVATIVE = tuple(k for k, s in SYSTEMS.items() if not s.dissipative)


def get_system(name: str) -> System:
    try:
        return SYSTEMS[name]
    except KeyError:
        raise ValueError(
            f"system: unknown system {name!r}; choose one of {sorted(SYSTEMS)}"
        ) from None


@dataclass
class Split:
    """One split of a system: ``K`` instances × ``T`` trajectories × ``S`` steps."""

    system: str
    mu: np.ndarray  # [K, P]
    x: np.ndarray  # [K, T, S, 2] states
    f: np.ndarray  # [K, T, S, 2] exact (q̇, ṗ)
    dt: float

    @property
    def n_instances(self) -> int:
        return int(self.mu.shape[0])


def generate_split(
    system: str, n_instances: int, n_traj: int, n_steps: int, dt: float, seed: int, split: str
) -> Split:
    """Draw ``n_instances`` parameter values and their trajectories (a deterministic function of
    the arguments; the train and test splits use disjoint seed streams)."""
    sys_ = get_system(system)
    stream = {"train": 0, "test": 1}[split]
    rng = np.random.default_rng([seed, stream, sum(map(ord, system))])
    mu = sys_.sample_mu(n_instances, rng)
    xs, fs = [], []
    for k in range(n_instances):
        x0 = sys_.initial_states(mu[k], n_traj, rng)
        x = sys_.trajectories(mu[k], x0, n_steps, dt)
        dq, dp = sys_.field(x[..., 0], x[..., 1], mu[k])
        xs.append(x)
        fs.append(np.stack([dq, dp], axis=-1))
    return Split(system, mu, np.stack(xs), np.stack(fs), dt)


def split_to_table(s: Split, name: str):
    """One row per sample: split, instance, traj, step, t, q, p, dq, dp, mu_i, H."""
    import pyarrow as pa

    sys_ = get_system(s.system)
    K, T, S, _ = s.x.shape
    kk, tt, ss = np.meshgrid(np.arange(K), np.arange(T), np.arange(S), indexing="ij")
    cols = {
        "split": pa.array([name] * (K * T * S)),
        "instance": pa.array(kk.reshape(-1).astype(np.int32)),
        "traj": pa.array(tt.reshape(-1).astype(np.int32)),
        "step": pa.array(ss.reshape(-1).astype(np.int32)),
        "t": pa.array((ss * s.dt).reshape(-1).astype(np.float64)),
        "q": pa.array(s.x[..., 0].reshape(-1)),
        "p": pa.array(s.x[..., 1].reshape(-1)),
        "dq": pa.array(s.f[..., 0].reshape(-1)),
        "dp": pa.array(s.f[..., 1].reshape(-1)),
    }
    for i, pname in enumerate(sys_.params):
        cols[f"mu_{pname}"] = pa.array(np.repeat(s.mu[:, i], T * S))
    energy = np.stack([sys_.hamiltonian(s.x[k, ..., 0], s.x[k, ..., 1], s.mu[k]) for k in range(K)])
    cols["H"] = pa.array(energy.reshape(-1))
    return pa.table(cols)


def table_to_split(table, system: str, dt: float) -> Split:
    sys_ = get_system(system)
    inst = table.column("instance").to_numpy()
    traj = table.column("traj").to_numpy()
    step = table.column("step").to_numpy()
    K, T, S = int(inst.max()) + 1, int(traj.max()) + 1, int(step.max()) + 1
    order = np.lexsort((step, traj, inst))

    def col(name: str) -> np.ndarray:
        return table.column(name).to_numpy()[order].reshape(K, T, S)

    x = np.stack([col("q"), col("p")], axis=-1)
    f = np.stack([col("dq"), col("dp")], axis=-1)
    mu = np.stack([col(f"mu_{p}")[:, 0, 0] for p in sys_.params], axis=-1)
    return Split(system, mu, x, f, dt)
