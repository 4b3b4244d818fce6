"""Checkpoints: safetensors + JSON round trip, corruption and mismatch detection."""

from __future__ import annotations

import json

import pytest
import torch

from nshot.train.checkpoint import (
    CheckpointError,
    find_checkpoints,
    load_checkpoint,
    resolve_checkpoint,
    save_checkpoint,
)


def _model_and_opt():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(5, 4)).sum().backward()
        opt.step()
    return model, opt


def _save(path, model, opt, step=3):
    return save_checkpoint(
        path,
        method="toy",  # not a registered method: only the format is under test
        method_version="1",
        config={"depth": 2},
        step=step,
        model_state=model.state_dict(),
        metrics={"loss": 0.5},
        optimizer_state=opt.state_dict(),
        extra={"history": [1, 2]},
    )


def test_round_trip_restores_weights_and_optimizer(tmp_path):
    model, opt = _model_and_opt()
    path = _save(tmp_path / "ckpt", model, opt)
    assert not list(path.glob("*.pkl")) and (path / "state.json").exists()
    loaded = load_checkpoint(path, method="toy")
    assert loaded.step == 3 and loaded.config == {"depth": 2} and loaded.extra["history"] == [1, 2]
    model2, opt2 = _model_and_opt()
    with torch.no_grad():
        for p in model2.parameters():
            p.add_(1.0)
    model2.load_state_dict(loaded.weights())
    opt2.load_state_dict(loaded.optimizer_state())
    for a, b in zip(model.state_dict().values(), model2.state_dict().values()):
        assert torch.equal(a, b)
    # one more identical step from both gives identical weights: the optimizer state came back
    x = torch.randn(5, 4)
    for mod, o in ((model, opt), (model2, opt2)):
        o.zero_grad()
        mod(x).sum().backward()
        o.step()
    for a, b in zip(model.state_dict().values(), model2.state_dict().values()):
        assert torch.equal(a, b)


def test_ddp_prefix_is_stripped(tmp_path):
    model, _ = _model_and_opt()
    state = {f"module.{k}": v for k, v in model.state_dict().items()}
    save_checkpoint(
        tmp_path / "c", method="toy", method_version="1", config={}, step=1, model_state=state
    )
    assert set(load_checkpoint(tmp_path / "c").weights()) == set(model.state_dict())


def test_corrupt_weights_are_detected(tmp_path):
    model, opt = _model_and_opt()
    path = _save(tmp_path / "ckpt", model, opt)
    data = bytearray((path / "model.safetensors").read_bytes())
    data[-3] ^= 0xFF
    (path / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupt"):
        load_checkpoint(path)


def test_truncated_file_and_missing_file_are_detected(tmp_path):
    model, opt = _model_and_opt()
    path = _save(tmp_path / "ckpt", model, opt)
    raw = (path / "optimizer.safetensors").read_bytes()
    (path / "optimizer.safetensors").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(CheckpointError, match="corrupt"):
        load_checkpoint(path)
    (path / "optimizer.safetensors").unlink()
    with pytest.raises(CheckpointError, match="missing optimizer.safetensors"):
        load_checkpoint(path)


def test_bad_json_wrong_format_and_wrong_method(tmp_path):
    model, opt = _model_and_opt()
    path = _save(tmp_path / "ckpt", model, opt)
    with pytest.raises(CheckpointError, match="belongs to method 'toy', not 'urs'"):
        load_checkpoint(path, method="urs")
    state = json.loads((path / "state.json").read_text())
    state["format"] = "pickle"
    (path / "state.json").write_text(json.dumps(state))
    with pytest.raises(CheckpointError, match="not an nshot-checkpoint"):
        load_checkpoint(path)
    (path / "state.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_checkpoint(path)


def test_run_dir_resolves_to_latest_step(tmp_path):
    model, opt = _model_and_opt()
    for step in (5, 20, 10):
        _save(tmp_path / "run" / f"checkpoint_{step:08d}", model, opt, step=step)
    assert [p.name for p in find_checkpoints(tmp_path / "run")] == [
        "checkpoint_00000005",
        "checkpoint_00000010",
        "checkpoint_00000020",
    ]
    assert resolve_checkpoint(tmp_path / "run").name == "checkpoint_00000020"
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no nshot checkpoint"):
        load_checkpoint(tmp_path / "empty")
