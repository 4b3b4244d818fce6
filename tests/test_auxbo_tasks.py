"""auxbo task families (synthetic.py, lcbench.py, taskstore.py): synthetic, mini-LCBench, Parquet store."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pyarrow.parquet as pq
import pytest

from nshot.methods.auxbo import data as D
from nshot.methods.auxbo import lcbench as LC
from nshot.methods.auxbo import synthetic as S
from nshot.methods.auxbo import taskstore as TS

# ------------------------------------------------------------------------------- synthetic


@pytest.fixture(scope="module")
def syn():
    """The first synthetic family (version 1), kept reproducible by ``synthetic_version=1``."""
    return S.synthetic_family(n_train=20, n_test=10, n_candidates=300, seed=0, version=1)


def test_synthetic_shapes_and_encoding(syn):
    train, test = syn
    assert len(train) == 20 and len(test) == 10
    X0 = train[0].X
    for t in train + test:
        assert t.family == "synthetic" and t.configs is None
        assert t.X.shape == (300, 4) and t.X.dtype == np.float32
        assert t.f.shape == (300,) and t.f.dtype == np.float32
        assert t.h.shape == (300, 10, 3) and t.h.dtype == np.float32
        assert len(t.h_names) == 3
        assert np.array_equal(t.X, X0)  # one candidate set for the whole family
        assert t.X.min() >= 0.0 and t.X.max() <= 1.0
        assert t.f_star == pytest.approx(float(t.f.max())) and t.f_min == pytest.approx(t.f.min())
    names = [t.name for t in train + test]
    assert len(set(names)) == len(names)
    assert train[3].name == "synthetic/train/0003" and test[7].name == "synthetic/test/0007"


def test_synthetic_deterministic_and_seeded(syn):
    train, test = syn
    train2, test2 = S.synthetic_family(n_train=20, n_test=10, n_candidates=300, seed=0, version=1)
    for a, b in zip(train + test, train2 + test2):
        assert np.array_equal(a.f, b.f) and np.array_equal(a.h, b.h) and np.array_equal(a.X, b.X)
    # a task does not depend on how many tasks are drawn
    more, _ = S.synthetic_family(n_train=25, n_test=1, n_candidates=300, seed=0, version=1)
    assert np.array_equal(more[5].h, train[5].h)
    other, _ = S.synthetic_family(n_train=2, n_test=1, n_candidates=300, seed=1, version=1)
    assert not np.allclose(other[0].X, train[0].X)
    assert not np.allclose(other[0].info["tau"], train[0].info["tau"])


def test_synthetic_train_test_disjoint(syn):
    train, test = syn
    taus_train = np.array([t.info["tau"] for t in train])
    taus_test = np.array([t.info["tau"] for t in test])
    dist = np.abs(taus_train[:, None, :] - taus_test[None, :, :]).sum(-1)
    assert dist.min() > 1e-6
    assert np.all(np.abs(taus_train) <= 1.0)


def test_synthetic_f_peaks_near_tau(syn):
    train, test = syn
    clean_train, _ = S.synthetic_family(n_train=20, n_test=0, seed=0, noise=False, version=1)
    for noisy, clean in zip(train, clean_train):
        tau = np.asarray(noisy.info["tau"])
        x = noisy.X * 2.0 - 1.0
        d2 = ((x - tau) ** 2).sum(1)
        nearest = int(np.argmin(d2))
        assert int(np.argmax(clean.f)) == nearest
        np.testing.assert_allclose(clean.f, np.exp(-d2 / 0.5), rtol=1e-5, atol=1e-6)
        assert noisy.f[nearest] >= noisy.f.max() - 0.05
        resid = noisy.f - clean.f
        assert 0.005 < resid.std() < 0.02  # N(0, 0.01^2) noise
        # h is ~0 at the optimum (tanh(A (x - tau))) and larger far from it
        far = int(np.argmax(d2))
        assert np.abs(clean.h[nearest]).mean() < np.abs(clean.h[far]).mean()


def test_synthetic_h_depends_on_tau(syn):
    train, _ = syn
    a, b = train[0], train[1]
    assert np.abs(a.h - b.h).mean() > 0.1
    # clean h = tanh(A (x - tau)) spans the informative range of tanh, not just its tails
    clean, _ = S.synthetic_family(n_train=1, n_test=0, seed=0, noise=False, version=1)
    t = clean[0]
    assert np.abs(t.h).max() < 1.0
    assert t.h.std() > 0.2


def test_synthetic_version_1_is_the_first_family():
    """Version 1 stays what it was: f = exp(-|x - τ|^2 / 0.5), h = tanh(A (x - τ)) on the cube,
    drawing τ and then the noise from each task's stream."""
    (t,), _ = S.synthetic_family(n_train=1, n_test=0, n_candidates=50, seed=4, version=1)
    rng = S._rng(4, (S._STREAM_TRAIN, 0))
    tau = rng.uniform(-1.0, 1.0, size=4)
    x = t.X.astype(np.float64) * 2.0 - 1.0
    f = np.exp(-((x - tau) ** 2).sum(1) / 0.5) + rng.normal(0.0, 0.01, size=50)
    h = np.tanh(np.einsum("tkd,nd->ntk", S.synthetic_maps(4), x - tau))
    h = h + rng.normal(0.0, 0.05, size=h.shape)
    np.testing.assert_allclose(t.f, f, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(t.h, h, rtol=1e-6, atol=1e-6)
    assert t.info["version"] == 1 and "gains" not in t.info
    with pytest.raises(ValueError, match="version"):
        S.synthetic_family(n_train=1, n_test=0, version=3)


def test_synthetic_v2_lives_on_a_torus_and_h_hides_the_side():
    """Version 2 (the default): f and h are functions of the offset to the optimum on the torus
    [-1, 1)^4; h shows how far each coordinate is from the optimum's (the mirror image of a
    design about τ has the same h), through the task's own gains c."""
    (t, u), _ = S.synthetic_family(n_train=2, n_test=0, n_candidates=200, seed=0, noise=False)
    assert t.info["version"] == 2 and len(t.info["gains"]) == 4
    gains = np.asarray(t.info["gains"])
    assert np.all((gains >= 0.5) & (gains <= 2.0))
    assert not np.allclose(gains, u.info["gains"])  # a task-level latent
    tau, A = np.asarray(t.info["tau"]), S.synthetic_maps(0)
    x = t.X.astype(np.float64) * 2.0 - 1.0
    delta = S.wrap(x - tau)
    np.testing.assert_allclose(t.f, np.exp(-(delta**2).sum(1) / 0.5), rtol=1e-5, atol=1e-6)
    # periodic: a design shifted by a whole period has the same f and h
    f_shift, h_shift = S.synthetic_values(x + np.array([2.0, 0, -2.0, 0]), tau, A, 2, gains)
    np.testing.assert_allclose(f_shift, t.f, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(h_shift, t.h, rtol=1e-5, atol=1e-6)
    # the mirror image about τ of any coordinate: same f and same h (h hides the side) ...
    mirror = x.copy()
    mirror[:, 1] = 2.0 * tau[1] - x[:, 1]
    f_m, h_m = S.synthetic_values(mirror, tau, A, 2, gains)
    np.testing.assert_allclose(h_m, t.h, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(f_m, t.f, rtol=1e-5, atol=1e-6)
    # ... but not how far each coordinate is: the same total distance, split otherwise, moves h
    swap = tau + np.roll(delta, 1, axis=1)
    f_s, h_s = S.synthetic_values(swap, tau, A, 2, gains)
    np.testing.assert_allclose(f_s, t.f, rtol=1e-5, atol=1e-6)
    assert np.abs(h_s - t.h).mean() > 0.05
    # the noisy family draws the same τ and gains
    (noisy, _), _ = S.synthetic_family(n_train=2, n_test=0, n_candidates=200, seed=0)
    assert noisy.info == t.info
    assert 0.005 < (noisy.f - t.f).std() < 0.02 and 0.03 < (noisy.h - t.h).std() < 0.07


def test_synthetic_v2_set_of_h_does_not_reveal_the_optimum_and_h_stays_informative():
    """The family's preconditions (claims ``synthetic_h_does_not_reveal_optimum`` and
    ``synthetic_h_informative``), on a few generated tasks: from the mean h of 5 random designs
    a ridge regression locates version 1's optimum (the leak) but not version 2's, and one
    design's h predicts its own f within the task above the declared floor."""
    from nshot.methods.auxbo.claims import INFORMATIVE_FLOOR, LEAK_BOUND
    from nshot.methods.auxbo.experiments import design_information, set_information

    leak = {}
    for version in (1, 2):
        train, test = S.synthetic_family(n_train=120, n_test=40, seed=0, version=version)
        leak[version] = set_information(train, test, sizes=(5,), draws=8)["optimum"][5]
        if version == 2:
            assert design_information(train, test) >= INFORMATIVE_FLOOR
            # the mean h of a whole task is the same for every task: 0
            means = np.array([t.h.mean(0) for t in train])
            assert np.abs(means).max() < 0.1
    assert leak[1] > 0.5  # the statistic sees a leak where there is one
    assert leak[2] <= LEAK_BOUND


def test_the_config_picks_the_synthetic_version():
    from nshot.method import get

    method = get("auxbo")
    for preset in ("smoke", "small", "paper"):
        assert method.config(preset).synthetic_version == 2
    train, _, _ = D.load_family(method.config("smoke", synthetic_version=1), "synthetic")
    assert train[0].info["version"] == 1
    train, _, _ = D.load_family(method.config("smoke"), "synthetic")
    assert train[0].info["version"] == 2


# ------------------------------------------------------------------------------- mini-LCBench


def test_lcbench_space_encode_decode():
    space = LC.lcbench_space()
    json.dumps(space)
    assert [p["name"] for p in space["params"]] == [
        "learning_rate_init",
        "alpha",
        "width",
        "batch_size",
        "momentum",
    ]
    X, configs = LC.lcbench_configs(100, seed=0)
    assert X.shape == (100, 5) and X.dtype == np.float32
    assert X.min() >= 0.0 and X.max() <= 1.0
    for x, c in zip(X, configs):
        assert 1e-4 <= c["learning_rate_init"] <= 1e-1 and 1e-6 <= c["alpha"] <= 1e-1
        assert isinstance(c["width"], int) and 8 <= c["width"] <= 128
        assert isinstance(c["batch_size"], int) and 8 <= c["batch_size"] <= 128
        assert 0.5 <= c["momentum"] <= 0.99
        np.testing.assert_allclose(LC.encode_config(c), x, atol=1e-6)
        assert LC.decode_x(x)["width"] == c["width"]
    assert LC.decode_x([0, 0, 0, 0, 0])["learning_rate_init"] == pytest.approx(1e-4)
    assert LC.decode_x([1, 1, 1, 1, 1]) == pytest.approx(
        {"learning_rate_init": 0.1, "alpha": 0.1, "width": 128, "batch_size": 128, "momentum": 0.99}
    )
    # log scale: the middle of the lr axis is the geometric mean
    assert LC.decode_x([0.5, 0, 0, 0, 0])["learning_rate_init"] == pytest.approx(10**-2.5)
    # spread over the space, deterministic
    assert X.std(0).min() > 0.2
    X2, configs2 = LC.lcbench_configs(100, seed=0)
    assert configs2 == configs and np.array_equal(X2, X)
    assert not np.array_equal(LC.lcbench_configs(100, seed=1)[0], X)


def test_lcbench_split():
    names = LC.lcbench_task_names()
    assert len(names) == len(set(names)) == 110
    split = LC.lcbench_split(0)
    test = [n for n, s in split.items() if s == "test"]
    assert len(test) >= 55 and len(split) - len(test) >= 50
    for n in names:
        if any(k in n for k in ("wine", "iris", "breast_cancer")):
            assert split[n] == "test", n
    for a in range(10):
        for b in range(a + 1, 10):
            full, small = f"lcbench/digits_{a}v{b}/full", f"lcbench/digits_{a}v{b}/n40"
            assert split[full] == split[small]
    assert LC.lcbench_split(0) == split
    assert LC.lcbench_split(1) != split
    assert LC.lcbench_split(0, ["lcbench/iris"]) == {"lcbench/iris": "test"}
    with pytest.raises(KeyError):
        LC.lcbench_split(0, ["lcbench/mnist"])


def test_lcbench_data_variants():
    full = LC.lcbench_data("lcbench/digits_3v8/full")
    small = LC.lcbench_data("lcbench/digits_3v8/n40")
    assert small.X_train.shape == (40, 64) and set(small.y_train.tolist()) == {0, 1}
    assert abs(small.y_train.mean() - 0.5) < 0.1  # stratified
    assert full.X_train.shape[0] > 250
    np.testing.assert_array_equal(full.y_val, small.y_val)  # same validation split
    np.testing.assert_allclose(full.X_train.mean(0), 0.0, atol=1e-6)  # scaler fit on train
    ovr = LC.lcbench_data("lcbench/digits_4vrest")
    y = np.concatenate([ovr.y_train, ovr.y_val])
    assert abs(y.mean() - 0.5) < 0.01 and ovr.n_classes == 2
    assert LC.lcbench_data("lcbench/digits").n_classes == 10
    assert LC.lcbench_data("lcbench/wine_1v2").n_classes == 2
    for bad in ("lcbench/iris_0v3", "lcbench/wine_0v1/n40", "lcbench/digits_3v8", "nope"):
        with pytest.raises(KeyError):
            LC.lcbench_data(bad)


def test_lcbench_task_tiny():
    task = LC.lcbench_task("lcbench/iris_1v2", n_configs=4, seed=0, epochs=3)
    assert task.family == "lcbench" and task.h_names == ("val_acc", "val_loss")
    assert task.X.shape == (4, 5) and task.h.shape == (4, 3, 2) and task.f.shape == (4,)
    assert len(task.configs) == 4
    np.testing.assert_array_equal(task.f, task.h[:, -1, 0])
    assert np.all((task.h[..., 0] >= 0) & (task.h[..., 0] <= 1))
    assert np.all((task.h[..., 1] >= 0) & (task.h[..., 1] <= LC.LOSS_CAP))
    assert np.isfinite(task.h).all()
    assert task.info["n_val"] == 20 and task.info["n_train"] == 80
    again = LC.lcbench_task("lcbench/iris_1v2", n_configs=4, seed=0, epochs=3)
    np.testing.assert_array_equal(again.h, task.h)


def test_train_curve_matches_plain_sklearn():
    from sklearn.neural_network import MLPClassifier

    data = LC.lcbench_data("lcbench/wine_0v1")
    cfg = {
        "learning_rate_init": 0.01,
        "alpha": 1e-4,
        "width": 16,
        "batch_size": 16,
        "momentum": 0.9,
    }
    with LC._quiet():
        curve = LC.train_curve(data, cfg, epochs=4, random_state=7)
    clf = MLPClassifier(
        hidden_layer_sizes=(16,),
        solver="sgd",
        learning_rate_init=0.01,
        alpha=1e-4,
        batch_size=16,
        momentum=0.9,
        random_state=7,
    )
    accs = []
    for e in range(4):
        clf.partial_fit(data.X_train, data.y_train, classes=[0, 1] if e == 0 else None)
        accs.append(np.mean(clf.predict(data.X_val) == data.y_val))
    np.testing.assert_allclose(curve[:, 0], accs, atol=1e-6)
    from sklearn.metrics import log_loss

    assert curve[-1, 1] == pytest.approx(
        log_loss(data.y_val, clf.predict_proba(data.X_val), labels=[0, 1]), rel=1e-4
    )
    assert curve[-1, 0] > 0.8  # an easy pair learns


def test_train_curve_divergence_is_guarded():
    data = LC.lcbench_data("lcbench/iris_0v1")
    data.X_train = data.X_train * 1e300  # overflow → non-finite weights
    cfg = {"learning_rate_init": 0.1, "alpha": 1e-6, "width": 8, "batch_size": 8, "momentum": 0.99}
    with LC._quiet():
        curve = LC.train_curve(data, cfg, epochs=5)
    assert np.isfinite(curve).all()
    np.testing.assert_allclose(curve[-1], [0.5, LC.LOSS_CAP])


# ------------------------------------------------------------------------------- Parquet cache

_SUBSET = ["lcbench/iris_0v1", "lcbench/wine_0v2", "lcbench/digits_0v1/n40"]


def _assert_same(a: TS.Task, b: TS.Task) -> None:
    assert a.name == b.name and a.family == b.family and a.h_names == b.h_names
    np.testing.assert_array_equal(a.X, b.X)
    np.testing.assert_array_equal(a.f, b.f)
    np.testing.assert_array_equal(a.h, b.h)
    assert a.configs == b.configs and a.info == b.info


def test_write_read_roundtrip(tmp_path, syn):
    train, test = syn
    lc = LC.lcbench_task("lcbench/iris_0v2", n_configs=3, epochs=2)
    path = TS.write_tasks(tmp_path / "h.parquet", train[:2] + [lc], test[:1])
    r_train, r_test = TS.read_tasks(path)
    for a, b in zip(train[:2] + [lc] + test[:1], r_train + r_test):
        _assert_same(a, b)
    table = pq.read_table(path)
    assert set(table.column_names) == {
        "task_id",
        "family",
        "config",
        "x",
        "f",
        "h",
        "h_shape",
        "split",
    }
    assert table.num_rows == 300 * 3 + 3
    assert table.column("h_shape")[0].as_py() == [10, 3]
    assert json.loads(table.column("config")[600].as_py()) == lc.configs[0]
    assert not list(tmp_path.glob("*.tmp"))


def test_lcbench_family_cache(tmp_path, monkeypatch):
    calls: list[str] = []
    real = LC.compute_lcbench_task

    def counting(name, *a, **k):
        calls.append(name)
        return real(name, *a, **k)

    monkeypatch.setattr(LC, "compute_lcbench_task", counting)
    kw = dict(n_configs=3, seed=0, cache_dir=tmp_path, progress=False, epochs=2, parallel=False)
    train, test = LC.lcbench_family(names=_SUBSET, **kw)
    assert sorted(calls) == sorted(_SUBSET)
    split = LC.lcbench_split(0, _SUBSET)
    assert [t.name for t in test] == [n for n in _SUBSET if split[n] == "test"]
    assert [t.name for t in train] == [n for n in _SUBSET if split[n] == "train"]
    files = list(tmp_path.glob("*.parquet"))
    assert len(files) == 1 and "n3-e2-s0" in files[0].name
    assert not list(tmp_path.glob("*.parts"))
    meta = json.loads(pq.read_schema(files[0]).metadata[b"auxbo"])
    assert meta["params"]["n_configs"] == 3 and meta["params"]["epochs"] == 2

    # second call: read from the cache, nothing computed
    calls.clear()
    train2, test2 = LC.lcbench_family(names=_SUBSET, **kw)
    assert calls == []
    for a, b in zip(train + test, train2 + test2):
        _assert_same(a, b)

    # another protocol (epochs) is another file
    LC.lcbench_family(names=_SUBSET[:1], **{**kw, "epochs": 1})
    assert len(list(tmp_path.glob("*.parquet"))) == 2

    # a damaged cache file is rebuilt, with a warning
    files[0].write_bytes(b"not parquet")
    calls.clear()
    with pytest.warns(UserWarning, match="unreadable cache"):
        train3, _ = LC.lcbench_family(names=_SUBSET, **kw)
    assert sorted(calls) == sorted(_SUBSET)
    np.testing.assert_array_equal(train3[0].h, train[0].h)


def test_lcbench_family_resumes(tmp_path, monkeypatch):
    real = LC.compute_lcbench_task
    calls: list[str] = []
    fail_at = [2]  # the second computed task fails once

    def flaky(name, *a, **k):
        calls.append(name)
        if len(calls) == fail_at[0]:
            fail_at[0] = -1
            raise RuntimeError("worker lost")
        return real(name, *a, **k)

    monkeypatch.setattr(LC, "compute_lcbench_task", flaky)
    kw = dict(n_configs=2, seed=0, cache_dir=tmp_path, progress=False, epochs=1, parallel=False)
    with pytest.raises(RuntimeError):
        LC.lcbench_family(names=_SUBSET, **kw)
    first = calls[0]
    calls.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        train, test = LC.lcbench_family(names=_SUBSET, **kw)
    assert first not in calls and len(calls) == len(_SUBSET) - 1
    assert sorted(t.name for t in train + test) == sorted(_SUBSET)


def test_family_dispatch():
    train, test = D.family("synthetic", "smoke")
    assert len(train) == 16 and len(test) == 4 and train[0].X.shape == (64, 4)
    with pytest.raises(ValueError):
        D.family("gripper")


# ----------------------------------------------------------------------- perturbed variant


def test_lcbench_perturbed_space_and_split():
    space = LC.lcbench_space("perturbed")
    lr, alpha = space["params"][0], space["params"][1]
    assert (lr["low"], lr["high"], alpha["low"], alpha["high"]) == (1e-4, 1.0, 1e-6, 1.0)
    assert [p["name"] for p in space["params"]] == [p["name"] for p in LC.lcbench_space()["params"]]
    X, configs = LC.lcbench_configs(64, seed=0, space=space)
    assert X.shape == (64, 5) and max(c["learning_rate_init"] for c in configs) > 0.1
    for x, c in zip(X, configs):
        np.testing.assert_allclose(LC.encode_config(c, space), x, atol=1e-6)
    with pytest.raises(ValueError):
        LC.lcbench_space("noisy")
    names = LC.lcbench_p_task_names()
    assert len(names) == len(set(names)) == 160 and names[7] == "lcbench-p/007"
    split = LC.lcbench_p_split(0)
    assert sum(s == "test" for s in split.values()) == 56
    assert LC.lcbench_p_split(0) == split and LC.lcbench_p_split(1) != split
    with pytest.raises(KeyError):
        LC.lcbench_p_split(0, ["lcbench/iris"])
    specs = [LC.lcbench_p_spec(n) for n in names]
    assert specs == [LC.lcbench_p_spec(n) for n in names]  # deterministic
    assert {s["base"] for s in specs} == {"digits", "wine", "breast_cancer", "iris"}
    assert all(0.0 <= s["noise"] <= 0.4 and 0.1 <= s["scale"] <= 10.0 for s in specs)
    assert all(24 <= s["n_train"] <= 256 for s in specs)
    ks = {len(s["classes"]) for s in specs if s["base"] == "digits"}
    assert min(ks) == 2 and max(ks) == 10
    assert np.std([np.log10(s["scale"]) for s in specs]) > 0.4
    with pytest.raises(KeyError):
        LC.lcbench_p_spec("lcbench-p/7")


def test_lcbench_perturbed_data():
    for name in ("lcbench-p/007", "lcbench-p/012"):
        spec = LC.lcbench_p_spec(name)
        d = LC.lcbench_data(name)
        assert d.X_train.shape[0] == len(d.y_train) == spec["n_train"]
        K = d.n_classes
        assert set(d.y_train.tolist()) <= set(range(K)) and set(d.y_val.tolist()) == set(range(K))
        # standardised on the training split, then scaled
        np.testing.assert_allclose(d.X_train.mean(0), 0.0, atol=1e-6 * spec["scale"])
        sd = d.X_train.std(0)
        np.testing.assert_allclose(sd[sd > 0], spec["scale"], rtol=1e-6)
        assert d.info["flipped"] == pytest.approx(spec["noise"], abs=0.15)
    # the noise only touches training labels: the validation split is the clean one
    v = LC.lcbench_data("lcbench-p/012")
    assert v.info["noise"] > 0.3 and v.info["n_val"] == len(v.y_val)


def test_lcbench_perturbed_family_tiny(tmp_path):
    names = ["lcbench-p/007", "lcbench-p/015"]
    kw = dict(n_configs=3, seed=0, cache_dir=tmp_path, progress=False, epochs=2, parallel=False)
    train, test = LC.lcbench_family(names=names, variant="perturbed", **kw)
    split = LC.lcbench_p_split(0, names)
    assert sorted(t.name for t in test) == sorted(n for n in names if split[n] == "test")
    tasks = train + test
    assert len(tasks) == 2
    for t in tasks:
        assert t.family == "lcbench" and t.h.shape == (3, 2, 2) and np.isfinite(t.h).all()
        assert t.info["size"] == "perturbed" and "noise" in t.info
    files = list(tmp_path.glob("*.parquet"))
    assert len(files) == 1 and files[0].name.startswith("mini-lcbench-perturbed-n3-e2-s0-p1")
    meta = json.loads(pq.read_schema(files[0]).metadata[b"auxbo"])
    assert meta["params"]["variant"] == "perturbed"
    assert meta["params"]["space"] == LC.lcbench_space("perturbed")
    with pytest.raises(ValueError):
        LC.lcbench_family(names=names, variant="noisy", **kw)


def test_split_restriction_rejects_unknown_task_names():
    split = LC.lcbench_p_split()
    assert sorted(split.values()).count("test") == 56 and len(split) == 160
    some = list(split)[:3]
    assert LC.lcbench_p_split(names=some) == {n: split[n] for n in some}
    with pytest.raises(KeyError, match="perturbed mini-LCBench"):
        LC.lcbench_p_split(names=["lcbench-p/nope"])
    with pytest.raises(KeyError, match="unknown mini-LCBench"):
        LC.lcbench_split(names=["lcbench/nope"])


def test_extra_perturbed_tasks_are_history_and_the_held_out_ones_stay():
    base = LC.lcbench_p_split(0)
    names = LC.lcbench_p_task_names(200)
    split = LC.lcbench_p_split(0, names)
    assert {n: split[n] for n in base} == base  # the first 160 keep their assignment
    assert all(split[n] == "train" for n in names[160:])
    assert LC.lcbench_p_spec("lcbench-p/321") != LC.lcbench_p_spec("lcbench-p/322")
    more = LC.lcbench_p_split(0, names, extra_test=10)
    assert {n: more[n] for n in base} == base
    assert sum(more[n] == "test" for n in names[160:]) == 10
    assert LC.lcbench_p_split(0, names, extra_test=10) == more  # seeded
    with pytest.raises(ValueError, match="only 40 tasks beyond"):
        LC.lcbench_p_split(0, names, extra_test=41)
    with pytest.raises(ValueError, match="1..1000"):
        LC.lcbench_p_task_names(1001)
    with pytest.raises(ValueError, match="n_tasks must be in"):
        LC.lcbench_family(variant="perturbed", n_tasks=100, progress=False)
    with pytest.raises(ValueError, match="perturbed variant"):
        LC.lcbench_family(variant="clean", n_tasks=200, progress=False)
