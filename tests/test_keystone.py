"""keystone: neuron hooks (a hooked zero equals a zeroed row), probe pieces, predictor schema, smoke train loop."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from nshot.method import ConfigError, get
from nshot.methods.keystone.config import KeystoneConfig
from nshot.methods.keystone.neurons import DeltaRows, NeuronHooks, NeuronSpace
from nshot.methods.keystone.probe import candidates, iou, module_matched_set, random_set
from nshot.methods.keystone.serve import KeystoneRequest, KeystoneResponse


@pytest.fixture(scope="module")
def tiny():
    from transformers import LlamaForCausalLM

    from nshot.nn.lm import tiny_llama_config

    torch.manual_seed(0)
    cfg = tiny_llama_config(50, layers=2, hidden=32, intermediate=64, heads=4, kv_heads=2)
    return LlamaForCausalLM(cfg).eval()


def _ids() -> torch.Tensor:
    return torch.randint(3, 50, (2, 7), generator=torch.Generator().manual_seed(1))


def test_space_counts(tiny) -> None:
    space = NeuronSpace(tiny)
    # q 32, k 16, v 16 (2 kv heads of 8), o 32, gate 64, up 64 per layer
    assert space.per_layer_counts() == {"q": 32, "k": 16, "v": 16, "o": 32, "gate": 64, "up": 64}
    assert space.total == 2 * 224
    for g in (0, 31, 32, 223, 224, 447):
        n = space.neuron(g)
        assert space.gid(n.layer, n.module, n.index) == g
    with pytest.raises(ValueError):
        NeuronSpace(tiny, ["q", "nope"])


@torch.no_grad()
def test_hooked_zeroing_equals_zeroing_rows(tiny) -> None:
    space = NeuronSpace(tiny)
    rng = np.random.default_rng(0)
    gids = rng.choice(space.total, 25, replace=False).tolist()
    x = _ids()
    with NeuronHooks(space, scale=(gids, 0.0)):
        hooked = tiny(input_ids=x).logits
    saved = {b: space.linears[b].weight.detach().clone() for b in space.split(gids)}
    try:
        for b, idx in space.split(gids).items():
            space.linears[b].weight[idx] = 0.0
        edited = tiny(input_ids=x).logits
    finally:
        for b, w in saved.items():
            space.linears[b].weight.copy_(w)
    assert (hooked - edited).abs().max().item() < 1e-6
    assert (hooked - tiny(input_ids=x).logits).abs().max().item() > 1e-4  # it did something


@torch.no_grad()
def test_delta_rows_equal_editing_rows(tiny) -> None:
    space = NeuronSpace(tiny)
    gids = [0, 5, 40, 100, 300, 447]
    delta = DeltaRows(space, gids)
    for p in delta.parameters():
        p.normal_(0, 0.3)
    x = _ids()
    with NeuronHooks(space, delta=delta):
        hooked = tiny(input_ids=x).logits
    saved = {b: space.linears[b].weight.detach().clone() for b, _, _ in delta.items()}
    try:
        delta.merge_into()
        edited = tiny(input_ids=x).logits
    finally:
        for b, w in saved.items():
            space.linears[b].weight.copy_(w)
    assert (hooked - edited).abs().max().item() < 1e-5
    assert delta.n_rows == len(gids)


def test_delta_rows_train_only_delta(tiny) -> None:
    import copy

    from nshot.methods.keystone.sft import DeltaModel

    lm = copy.deepcopy(tiny)
    space = NeuronSpace(lm)
    dm = DeltaModel(lm, space, [3, 70])
    assert [n for n, p in dm.named_parameters() if p.requires_grad] == [
        "delta.deltas.0_q",
        "delta.deltas.0_k",
    ] or all(n.startswith("delta.") for n, p in dm.named_parameters() if p.requires_grad)
    loss = dm(input_ids=_ids(), labels=_ids()).loss
    loss.backward()
    assert all(p.grad is None for p in lm.parameters())
    assert all(p.grad is not None for p in dm.delta.parameters())
    dm.remove_hooks()


@torch.no_grad()
def test_response_loss_equals_model_loss(tiny) -> None:
    from nshot.methods.keystone.sft import ResponseLoss

    ids = _ids()
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    labels = torch.full_like(ids, -100)
    labels[:, 3:5] = ids[:, 3:5]
    ref = tiny(input_ids=ids, attention_mask=mask, labels=labels).loss
    assert abs(float(ResponseLoss(tiny)(ids, mask, labels)) - float(ref)) < 1e-5


def test_record_counts_decode_tokens_only(tiny) -> None:
    from nshot.methods.keystone.probe import activation_strengths

    class Tok:
        pad_token_id, bos_token_id, eos_token_id, chat_template = 0, 1, 2, None

        def __call__(self, text, add_special_tokens=True):
            class R:
                input_ids = [1] + [3 + (ord(c) % 40) for c in text]

            return R()

        def batch_decode(self, ids, skip_special_tokens=True):
            return [" ".join(map(str, r.tolist())) for r in ids]

    space = NeuronSpace(tiny)
    s, texts = activation_strengths(tiny, Tok(), space, ["ab", "hello"], 5, chat=False)
    assert s.shape == (2, space.total) and np.all(s >= 0) and len(texts) == 2


def test_candidates_and_controls() -> None:
    class Space:
        total = 40
        offsets = np.array([0, 10, 20, 30, 40])
        widths = np.array([10, 10, 10, 10])
        blocks = [(0, "q"), (0, "up"), (1, "q"), (1, "up")]
        block_id = np.repeat(np.arange(4), 10)

    space = Space()
    s = np.ones((2, 40))
    s[0, 30:40], s[1, 30:40] = np.arange(10), np.arange(10)[::-1]  # different tops per prompt
    s[1, 10:20] = np.arange(10)[::-1]
    s[:, [3, 25]] = 50.0  # strong in both prompts
    s[0, 12] = 80.0  # strong in one prompt only
    pool, strength = candidates(space, s, 0.1)
    assert set(pool.tolist()) == {3, 25}
    rng = np.random.default_rng(0)
    keys = [3, 25, 31]
    m = module_matched_set(space, keys, rng)
    assert [space.blocks[space.block_id[g]][1] for g in m] == ["q", "q", "up"]
    assert not set(m) & set(keys)
    same = module_matched_set(space, keys, rng, same_layer=True)
    assert [space.block_id[g] for g in same] == [0, 2, 3]
    assert len(set(random_set(space, 5, rng, keys)) - set(keys)) == 5
    assert iou([1, 2, 3], [2, 3, 4]) == 0.5


def test_config_errors() -> None:
    with pytest.raises(ConfigError, match="modules"):
        KeystoneConfig.from_preset("smoke", modules=["q", "zz"])
    with pytest.raises(ConfigError, match="calib_grid"):
        KeystoneConfig.from_preset("smoke", calib_grid=[20.0])
    with pytest.raises(ConfigError, match="bogus"):
        KeystoneConfig.from_preset("smoke", bogus=1)
    with pytest.raises(ConfigError, match="fail_at_step.*one step"):
        KeystoneConfig.from_preset("smoke", fail_at_step=2)
    assert get("keystone").config("small").model == "smollm2"


def test_device_field(monkeypatch) -> None:
    from nshot.methods.keystone.model import load_model
    from nshot.nn.lm import DeviceError

    assert KeystoneConfig.from_preset("smoke").device == "auto"
    assert KeystoneConfig.from_preset("smoke", device="cpu").device == "cpu"
    for bad in ("gpu", "cuda:a"):
        with pytest.raises(ConfigError, match="field 'device'"):
            KeystoneConfig.from_preset("smoke", device=bad)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DeviceError, match="cuda:0"):
        load_model("tiny-smoke", KeystoneConfig.from_preset("smoke", device="cuda:0"))


def test_request_schema() -> None:
    from pydantic import ValidationError

    KeystoneRequest(prompt="hi", intervention={"mode": "scale_keystone", "scale": 2.0})
    for bad in (
        {"prompt": ""},
        {"prompt": "   "},
        {"prompt": "hi", "max_new_tokens": 0},
        {"prompt": "hi", "intervention": {"mode": "explode"}},
        {"prompt": "hi", "intervention": {"mode": "scale_keystone"}},
        {"prompt": "hi", "intervention": {"mode": "scale_keystone", "scale": 11}},
        {"prompt": "hi", "intervention": {"mode": "zero_keystone", "scale": 1.0}},
    ):
        with pytest.raises(ValidationError):
            KeystoneRequest.model_validate(bad)


@pytest.fixture(scope="module")
def smoke_checkpoint(tmp_path_factory, ray_session):
    from nshot.train import Scaling, fit

    cfg = get("keystone").config("smoke", train_sft=True)
    storage, local = str(tmp_path_factory.mktemp("ks")), Scaling(workers=0)
    # the loop's one step fails on a first attempt (fault injection); a resume does it
    with pytest.raises(Exception, match="injected fault at step 1"):  # noqa: PT011
        fit("keystone", cfg.replace(fail_at_step=1), scaling=local, storage=storage, name="smoke")
    res = fit("keystone", cfg, scaling=local, storage=storage, name="smoke", resume=True)
    return res.checkpoint


def test_train_loop_checkpoint_and_predictor(smoke_checkpoint) -> None:
    from nshot.train import load_checkpoint

    ckpt = load_checkpoint(smoke_checkpoint, method="keystone")
    ks = ckpt.extra["keystones"]
    assert ks and {"layer", "module", "index", "strength"} <= set(ks[0])
    weights = ckpt.weights()
    assert any(k.startswith("delta.") for k in weights)  # Δ rows, never the full model
    assert sum(v.numel() for v in weights.values()) < 100_000
    pred = get("keystone").predictor(ckpt)
    meta = pred.metadata()
    assert meta["n_keystones"] == len(ks) and meta["model"] == "keystone_sft"
    out = pred(KeystoneRequest(prompt="3 + 4 =", max_new_tokens=3))
    assert out.model == "keystone_sft" and out.neurons_affected == 0
    off = pred(
        KeystoneRequest(prompt="3 + 4 =", max_new_tokens=3, intervention={"mode": "zero_keystone"})
    )
    assert off.neurons_affected == len(ks)
    rnd = pred(
        KeystoneRequest(
            prompt="3 + 4 =", max_new_tokens=3, intervention={"mode": "zero_random", "seed": 1}
        )
    )
    assert rnd.neurons_affected == len(ks)
    with pytest.raises(ValueError, match="context"):
        pred(KeystoneRequest(prompt="1 " * 300, max_new_tokens=200))
    # the predictor's own example: answered, through JSON unchanged, the same batched
    example = pred.example_request()
    json.dumps(example)
    req = KeystoneRequest.model_validate(example)
    answer = pred(req)
    assert answer.neurons_affected == len(ks)  # the example zeroes the keystones
    assert KeystoneResponse.model_validate_json(answer.model_dump_json()) == answer
    assert pred.batch([req, req]) == [answer, answer]


def test_evaluate_smoke_checkpoint(smoke_checkpoint) -> None:
    from nshot.train import load_checkpoint

    method = get("keystone")
    cfg = method.config("smoke")
    out = method.evaluate(load_checkpoint(smoke_checkpoint, method="keystone"), cfg)
    for key in ("acc", "ppl", "acc_keystone_off", "acc_random_off", "collapse_ratio", "acc_target"):
        assert key in out and np.isfinite(out[key])


# --------------------------------------------------------------------------- claims

KEYSTONE_COMMITTED = {
    "keystone_off_beats_norm_off": True,  # paired over the 3 prompt groups: p 3e-5
    "keystone_set_sparse": True,
    "keystone_off_collapses": True,
    "random_off_harmless": True,
    "keystone_set_stable": True,
    "calibration_halved": True,
    "calibration_doubled": True,
    "sft_keystone_matches_full": False,  # gain 0.00 against 0.53 for full fine-tuning
    "sft_keystone_forgets_less": None,  # premise: keystone SFT matched full FT's gain; it did not
    "sft_keystone_beats_random_rows": False,  # 0.00 against 0.00
}


def test_claims_on_the_committed_small_results() -> None:
    """The committed SmolLM2 results re-evaluated without a rerun: the probe's claims hold,
    keystone-only SFT neither matches full fine-tuning nor beats random rows; the claims
    written into the committed file are the current ones."""
    import json
    from pathlib import Path

    from nshot.reproduce import with_claims

    path = Path(__file__).parents[1] / "methods" / "keystone" / "results" / "small.json"
    data = json.loads(path.read_text())
    claims = with_claims(data)["claims"]
    assert {c["id"]: c["holds"] for c in claims} == KEYSTONE_COMMITTED
    assert data["claims"] == claims
    smoke = with_claims({**data, "preset": "smoke"})["claims"]
    assert all(c["holds"] is None for c in smoke)  # stated for a real model only


def _fake_probe():
    from nshot.methods.keystone.probe import ProbeResult

    def m(acc: float, ppl: float = 10.0) -> dict[str, float]:
        caps = {f"acc_{c}": acc for c in ("facts", "math", "code", "multilingual")}
        return {**caps, "acc": acc, "ppl": ppl}

    res = ProbeResult(
        space={"per_layer": {"o": 500}, "layers": 2, "per_layer_total": 500, "total": 1000},
        keystones=[{"layer": 0, "module": "o", "index": i, "strength": 1.0} for i in range(4)],
        collapsed=True,
        base=m(1.0),
        curve=[{"n": 4, "acc": 0.1, "ppl": 100.0}],
        pool_size=10,
    )
    res.rows = {
        "full": [m(1.0)],
        "keystone_off": [m(0.1, 100.0)],
        "random_module_off": [m(0.97), m(0.99)],
        "random_off": [m(0.98), m(1.0)],
        "random_samelayer_off": [m(1.0), m(1.0)],
        "norm_off": [m(0.8)],
    }
    drops = {"0.5": (0.5, 0.2), "2": (1.0, 0.0)}  # r = 0.5: 0.5 < 3 x 0.2, the claim fails
    res.calibration = {
        r: {
            "acc_keystone": 1 - dk,
            "acc_random": 1 - dr,
            "ppl_keystone": 20.0,
            "ppl_random": 10.0,
            "calib_drop_keystone": dk,
            "calib_drop_random": dr,
        }
        for r, (dk, dr) in drops.items()
    }
    res.stability = {
        "groups": 2,
        "sizes": [4, 4],
        "iou": {"0-1": 0.6},
        "iou_mean": 0.6,
        "iou_chance": 0.004,
        "sets": [[0, 1, 2, 3], [0, 1, 2, 4]],
    }
    return res


def test_experiments_leave_pass_fail_to_the_claims(monkeypatch, tmp_path) -> None:
    """run_experiments builds rows, notes and extra without judging them (no extra['checks'],
    no check lines in the notes); the claims then judge them, can fail, and are null where a
    row was not run (no SFT here) or on a preset they do not speak of."""
    from types import SimpleNamespace

    from nshot.methods.keystone import experiments as X
    from nshot.reproduce import with_claims

    res = _fake_probe()
    space = SimpleNamespace(total=1000, gid=lambda layer, module, index: index)
    monkeypatch.setattr(X, "probe_model", lambda source, cfg: (None, None, space, None, res))
    saved = []
    monkeypatch.setattr(X, "_save_probe_checkpoint", lambda *a: saved.append(a))
    cfg = get("keystone").config("smoke", sft=False)
    table = X.run_experiments(cfg, tmp_path, method="keystone", version="1")
    assert saved and (tmp_path / "probe.png").is_file()
    assert "checks" not in table.extra and "markdown" in table.extra
    assert not [n for n in table.notes if n.startswith("check")]
    assert table.rows["keystone_off"]["collapse_ratio"] == pytest.approx(0.1)
    assert table.rows["random_module_off"]["acc"] == pytest.approx(0.98)
    data = table.to_json()
    assert all(c["holds"] is None for c in with_claims(data)["claims"])  # smoke
    holds = {c["id"]: c["holds"] for c in with_claims({**data, "preset": "small"})["claims"]}
    assert holds == {
        "keystone_off_beats_norm_off": None,  # one prompt group: no paired test
        "keystone_set_sparse": True,  # 4 <= 0.5 % of 1000
        "keystone_off_collapses": True,
        "random_off_harmless": True,  # 2 % relative
        "keystone_set_stable": True,
        "calibration_halved": False,
        "calibration_doubled": True,
        "sft_keystone_matches_full": None,  # SFT not run
        "sft_keystone_forgets_less": None,
        "sft_keystone_beats_random_rows": None,
    }


def test_the_headline_pairs_prompt_groups(monkeypatch, tmp_path) -> None:
    """With one K* per prompt group, keystone_off and norm_off are means over the groups (±
    std over groups) and their per-group accuracies the headline's paired samples: it holds
    when every group's K* costs more than as many largest-norm neurons, and fails when the
    norm set costs as much."""
    from types import SimpleNamespace

    from nshot.methods.keystone import experiments as X
    from nshot.reproduce import with_claims

    res = _fake_probe()
    caps = ("facts", "math", "code", "multilingual")

    def m(acc: float, n: int) -> dict[str, float]:
        return {**{f"acc_{c}": acc for c in caps}, "acc": acc, "ppl": 10.0, "n_neurons": n}

    res.rows["keystone_off"] = [m(0.1, 4), m(0.05, 6), m(0.15, 5)]
    res.rows["norm_off"] = [m(0.8, 4), m(0.7, 6), m(0.85, 5)]
    space = SimpleNamespace(total=1000, gid=lambda layer, module, index: index)
    monkeypatch.setattr(X, "probe_model", lambda source, cfg: (None, None, space, None, res))
    monkeypatch.setattr(X, "_save_probe_checkpoint", lambda *a: None)
    cfg = get("keystone").config("smoke", sft=False)
    table = X.run_experiments(cfg, tmp_path, method="keystone", version="1")
    assert table.rows["keystone_off"]["acc"] == pytest.approx(0.1)
    assert table.rows["keystone_off"]["n_neurons"] == pytest.approx(5.0)
    assert table.stds["norm_off"]["acc"] == pytest.approx(np.std([0.8, 0.7, 0.85], ddof=1))
    assert table.samples["keystone_off"]["acc"] == pytest.approx([0.1, 0.05, 0.15])
    assert table.samples["norm_off"]["acc"] == pytest.approx([0.8, 0.7, 0.85])
    assert "random_module_off" not in table.samples  # draws, not paired with the groups
    data = {**table.to_json(), "preset": "small"}
    head = {c["id"]: c for c in with_claims(data)["claims"]}["keystone_off_beats_norm_off"]
    assert head["holds"] is True and head["effect"]["n"] == 3 and head["p"] < 0.05
    data["samples"]["norm_off"]["acc"] = [0.1, 0.05, 0.15]
    data["rows"]["norm_off"]["acc"] = 0.1
    head = {c["id"]: c for c in with_claims(data)["claims"]}["keystone_off_beats_norm_off"]
    assert head["holds"] is False
