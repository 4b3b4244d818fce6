"""Shared fixtures: one local Ray per pytest run, an isolated nshot cache."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Ray Train's controller polls its workers every 2 s by default: each of the suite's many short
# trainer runs waits up to one interval to see its workers start and another to see them finish
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.25")
# Each Ray Train run starts its controller's helper actors, each a fresh process importing Ray
# Train (about 3 s of CPU here); the spot-preemption watcher and the metrics exporter watch for
# nothing a test needs (about 5 s off each of the suite's two-worker runs, measured)
os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
os.environ.setdefault("RAY_TRAIN_METRICS_ENABLED", "0")


@pytest.fixture(scope="session", autouse=True)
def nshot_cache(tmp_path_factory: pytest.TempPathFactory):
    """Every test run gets its own cache unless NSHOT_CACHE is set by the caller."""
    if "NSHOT_CACHE" not in os.environ:
        root = tmp_path_factory.getbasetemp()
        if os.environ.get("PYTEST_XDIST_WORKER"):
            root = root.parent  # one cache for both pytest workers (its builds take file locks)
        cache = root / "nshot-cache"
        cache.mkdir(exist_ok=True)
        os.environ["NSHOT_CACHE"] = str(cache)
    yield os.environ["NSHOT_CACHE"]


@pytest.fixture(scope="session")
def ray_session():
    """The one local Ray instance of this pytest run (started on 127.0.0.1, shut down at the end)."""
    import ray

    from nshot.train import ensure_ray

    if not ray.is_initialized():
        ensure_ray(num_cpus=2, _node_ip_address="127.0.0.1", configure_logging=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def untrained_tail_checkpoint(tmp_path_factory: pytest.TempPathFactory):
    """An nshot checkpoint of an untrained `smoke` TAIL model (seed 0, step 1), written once."""
    import torch

    from nshot.method import get
    from nshot.methods.tail.model import TailModel
    from nshot.train.checkpoint import save_checkpoint

    tail = get("tail")
    cfg = tail.config("smoke")
    torch.manual_seed(0)
    return save_checkpoint(
        tmp_path_factory.mktemp("tail-ckpt") / "ckpt",
        method="tail",
        method_version=tail.version,
        config=cfg.model_dump(),
        step=1,
        model_state=TailModel(cfg).state_dict(),
    )


@pytest.fixture(scope="session")
def tiny_smoke_lm(nshot_cache):
    """The folder of the tiny-smoke LM, trained by nshot once per test run (about a minute)."""
    from nshot.train.tinylm import ensure_tiny_lm

    return ensure_tiny_lm("smoke")


def assert_caos_coverage(cp, episodes, alpha: float, informative: int | None = None) -> float:
    """Marginal coverage of ``cp`` (a :class:`nshot.serve.conformal.ConformalPredictor`) over
    ``episodes``, pairs ``(request, true class names of its queries)``: the share of queries
    whose true class is in their set must not fall below the 0.1 % quantile of
    Binomial(queries, 1 - alpha) (a bug in the wiring — labels, class order, which rows are
    support — lowers it far more). Only the sets are computed (:meth:`ConformalPredictor.sets`).
    With ``informative`` = the number of classes, at least one set must be smaller (sets of
    every class would cover whatever the wiring). Returns the coverage."""
    from scipy.stats import binom

    hits = total = 0
    smallest: int | None = None
    for request, truth in episodes:
        out = cp.sets(request)
        assert len(out["sets"]) == len(truth) and out["empty"] == [not s for s in out["sets"]]
        hits += sum(int(t in s) for t, s in zip(truth, out["sets"], strict=True))
        total += len(truth)
        least = min(out["set_sizes"])
        smallest = least if smallest is None else min(smallest, least)
    floor = binom.ppf(0.001, total, 1 - alpha) / total
    assert hits / total >= floor, (hits, total, floor)
    if informative is not None:
        assert smallest is not None and smallest < informative, "every set holds every class"
    return hits / total


@pytest.fixture
def caos_coverage():
    """:func:`assert_caos_coverage`, for the methods' coverage tests."""
    return assert_caos_coverage


@pytest.fixture
def run_example(monkeypatch):
    """``run_example("front", ["--output", d])``: import ``examples/front.py`` as a module (it
    is a script, not a package) and call its ``main()`` with those command-line arguments."""
    import importlib.util
    import sys
    from pathlib import Path

    def run(name: str, argv: list[str]) -> None:
        path = Path(__file__).parents[1] / "examples" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(f"example_{name}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        monkeypatch.setattr(sys, "argv", [path.name, *argv])
        mod.main()

    return run


# --------------------------------------------------------------------------------------------
# Two pytest workers (pytest-xdist, `-n 2 --dist loadgroup`): every test that uses the shared
# Ray runs in ONE worker (the xdist group "ray"), so the suite starts exactly one local Ray; the
# other tests spread over both workers. A test that reaches Ray must say so (the `ray` marker,
# or the `ray_session` fixture, directly or through a fixture it uses): a test outside the group
# that calls into Ray fails and names itself, serial runs included, so the grouping cannot
# silently start a second Ray. A test marked `own_ray` starts Ray in processes of its own (a
# `ray start` cluster, an `nshot serve` subprocess) and never touches the shared one: it runs
# outside the group, next to it.


def _uses_ray(item: pytest.Item) -> bool:
    if item.get_closest_marker("own_ray") is not None:
        return False
    return item.get_closest_marker("ray") is not None or "ray_session" in item.fixturenames


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the group mark
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _uses_ray(item):
            item.add_marker(pytest.mark.xdist_group("ray"))
            item.user_properties.append(("ray_group", True))
    # the tests off Ray that need the tiny LM go first: the worker without Ray trains it (about
    # a minute, once, in the shared cache) while the other starts on the Ray tests, which then
    # find it built. Within the Ray group, the Serve tests go first: they mostly wait (Serve
    # starting, replicas loading and stopping; the 2 cores were 52-55 % busy while they ran
    # last, alone), so they leave the CPU to the other worker's tests, and the Ray Train tests,
    # which keep both cores busy, end the run once the other worker is done (the order of
    # everything else is kept)
    items.sort(
        key=lambda it: (
            ("ray_group", True) in it.user_properties or "tiny_smoke_lm" not in it.fixturenames,
            ("ray_group", True) in it.user_properties and it.path.name not in _WAITING_RAY_FILES,
        )
    )


#: the Ray group's test files that mostly wait (see pytest_collection_modifyitems)
_WAITING_RAY_FILES = frozenset(
    {"test_serve.py", "test_serve_all.py", "test_serve_fuzz.py", "test_tail_quickstart.py"}
)


class _GroupCheck:
    """Under `--dist loadgroup`, xdist groups a test by a suffix it appends to the test's id; a
    pytest whose ids it cannot change (pytest 9.2 with pytest-xdist 3.8) would spread the Ray
    tests over both workers, each starting a Ray of its own. Refuse to run then."""

    @pytest.hookimpl(trylast=True)  # after xdist's hook, which appends the suffix
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]):
        if not getattr(config.option, "loadgroup", False):
            return
        stray = [it.nodeid for it in items if ("ray_group", True) in it.user_properties]
        stray = [n for n in stray if not n.endswith("@ray")]
        if stray:
            raise pytest.UsageError(
                f"pytest-xdist did not group {stray[0]} (and {len(stray) - 1} more) with the "
                "other Ray tests: this pytest and pytest-xdist do not work together under "
                "--dist loadgroup (pytest 9.2 with pytest-xdist 3.8 does not); install the "
                "test extra's pins: pip install -e '.[test]'"
            )


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_GroupCheck(), "nshot-ray-group-check")


@pytest.fixture(autouse=True)
def _unmarked_tests_stay_off_ray(request: pytest.FixtureRequest, monkeypatch):
    """A test outside the "ray" group that starts or calls Ray fails, naming itself."""
    if ("ray_group", True) in request.node.user_properties:
        yield
        return
    import ray

    used: list[str] = []

    def guard(name, real):
        def call(*args, **kwargs):
            used.append(name)
            return real(*args, **kwargs)

        return call

    for name in ("init", "get"):
        monkeypatch.setattr(ray, name, guard(name, getattr(ray, name)))
    yield
    if used:
        pytest.fail(
            f"{request.node.nodeid} calls ray.{used[0]} but its module is not marked `ray`: "
            "add `pytestmark = pytest.mark.ray` (or the ray_session fixture) so that it runs "
            "in the pytest worker that owns the shared Ray"
        )


@pytest.fixture(scope="module", autouse=True)
def _ray_resources_returned():
    """The tests of a module hand back every CPU they took on the shared Ray (actors, tasks,
    placement groups, Serve replicas), once the module's own fixtures are torn down.

    The shared instance has 2 CPUs, exactly what a two-worker Ray Train run asks for: one CPU
    left held by an earlier module makes the next two-worker run wait for resources forever.
    Instead, the module that leaks fails here (an error at its last test), naming what still
    holds resources."""
    yield
    import ray

    if not ray.is_initialized():
        return
    import time

    total = ray.cluster_resources().get("CPU", 0.0)
    deadline = time.time() + 30
    while ray.available_resources().get("CPU", 0.0) < total and time.time() < deadline:
        time.sleep(0.25)
    free = ray.available_resources().get("CPU", 0.0)
    if free < total:
        pytest.fail(
            f"{total - free:g} of {total:g} CPUs still held 30 s after the module: {_holders()}"
        )


def _holders() -> str:
    import ray
    from ray.util.state import list_actors, list_placement_groups, list_tasks

    address = ray.get_runtime_context().gcs_address
    try:
        alive = list_actors(address=address, filters=[("state", "!=", "DEAD")])
        running = list_tasks(address=address, filters=[("state", "=", "RUNNING")])
        groups = list_placement_groups(address=address, filters=[("state", "!=", "REMOVED")])
    except Exception as e:  # the State API is a diagnosis only
        return f"(the State API did not answer: {e})"
    actors = [f"{a.class_name}({a.state})" for a in alive]
    tasks = [t.name for t in running]
    pgs = [f"{g.placement_group_id[:8]}({g.state})" for g in groups]
    return f"actors {actors}, running tasks {tasks}, placement groups {pgs}"


@pytest.fixture
def ray_refused(monkeypatch):
    """``ray.init`` raises :class:`_ray_stub.RayStarted` (and Ray counts as not started, so that
    nothing skips the call): a test sees how far a command gets before it would start Ray."""
    import ray
    from _ray_stub import refuse

    monkeypatch.setattr(ray, "init", refuse)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
