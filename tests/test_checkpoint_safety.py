"""Tampered, incomplete and oversized checkpoints are refused with one clear CheckpointError.

Refused: reads outside the checkpoint, a silently substituted earlier checkpoint, a config whose
model exhausts memory, non-finite weights and malformed ``state.json`` structures.
"""

from __future__ import annotations

import json
import os
import struct
import warnings

import pytest
import torch

from nshot.hashing import sha256_file
from nshot.train.checkpoint import (
    CheckpointError,
    load_checkpoint,
    resolve_checkpoint,
    save_checkpoint,
)


def _toy(path, step=3, *, state=None, optimizer=True):
    """A checkpoint of an unregistered method ("toy"): the format alone is under test."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    return save_checkpoint(
        path,
        method="toy",
        method_version="1",
        config={"width": 4},
        step=step,
        model_state=state if state is not None else model.state_dict(),
        metrics={"loss": 0.5},
        optimizer_state=opt.state_dict() if optimizer else None,
        extra={"history": [1]},
    )


def _state(path):
    return json.loads((path / "state.json").read_text())


def _write_state(path, state):
    (path / "state.json").write_text(json.dumps(state))


# ----------------------------------------------------- reads outside the checkpoint


@pytest.mark.parametrize("where", ["relative", "absolute"])
def test_files_outside_the_checkpoint_are_never_read(tmp_path, where):
    ckpt = _toy(tmp_path / "run" / "ckpt")
    secret = tmp_path / "secret.txt"
    secret.write_text("password")
    name = "../../secret.txt" if where == "relative" else str(secret)
    state = _state(ckpt)
    state["files"][name] = sha256_file(secret)  # the right hash: still refused
    _write_state(ckpt, state)
    with pytest.raises(CheckpointError, match="secret.txt"):
        load_checkpoint(ckpt)


def test_proc_files_are_never_read(tmp_path):
    ckpt = _toy(tmp_path / "ckpt")
    state = _state(ckpt)
    state["files"]["/proc/self/environ"] = sha256_file("/proc/self/environ")
    _write_state(ckpt, state)
    with pytest.raises(CheckpointError, match="/proc/self/environ"):
        load_checkpoint(ckpt)


@pytest.mark.parametrize("name", ["model.safetensors", "state.json"])
def test_symlinked_files_are_refused(tmp_path, name):
    ckpt = _toy(tmp_path / "ckpt")
    outside = tmp_path / f"outside-{name}"
    os.replace(ckpt / name, outside)  # same bytes, same hash, but outside the checkpoint
    (ckpt / name).symlink_to(outside)
    with pytest.raises(CheckpointError, match="symbolic link"):
        load_checkpoint(ckpt)


def test_a_symlinked_checkpoint_directory_loads(tmp_path):
    ckpt = _toy(tmp_path / "real")
    (tmp_path / "link").symlink_to(ckpt, target_is_directory=True)
    assert load_checkpoint(tmp_path / "link").step == 3


@pytest.mark.parametrize(
    "files, match",
    [
        ({}, "no files|model.safetensors"),
        ("optimizer", "model.safetensors"),
        ("unknown", "notes.txt"),
    ],
)
def test_empty_or_incomplete_file_lists_are_corrupt(tmp_path, files, match):
    ckpt = _toy(tmp_path / "ckpt")
    state = _state(ckpt)
    if files == "optimizer":  # the required model file is not listed
        state["files"] = {"optimizer.safetensors": state["files"]["optimizer.safetensors"]}
    elif files == "unknown":
        (ckpt / "notes.txt").write_text("hi")
        state["files"]["notes.txt"] = sha256_file(ckpt / "notes.txt")
    else:
        state["files"] = files
    _write_state(ckpt, state)
    with pytest.raises(CheckpointError, match=match):
        load_checkpoint(ckpt)


def test_optimizer_state_needs_a_hashed_optimizer_file(tmp_path):
    ckpt = _toy(tmp_path / "ckpt")
    state = _state(ckpt)
    del state["files"]["optimizer.safetensors"]  # then replaced without a hash
    _write_state(ckpt, state)
    with pytest.raises(CheckpointError, match="optimizer"):
        load_checkpoint(ckpt)


# ------------------------------------------------- a substituted earlier checkpoint


def test_a_newest_checkpoint_without_state_is_not_silently_replaced(tmp_path):
    run = tmp_path / "run"
    _toy(run / "checkpoint_00000025", step=25)
    newest = _toy(run / "checkpoint_00000050", step=50)
    (newest / "state.json").unlink()
    with pytest.raises(CheckpointError) as err:
        resolve_checkpoint(run)
    msg = str(err.value)
    assert "checkpoint_00000050" in msg and "checkpoint_00000025" in msg
    assert "--allow-earlier-checkpoint" in msg
    with pytest.raises(CheckpointError, match="allow-earlier-checkpoint"):
        load_checkpoint(run)
    with pytest.warns(UserWarning, match="checkpoint_00000025"):
        assert resolve_checkpoint(run, allow_earlier=True).name == "checkpoint_00000025"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert load_checkpoint(run, allow_earlier=True).step == 25


def test_a_newest_checkpoint_with_broken_state_is_reported(tmp_path):
    run = tmp_path / "run"
    _toy(run / "checkpoint_00000025", step=25)
    newest = _toy(run / "checkpoint_00000050", step=50)
    (newest / "state.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="checkpoint_00000050"):
        load_checkpoint(run)


def test_a_checkpoint_dir_without_state_says_so(tmp_path):
    ckpt = _toy(tmp_path / "checkpoint_00000010", step=10)
    (ckpt / "state.json").unlink()
    with pytest.raises(CheckpointError, match="state.json"):
        load_checkpoint(ckpt)
    lone = tmp_path / "run"
    _toy(lone / "checkpoint_00000005", step=5)
    (lone / "checkpoint_00000005" / "state.json").unlink()
    with pytest.raises(CheckpointError, match="no earlier"):
        load_checkpoint(lone, allow_earlier=True)


def test_complete_run_dirs_still_resolve_to_the_latest(tmp_path):
    run = tmp_path / "run"
    for step in (5, 20, 10):
        _toy(run / f"checkpoint_{step:08d}", step=step)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_checkpoint(run).name == "checkpoint_00000020"


# -------------------------------------------------------------- malformed state.json


def _set(key, value):
    def edit(state):
        state[key] = value
        return state

    return edit


def _drop(key):
    def edit(state):
        del state[key]
        return state

    return edit


MALFORMED = {
    "step_text": _set("step", "abc"),
    "step_float": _set("step", 2.5),
    "step_bool": _set("step", True),
    "step_negative": _set("step", -1),
    "no_step": _drop("step"),
    "no_config": _drop("config"),
    "config_list": _set("config", [1, 2]),
    "no_method": _drop("method"),
    "method_number": _set("method", 3),
    "files_list": _set("files", ["model.safetensors"]),
    "files_missing": _drop("files"),
    "files_hash_number": lambda s: {**s, "files": {**s["files"], "model.safetensors": 1}},
    "metrics_list": _set("metrics", [0.5]),
    "metrics_text_value": _set("metrics", {"loss": "low"}),
    "extra_list": _set("extra", [1]),
    "optimizer_list": _set("optimizer", [1]),
    "optimizer_no_groups": _set("optimizer", {"scalars": {}}),
    "method_version_dict": _set("method_version", {"a": 1}),
    "top_level_list": lambda s: [s],
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_state_is_one_clear_error(tmp_path, case):
    ckpt = _toy(tmp_path / "ckpt")
    (ckpt / "state.json").write_text(json.dumps(MALFORMED[case](_state(ckpt))))
    with pytest.raises(CheckpointError, match="state.json"):
        load_checkpoint(ckpt)


def test_deeply_nested_state_is_one_clear_error(tmp_path):
    ckpt = _toy(tmp_path / "ckpt")
    raw = (ckpt / "state.json").read_text()
    deep = "[" * 100_000 + "]" * 100_000
    (ckpt / "state.json").write_text(raw.rstrip()[:-1] + f', "deep": {deep}}}')
    with pytest.raises(CheckpointError, match="state.json"):
        load_checkpoint(ckpt)


def test_bad_optimizer_tensor_names_are_one_clear_error(tmp_path):
    ckpt = _toy(tmp_path / "ckpt")
    from safetensors.torch import save_file

    save_file({"weird": torch.zeros(2)}, str(ckpt / "optimizer.safetensors"))
    state = _state(ckpt)
    state["files"]["optimizer.safetensors"] = sha256_file(ckpt / "optimizer.safetensors")
    _write_state(ckpt, state)
    with pytest.raises(CheckpointError, match="optimizer"):
        load_checkpoint(ckpt).optimizer_state()


# --------------------------------------------------------------- non-finite weights


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_weights_are_refused(tmp_path, bad):
    w = torch.zeros(2, 4)
    w[1, 2] = bad
    ckpt = _toy(tmp_path / "ckpt", state={"ok": torch.ones(3), "layer.weight": w})
    loaded = load_checkpoint(ckpt)  # the JSON is fine; the tensors are checked when read
    with pytest.raises(CheckpointError, match="layer.weight.*(NaN|inf|finite)"):
        loaded.weights()


def test_integer_tensors_and_finite_weights_load(tmp_path):
    state = {"w": torch.randn(3, 3), "idx": torch.arange(4), "h": torch.ones(2).half()}
    ckpt = _toy(tmp_path / "ckpt", state=state)
    assert set(load_checkpoint(ckpt).weights()) == {"w", "idx", "h"}


# ----------------------------------------------------- a model that exhausts memory


def _tail_checkpoint(path, **config):
    from nshot.method import get
    from nshot.methods.tail.model import TailModel

    tail = get("tail")
    cfg = tail.config("smoke")
    torch.manual_seed(0)
    return save_checkpoint(
        path,
        method="tail",
        method_version=tail.version,
        config={**cfg.model_dump(), **config},
        step=1,
        model_state=TailModel(cfg).state_dict(),
    )


def test_the_issue_config_is_refused_before_any_model_is_built(tmp_path):
    huge = dict(depth=64, mlp_dim=65536, d_data=8192, d_label=4096, heads=64)
    ckpt = _tail_checkpoint(tmp_path / "ckpt", **huge)
    with pytest.raises(CheckpointError, match="depth|mlp_dim|d_data|parameters"):
        load_checkpoint(ckpt, method="tail")
    with pytest.raises(CheckpointError):
        load_checkpoint(ckpt)  # the state's method is registered: the same check


def test_tail_bounds_are_tightened_to_what_presets_need():
    from nshot.method import ConfigError, get

    tail = get("tail")
    for field in ("depth", "heads", "mlp_dim", "d_data", "d_label"):
        with pytest.raises(ConfigError, match=field):
            tail.config("smoke", **{field: {"depth": 64, "heads": 64}.get(field, 65536)})
    for preset in ("smoke", "small", "paper"):
        tail.config(preset)


def test_model_size_limits_are_documented_and_overridable(tmp_path, monkeypatch):
    ckpt = _tail_checkpoint(tmp_path / "ckpt")
    assert load_checkpoint(ckpt, method="tail").step == 1  # under the default limits
    monkeypatch.setenv("NSHOT_MAX_MODEL_PARAMS", "1000")
    with pytest.raises(CheckpointError, match="parameters.*1,?000.*NSHOT_MAX_MODEL_PARAMS"):
        load_checkpoint(ckpt, method="tail")
    assert load_checkpoint(ckpt, method="tail", max_params=10**9).step == 1
    monkeypatch.delenv("NSHOT_MAX_MODEL_PARAMS")
    monkeypatch.setenv("NSHOT_MAX_ACTIVATION_BYTES", "1024")
    with pytest.raises(CheckpointError, match="activation.*NSHOT_MAX_ACTIVATION_BYTES"):
        load_checkpoint(ckpt, method="tail")
    assert load_checkpoint(ckpt, method="tail", max_activation_bytes=2**40).step == 1
    monkeypatch.setenv("NSHOT_MAX_ACTIVATION_BYTES", "lots")
    with pytest.raises(CheckpointError, match="NSHOT_MAX_ACTIVATION_BYTES"):
        load_checkpoint(ckpt, method="tail")


def test_config_that_the_weights_cannot_be_is_refused(tmp_path):
    ckpt = _tail_checkpoint(tmp_path / "ckpt", depth=4, mlp_dim=192)  # smoke weights: depth 1
    with pytest.raises(CheckpointError, match="model.safetensors.*(holds|tensor)"):
        load_checkpoint(ckpt, method="tail")


def _write_raw_safetensors(path, header, data=b"\0" * 8):
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + data)


@pytest.mark.parametrize(
    "header",
    [
        {"w": {"dtype": "F32", "shape": [10**12], "data_offsets": [0, 4 * 10**12]}},
        {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "v": "oops"},
        {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}},
        {"w": {"dtype": "XYZ", "shape": [2], "data_offsets": [0, 8]}},
    ],
)
def test_absurd_safetensors_headers_are_refused(tmp_path, header):
    ckpt = _toy(tmp_path / "ckpt", optimizer=False)
    _write_raw_safetensors(ckpt / "model.safetensors", header)
    state = _state(ckpt)
    state["files"]["model.safetensors"] = sha256_file(ckpt / "model.safetensors")
    _write_state(ckpt, state)
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_checkpoint(ckpt)


def test_huge_header_length_is_refused(tmp_path):
    ckpt = _toy(tmp_path / "ckpt", optimizer=False)
    (ckpt / "model.safetensors").write_bytes(struct.pack("<Q", 2**62) + b"{}")
    state = _state(ckpt)
    state["files"]["model.safetensors"] = sha256_file(ckpt / "model.safetensors")
    _write_state(ckpt, state)
    with pytest.raises(CheckpointError, match="model.safetensors.*header"):
        load_checkpoint(ckpt)


PRESETS = ("smoke", "small", "paper")


def test_every_method_budget_fits_its_presets_and_matches_its_model():
    """Each method's estimate for its own presets is under the default limits; where it
    declares the weights' size, that size is what its smoke model's state dict holds."""
    from nshot.method import available, get
    from nshot.train.limits import DEFAULT_MAX_ACTIVATION_BYTES, DEFAULT_MAX_PARAMS

    budgets = {}
    for name in available():
        method = get(name)
        for preset in PRESETS:
            if preset not in method.Config.PRESETS:
                continue
            b = method.model_budget(method.config(preset))
            if b is None:
                continue
            budgets[(name, preset)] = b
            assert 0 < b.params <= DEFAULT_MAX_PARAMS, (name, preset, b)
            assert 0 < b.activation_bytes <= DEFAULT_MAX_ACTIVATION_BYTES, (name, preset, b)
    assert ("tail", "paper") in budgets
    from nshot.methods.tail.model import TailModel

    cfg = get("tail").config("smoke")
    real = sum(t.numel() for t in TailModel(cfg).state_dict().values())
    assert budgets[("tail", "smoke")].weights_numel == real


def test_model_shapes_recorded_in_extra_are_bounded_before_building(tmp_path):
    """front rebuilds its ViT from ``extra["shape"]``: a huge shape is refused, not built."""
    from nshot.method import get

    front = get("front")
    cfg = front.config("smoke")
    shape = {"img_size": 8, "patch": 2, "in_chans": 1, "num_classes": 10, "width": 32,
             "depth": 10**9, "heads": 2, "mlp_ratio": 4.0}  # fmt: skip
    ckpt = save_checkpoint(
        tmp_path / "ckpt",
        method="front",
        method_version=front.version,
        config=cfg.model_dump(),
        step=1,
        model_state={"w": torch.zeros(2)},
        extra={"stage": "descendant", "shape": shape},
    )
    with pytest.raises(CheckpointError, match="extra.shape.depth"):
        load_checkpoint(ckpt, method="front")


def test_auxbo_budget_follows_its_recorded_tnp():
    from nshot.method import get
    from nshot.train.limits import DEFAULT_MAX_ACTIVATION_BYTES, DEFAULT_MAX_PARAMS

    auxbo = get("auxbo")
    for preset in ("smoke", "small", "paper"):  # paper: with chunked candidates
        cfg = auxbo.config(preset)
        tnp = dict(x_dim=8, h_len=50, h_dim=3, d=cfg.d, heads=cfg.heads, layers_h=cfg.layers_h,
                   layers=cfg.layers, use_h=cfg.use_h)  # fmt: skip
        b = auxbo.model_budget(cfg, {"tnp": tnp})
        assert 0 < b.params <= DEFAULT_MAX_PARAMS
        assert 0 < b.activation_bytes <= DEFAULT_MAX_ACTIVATION_BYTES
    with pytest.raises(ValueError, match="extra.tnp.d"):
        auxbo.model_budget(cfg, {"tnp": {**tnp, "d": 10**7}})
