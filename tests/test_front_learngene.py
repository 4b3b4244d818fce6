"""front: the unnormalised DCT, the learngene (extraction, depth transfer, reconstruction,
save/load), the copy baselines and the spectral regulariser (the DCT, the learngene transfer, the round-trip and amplitude claims)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.fft
import torch
from torch import nn

from nshot.methods.front.dct import dct, dct2, idct, idct2
from nshot.methods.front.learngene import (
    Learngene,
    TransferError,
    block_key,
    depth_transfer,
    extract,
    front_init,
    high_freq_energy,
    high_freq_fraction,
    matrix_shape,
    truncation_init,
    uniform_init,
    weight_selection_init,
)
from nshot.nn.vit import ViT


def vit(width: int = 32, depth: int = 4, *, img_size: int = 8, classes: int = 10, seed: int = 0):
    torch.manual_seed(seed)
    return ViT(
        img_size=img_size, patch=2, num_classes=classes, width=width, depth=depth,
        heads=2 if width <= 32 else 4,
    )  # fmt: skip


def randomise(model: nn.Module, seed: int = 1) -> nn.Module:
    """Every parameter non-trivial (LayerNorm weights and biases too), like a trained model."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return model


def smooth_vit(depth: int = 12, width: int = 32, seed: int = 2) -> ViT:
    """Per-block weights vary smoothly with depth: layer l = base + l/depth · delta."""
    m = vit(width, depth, seed=seed)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in m.blocks[0].named_parameters():
            base = 0.02 * torch.randn(p.shape, generator=g)
            delta = 0.02 * torch.randn(p.shape, generator=g)
            for i, blk in enumerate(m.blocks):
                blk.get_parameter(name).copy_(base + i / depth * delta)
    return m


def rms(t: torch.Tensor) -> float:
    return float(t.double().square().mean().sqrt())


def images(img_size: int = 8, n: int = 3) -> torch.Tensor:
    return torch.rand(n, 1, img_size, img_size, generator=torch.Generator().manual_seed(5))


# --------------------------------------------------------------------------------------- DCT


@pytest.mark.parametrize("n", [1, 2, 7, 16])
def test_dct_matches_scipy_and_inverts(n: int) -> None:
    x = np.random.default_rng(n).normal(size=(3, n))
    X = dct(torch.from_numpy(x))
    assert X.dtype == torch.float64
    np.testing.assert_allclose(X.numpy(), scipy.fft.dct(x, type=2, axis=-1) / 2, atol=1e-10)
    np.testing.assert_allclose(idct(X).numpy(), x, atol=1e-10)
    # along another dim, and the float32 round trip keeps the dtype
    Xd = dct(torch.from_numpy(x.T.copy()), dim=0)
    np.testing.assert_allclose(Xd.numpy(), X.numpy().T, atol=1e-10)
    x32 = torch.from_numpy(x).float()
    assert dct(x32).dtype == torch.float32
    assert torch.allclose(idct(dct(x32)), x32, atol=1e-5)


def test_dct2_matches_scipy_and_inverts() -> None:
    x = np.random.default_rng(0).normal(size=(2, 5, 9))
    ref = scipy.fft.dct(scipy.fft.dct(x, type=2, axis=-1), type=2, axis=-2) / 4
    X = dct2(torch.from_numpy(x))
    np.testing.assert_allclose(X.numpy(), ref, atol=1e-10)
    np.testing.assert_allclose(idct2(X).numpy(), x, atol=1e-10)
    # idct is the inverse of the formula x_n = X_0/N + (2/N) Σ_{k≥1} X_k cos(πk(2n+1)/(2N))
    N = 6
    Xv = torch.from_numpy(np.random.default_rng(1).normal(size=N))
    k = torch.arange(1, N, dtype=torch.float64)
    manual = torch.stack(
        [Xv[0] / N + 2 / N * (Xv[1:] * torch.cos(torch.pi * k * (2 * i + 1) / (2 * N))).sum()
         for i in range(N)]
    )  # fmt: skip
    assert torch.allclose(idct(Xv), manual, atol=1e-12)


def test_matrix_shape_rules() -> None:
    assert matrix_shape((64, 1, 2, 2)) == (64, 4)  # conv: (OC·IC, kH·kW)
    assert matrix_shape((1, 17, 64)) == (17, 64)  # pos_embed
    assert matrix_shape((1, 1, 64)) == (64,)  # cls_token
    assert matrix_shape((64,)) == (64,)
    assert matrix_shape((96, 32)) == (96, 32)
    assert matrix_shape(()) == (1,)
    assert block_key("blocks.11.attn.qkv.weight") == ("attn.qkv.weight", 11)
    assert block_key("patch_embed.proj.weight") is None
    assert block_key("model.layers.3.mlp.up.weight", "model.layers") == ("mlp.up.weight", 3)


# ----------------------------------------------------------------------- extraction / round trip


def test_round_trip_exact_check4() -> None:
    """Round trip: r = 1, L_t = L_s, same width → the source weights (float32, < 1e-5)."""
    src = randomise(vit())
    tgt = vit(seed=9)
    gene = extract(src, keep_ratio=1.0, source=src.shape())
    assert gene.depth == 4 and gene.source["width"] == 32
    report = front_init(tgt, gene)
    assert report["skipped"] == [] and report["depth"] == {"source": 4, "target": 4}
    sp = dict(src.named_parameters())
    assert set(report["transferred"]) == set(sp)
    for n, p in tgt.named_parameters():
        err = float((p - sp[n]).detach().abs().max())
        assert err < 1e-5, (n, err)


def test_extract_truncation_and_lowpass() -> None:
    src = randomise(vit())
    gene = extract(src, keep_ratio=0.5)
    g = gene.genes
    assert g["blocks.0.attn.qkv.weight"].coef.shape == (48, 16)
    assert g["pos_embed"].coef.shape == (8, 16)  # (17, 32) → (⌊8.5⌋, 16)
    assert g["cls_token"].coef.shape == (16,) and g["cls_token"].mode == "1d"
    assert g["patch_embed.proj.weight"].coef.shape == (16, 2)  # (32·1, 2·2)
    p = src.blocks[1].attn.qkv.weight.detach().double()
    assert g["blocks.1.attn.qkv.weight"].mu == pytest.approx(float(p.mean()))
    assert g["blocks.1.attn.qkv.weight"].sigma == pytest.approx(float(p.std()))
    # the reconstruction is the low-pass projection: no energy outside the kept block
    tgt = vit(seed=3)
    front_init(tgt, gene)
    w = tgt.blocks[1].attn.qkv.weight.detach().double()
    st = g["blocks.1.attn.qkv.weight"]
    spec = dct2((w - st.mu) / st.sigma)
    assert float(spec[48:].abs().max()) < 1e-4 and float(spec[:, 16:].abs().max()) < 1e-4
    assert float(spec[:48, :16].abs().max()) > 1.0
    # mlp 1d mode: fc1 transformed along dim 0 only, fc2 along dim 1 only
    g1 = extract(src, keep_ratio=0.5, mlp_dct_dim="1d").genes
    assert g1["blocks.0.mlp.fc1.weight"].mode == "mlp1d-rows"
    assert g1["blocks.0.mlp.fc1.weight"].coef.shape == (64, 32)
    assert g1["blocks.0.mlp.fc2.weight"].coef.shape == (32, 64)
    assert g1["blocks.0.attn.qkv.weight"].coef.shape == (48, 16)


def test_one_element_parameter_and_layernorm() -> None:
    class Tiny(nn.Module):
        def __init__(self, v: float) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.tensor([v]))
            self.norm = nn.LayerNorm(4)  # weight: ones, σ = 0

    gene = extract(Tiny(3.0))
    assert gene.genes["scale"].sigma == 0.0 and gene.depth == 0
    tgt = Tiny(0.0)
    with torch.no_grad():
        tgt.norm.weight.zero_()
    front_init(tgt, gene)
    assert float(tgt.scale.detach()) == pytest.approx(3.0)
    assert torch.allclose(tgt.norm.weight, torch.ones(4))


# ---------------------------------------------------------------------------------- depth transfer


def _amplitudes(stack_z: torch.Tensor, lt: int, depth_fix: bool) -> list[float]:
    """Per target layer: RMS of the reconstructed standardised tensor / the source's mean RMS."""
    out = depth_transfer(torch.stack([dct2(z) for z in stack_z]), lt, depth_fix=depth_fix)
    src = np.mean([rms(z) for z in stack_z])
    return [rms(idct2(o)) / src for o in out]


def test_depth_amplitude_check5() -> None:
    """Depth amplitude on a smooth 12-layer stack: faithful 12→4 ≈ 3×, 12→24 ≈ 0.5×; fix → ≈ 1×."""
    g = torch.Generator().manual_seed(0)
    base = torch.randn(48, 16, generator=g, dtype=torch.float64)
    delta = torch.randn(48, 16, generator=g, dtype=torch.float64)
    layers = [base + ell / 12 * delta for ell in range(12)]
    z = torch.stack([(x - x.mean()) / x.std() for x in layers])
    for lt, lo, hi in [(4, 2.5, 3.5), (24, 0.4, 0.6)]:
        amp = _amplitudes(z, lt, depth_fix=False)
        assert len(amp) == lt and all(lo <= a <= hi for a in amp), (lt, amp)
        fixed = _amplitudes(z, lt, depth_fix=True)
        assert all(0.8 <= a <= 1.25 for a in fixed), (lt, fixed)


@pytest.mark.parametrize("lt,lo,hi,fix", [(4, 2.5, 3.5, False), (4, 0.8, 1.25, True)])
def test_depth_amplitude_through_front_init(lt: int, lo: float, hi: float, fix: bool) -> None:
    """The same amplitude on a smooth depth-12 ViT through extract + front_init."""
    src = smooth_vit(12)
    gene = extract(src)
    tgt = vit(32, lt, seed=4)
    front_init(tgt, gene, depth_fix=fix)
    for name in ("attn.qkv.weight", "mlp.fc1.weight", "attn.proj.bias"):
        for i in range(lt):
            st = gene.genes[f"blocks.{i}.{name}"]
            x = (tgt.get_parameter(f"blocks.{i}.{name}").detach().double() - st.mu) / st.sigma
            src_z = (src.get_parameter(f"blocks.{i}.{name}").detach().double() - st.mu) / st.sigma
            assert lo <= rms(x) / rms(src_z) <= hi, (name, i, rms(x) / rms(src_z))
    assert torch.isfinite(tgt(images())).all()


def test_depth_fill_modes() -> None:
    g = torch.Generator().manual_seed(1)
    s = torch.randn(4, 3, 5, generator=g, dtype=torch.float64)
    # L_t = L_s: every mode is the identity
    for fill in ("zero", "random", "consistence", "repeat"):
        assert torch.allclose(depth_transfer(s, 4, fill=fill), s, atol=1e-12)
    # deeper target (4 → 8)
    zero = depth_transfer(s, 8, fill="zero")
    spec = dct(zero, dim=0)
    assert torch.allclose(spec[:4], dct(s, dim=0), atol=1e-10) and spec[4:].abs().max() < 1e-10
    cons = dct(depth_transfer(s, 8, fill="consistence"), dim=0)
    assert torch.allclose(cons[0], cons[1]) and torch.allclose(cons[6], cons[7])
    assert torch.allclose(cons[::2], dct(s, dim=0), atol=1e-10)
    r1 = depth_transfer(s, 8, fill="random", generator=torch.Generator().manual_seed(0))
    r2 = depth_transfer(s, 8, fill="random", generator=torch.Generator().manual_seed(0))
    r3 = depth_transfer(s, 8, fill="random", generator=torch.Generator().manual_seed(1))
    assert torch.equal(r1, r2) and not torch.equal(r1, r3)
    assert torch.allclose(dct(r1, dim=0)[:4], dct(s, dim=0), atol=1e-10)
    rep = depth_transfer(s, 6, fill="repeat")  # all L_s frequencies → the source, last reused
    assert torch.allclose(rep[:4], s, atol=1e-12) and torch.allclose(rep[5], s[3], atol=1e-12)
    assert torch.allclose(depth_transfer(s, 6, fill="repeat", depth_fix=True), rep)
    # shallower target with repeat: low-passed source layers at the source's amplitude
    rep2 = depth_transfer(s, 2, fill="repeat")
    lp = dct(s, dim=0)
    lp[2:] = 0
    assert torch.allclose(rep2, idct(lp, dim=0)[:2], atol=1e-12)
    with pytest.raises(ValueError):
        depth_transfer(s, 2, fill="mirror")


def test_n_per_group() -> None:
    """Groups of different depths: n = min(L_t, L_s) per group (the reference reuses the first
    group's n for later ones), so with L_t = L_s every group is reconstructed exactly."""

    class Two(nn.Module):
        def __init__(self, a: int, b: int) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(nn.Linear(3, 3) for _ in range(a))
            for i in range(b):  # a group ("aaa", sorted first) on the first b blocks only
                self.blocks[i].register_parameter("aaa", nn.Parameter(torch.randn(4)))

    torch.manual_seed(0)
    src, tgt = Two(3, 1), Two(3, 1)
    report = front_init(tgt, extract(src))
    assert report["depth"] == {"source": 3, "target": 3}
    for (n, p), (_, q) in zip(tgt.named_parameters(), src.named_parameters()):
        assert torch.allclose(p, q, atol=1e-5), n


# ------------------------------------------------------------------------------- width changes


@pytest.mark.parametrize("src_w,tgt_w,tgt_img", [(32, 16, 8), (64, 32, 16)])
def test_width_and_token_change(src_w: int, tgt_w: int, tgt_img: int) -> None:
    src = randomise(vit(src_w, 4))
    gene = extract(src)
    tgt = vit(tgt_w, 2, img_size=tgt_img, seed=1)
    report = front_init(tgt, gene)
    assert report["skipped"] == [] and report["depth"] == {"source": 4, "target": 2}
    for n, p in tgt.named_parameters():
        assert torch.isfinite(p).all(), n
    out = tgt(images(tgt_img))
    assert out.shape == (3, 10) and torch.isfinite(out).all()
    # use_ratio scales the standardised reconstruction by (h_t/h_c)(w_t/w_c) (1-D: n_t/n_c)
    tgt2 = vit(tgt_w, 2, img_size=tgt_img, seed=1)
    front_init(tgt2, gene, use_ratio=True)
    f = tgt_w / src_w
    tokens = (tgt_img // 2) ** 2 + 1  # pos_embed rows 17 → 17 or 65
    for name, ratio in [
        ("blocks.0.attn.proj.weight", f * f),
        ("blocks.1.mlp.fc1.weight", f * f),
        ("blocks.0.attn.qkv.bias", f),
        ("pos_embed", tokens / 17 * f),
    ]:
        mu = gene.genes[name].mu
        a = tgt.get_parameter(name).detach().double() - mu
        b = tgt2.get_parameter(name).detach().double() - mu
        assert torch.allclose(b, a * ratio, atol=1e-6), name


def test_mlp_1d_mode_rejects_width_change() -> None:
    src = randomise(vit(32, 2))
    gene = extract(src, mlp_dct_dim="1d")
    same = vit(32, 2, seed=3)
    front_init(same, gene)
    assert torch.allclose(same.blocks[1].mlp.fc2.weight, src.blocks[1].mlp.fc2.weight, atol=1e-5)
    with pytest.raises(TransferError, match=r"blocks\.0\.mlp\.fc1\.weight"):
        front_init(vit(16, 2), gene)


# ------------------------------------------------------------------- errors, head and skip list


def test_transfer_error_names_the_parameter() -> None:
    gene = extract(randomise(vit(32, 2)))
    extra = vit(32, 2, seed=1)
    extra.register_parameter("dist_token", nn.Parameter(torch.zeros(1, 1, 32)))
    before = extra.blocks[0].attn.qkv.weight.detach().clone()
    with pytest.raises(TransferError, match="dist_token") as exc:
        front_init(extra, gene)
    assert exc.value.name == "dist_token"
    assert torch.equal(extra.blocks[0].attn.qkv.weight, before)  # nothing copied on failure
    rank = vit(32, 2, seed=1)
    rank.cls_token = nn.Parameter(torch.zeros(1, 32))
    with pytest.raises(TransferError, match="cls_token.*rank"):
        front_init(rank, gene)
    group = vit(32, 2, seed=1)
    group.blocks[0].register_parameter("gamma", nn.Parameter(torch.ones(32)))
    with pytest.raises(TransferError, match=r"blocks\.0\.gamma"):
        front_init(group, gene)
    with pytest.raises(TransferError, match="dist_token"):
        truncation_init(extra, randomise(vit(32, 2)))


def test_head_skipped_when_classes_differ() -> None:
    src = randomise(vit(32, 2))
    gene = extract(src)
    other = vit(32, 2, classes=2, seed=1)
    with torch.no_grad():
        other.head.weight.normal_()
    w0 = other.head.weight.detach().clone()
    report = front_init(other, gene)
    assert torch.equal(other.head.weight, w0) and torch.equal(other.head.bias, torch.zeros(2))
    assert sorted(s.split()[0] for s in report["skipped"]) == ["head.bias", "head.weight"]
    same = vit(32, 2, seed=1)
    front_init(same, gene)
    assert torch.allclose(same.head.weight, src.head.weight, atol=1e-5)
    # baselines skip it too
    other2 = vit(32, 2, classes=2, seed=1)
    h0 = other2.head.weight.detach().clone()
    truncation_init(other2, src)
    assert torch.equal(other2.head.weight, h0)


def test_skip_list() -> None:
    src = randomise(vit(32, 2))
    tgt = vit(32, 2, seed=1)
    init = {n: p.detach().clone() for n, p in tgt.named_parameters()}
    report = front_init(tgt, extract(src), skip=("qkv", "norm"))
    for n, p in tgt.named_parameters():
        kept = "attn.qkv." in n or any(q.startswith("norm") for q in n.split(".")[:-1])
        assert torch.equal(p, init[n]) == kept, n
    assert len(report["skipped"]) == 2 * 2 + 2 * 2 * 2 + 2  # qkv w/b, norm1/2 w/b, final norm
    with pytest.raises(ValueError):
        front_init(tgt, extract(src), skip=("ffn",))


# -------------------------------------------------------------------------------- baselines


def test_truncation_and_uniform_select_layers() -> None:
    src = randomise(vit(32, 12))
    for fn, idx in [(truncation_init, [0, 1, 2, 3]), (uniform_init, [0, 3, 6, 9])]:
        tgt = vit(32, 4, seed=1)
        report = fn(tgt, src)
        assert report["layers"] == dict(enumerate(idx))
        for i, j in enumerate(idx):
            for (n, p), (_, q) in zip(
                tgt.blocks[i].named_parameters(), src.blocks[j].named_parameters()
            ):
                assert torch.equal(p, q), (fn.__name__, i, n)
        assert torch.equal(tgt.pos_embed, src.pos_embed)


def test_width_copy_and_weight_selection() -> None:
    src = randomise(vit(32, 12))
    # smaller target: top-left slice (truncation) vs evenly spaced elements (weight selection)
    trunc = vit(16, 4, seed=1)
    truncation_init(trunc, src)
    assert torch.equal(trunc.blocks[2].mlp.fc1.weight, src.blocks[2].mlp.fc1.weight[:64, :16])
    ws = vit(16, 4, seed=1)
    report = weight_selection_init(ws, src)
    assert report["layers"] == {0: 0, 1: 3, 2: 6, 3: 9}
    r32, r128 = torch.linspace(0, 31, 16).round().long(), torch.linspace(0, 127, 64).round().long()
    assert r32.tolist()[:4] == [0, 2, 4, 6] and r32[-1] == 31
    w = src.blocks[3].attn.proj.weight
    assert torch.equal(ws.blocks[1].attn.proj.weight, w[r32][:, r32])
    assert torch.equal(ws.blocks[1].mlp.fc1.weight, src.blocks[3].mlp.fc1.weight[r128][:, r32])
    assert torch.equal(ws.cls_token, src.cls_token[..., r32])
    assert torch.equal(ws.pos_embed, src.pos_embed[..., r32])  # 17 tokens kept
    assert torch.isfinite(ws(images())).all()
    # larger target: the overlap is copied, the rest keeps its init
    big = vit(64, 2, img_size=16, seed=1)
    pe0 = big.pos_embed.detach().clone()
    weight_selection_init(big, src)
    assert torch.equal(big.pos_embed[:, :17, :32], src.pos_embed)
    assert torch.equal(big.pos_embed[:, 17:], pe0[:, 17:])


# ----------------------------------------------------------------------------- save / load


def test_save_load_round_trip(tmp_path) -> None:
    src = randomise(vit(32, 4))
    gene = extract(src, keep_ratio=0.5, mlp_dct_dim="1d", source=src.shape())
    folder = gene.save(tmp_path / "lg")
    assert sorted(p.name for p in folder.iterdir()) == ["learngene.json", "learngene.safetensors"]
    back = Learngene.load(folder)
    assert (back.keep_ratio, back.mlp_dct_dim, back.source, back.depth) == (
        0.5, "1d", src.shape(), 4,
    )  # fmt: skip
    assert back.genes.keys() == gene.genes.keys()
    for n, g in gene.genes.items():
        b = back.genes[n]
        assert torch.equal(b.coef, g.coef), n
        assert (b.mu, b.sigma, b.shape, b.mode) == (g.mu, g.sigma, g.shape, g.mode), n
    t1, t2 = vit(32, 2, seed=1), vit(32, 2, seed=1)
    front_init(t1, gene)
    front_init(t2, back)
    for (n, p), (_, q) in zip(t1.named_parameters(), t2.named_parameters()):
        assert torch.equal(p, q), n


# ----------------------------------------------------------------------------- regulariser


def test_high_freq_energy_and_fraction() -> None:
    m = randomise(vit(32, 2))
    e = high_freq_energy(m, 0.5)
    assert e.requires_grad and e.dim() == 0 and e.dtype == torch.float32
    e0 = float(e.detach())
    assert e0 > 0
    e.backward()
    grads = [p.grad for p in m.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(float(g.abs().max()) > 0 for g in grads)
    assert float(high_freq_energy(m, 1.0).detach()) == 0.0
    frac = high_freq_fraction(m, 0.5)
    assert 0.0 < frac < 1.0
    assert high_freq_fraction(m, 1.0) == 0.0
    # a low-pass model (FRONT reconstruction at r = 0.5) has no energy outside the block
    lp = vit(32, 2, seed=3)
    front_init(lp, extract(m, keep_ratio=0.5))
    assert high_freq_fraction(lp, 0.5) < 1e-9
    # a gradient step on the energy lowers it
    m.zero_grad()
    opt = torch.optim.SGD(m.parameters(), lr=1e-6)
    high_freq_energy(m, 0.5).backward()
    opt.step()
    assert float(high_freq_energy(m, 0.5).detach()) < e0
