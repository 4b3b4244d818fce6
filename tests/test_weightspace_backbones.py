"""weightspace backbones: equivariance, canonicalisation (Thm. 6.3), OCE head, rendering."""

from __future__ import annotations

import pytest
import torch

from nshot.methods.weightspace.backbones import (
    GMN,
    NPNFN,
    OCEHead,
    copy_separation,
    count_params,
    oce_render,
    permute_hidden,
    random_hidden_perms,
    render,
)
from nshot.methods.weightspace.canon import (
    CanonMLP,
    canonicalise,
    in_general_position,
    quantise,
)

torch.set_num_threads(1)

WIDTHS = [2, 8, 8, 1]
K = 4


def random_inr(widths, batch=3, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [
        (
            torch.randn(batch, b, a, generator=g, dtype=dtype),
            torch.randn(batch, b, generator=g, dtype=dtype),
        )
        for a, b in zip(widths[:-1], widths[1:])
    ]


def max_diff(a, b) -> float:
    """Max abs difference between two layer lists (or two tensors)."""
    if isinstance(a, torch.Tensor):
        return float((a - b).detach().abs().max())
    return max(float((x - y).detach().abs().max()) for xa, xb in zip(a, b) for x, y in zip(xa, xb))


def equivariance_errors(backbone, head, layers, perms, x):
    """(features, deltas, f_OCE) errors between Phi(P v) and P Phi(v)."""
    feats = backbone(layers)
    edited, deltas = head(layers, feats)
    p_layers = permute_hidden(layers, perms)
    p_feats = backbone(p_layers)
    p_edited, p_deltas = head(p_layers, p_feats)
    err_f = max_diff(permute_hidden(feats, perms), p_feats)
    err_d = max(max_diff(permute_hidden(d, perms), pd) for d, pd in zip(deltas, p_deltas))
    err_r = max_diff(oce_render(edited, x), oce_render(p_edited, x))
    return err_f, err_d, err_r


def make_backbone(kind, **kw):
    torch.manual_seed(0)
    if kind == "np_nfn":
        return NPNFN(WIDTHS, channels=16, layers=3).double()
    return GMN(WIDTHS, channels=16, rounds=2, **kw).double()


# --------------------------------------------------- hidden-permutation equivariance


@pytest.mark.parametrize("kind", ["np_nfn", "gmn"])
@pytest.mark.parametrize("init_std", [1e-3, 0.3])
def test_check1_hidden_permutation_equivariance(kind, init_std):
    backbone = make_backbone(kind)
    head = OCEHead(len(WIDTHS) - 1, 16, K, init="random", init_std=init_std).double()
    layers = random_inr(WIDTHS, seed=1)
    x = torch.rand(50, 2, dtype=torch.float64) * 2 - 1
    g = torch.Generator().manual_seed(3)
    for perms in (
        random_hidden_perms(WIDTHS, generator=g),
        random_hidden_perms(WIDTHS, batch=3, generator=g),
    ):
        assert any((p != torch.arange(p.shape[-1])).any() for p in perms)
        err_f, err_d, err_r = equivariance_errors(backbone, head, layers, perms, x)
        print(f"{kind} std={init_std}: features {err_f:.1e} deltas {err_d:.1e} render {err_r:.1e}")
        assert err_f < 1e-5 and err_d < 1e-5 and err_r < 1e-5
    # the head actually edits: f_OCE differs from the input INR's function
    edited, _ = head(layers, backbone(layers))
    assert max_diff(oce_render(edited, x), render(layers, x)) > 1e-4 * init_std / 1e-3


def test_check1_negative_control_per_neuron_embedding_breaks_equivariance():
    backbone = make_backbone("gmn", shared_hidden_embedding=False)
    head = OCEHead(len(WIDTHS) - 1, 16, K, init="random", init_std=0.3).double()
    layers = random_inr(WIDTHS, seed=1)
    x = torch.rand(50, 2, dtype=torch.float64) * 2 - 1
    perms = random_hidden_perms(WIDTHS, generator=torch.Generator().manual_seed(3))
    err_f, err_d, err_r = equivariance_errors(backbone, head, layers, perms, x)
    print(f"negative control: features {err_f:.2e} deltas {err_d:.2e} render {err_r:.2e}")
    assert err_f > 1e-3 and err_d > 1e-3 and err_r > 1e-3


def test_siren_render_is_permutation_invariant():
    layers = random_inr([2, 8, 8, 1], seed=4)
    x = torch.rand(40, 2, dtype=torch.float64) * 2 - 1
    perms = random_hidden_perms([2, 8, 8, 1], batch=3, generator=torch.Generator().manual_seed(5))
    y = render(layers, x, act="sin")
    assert max_diff(y, render(permute_hidden(layers, perms), x, act="sin")) < 1e-9
    assert max_diff(y, render(layers, x)) > 1e-2  # "sin" is not silently ReLU


# --------------------------------------------------------------------------- render / permute


def test_render_matches_hand_computation_1_3_1():
    w1 = torch.tensor([[[1.0], [-2.0], [0.5]]])
    b1 = torch.tensor([[0.0, 1.0, -0.25]])
    w2 = torch.tensor([[[1.0, 3.0, -4.0]]])
    b2 = torch.tensor([[0.5]])
    x = torch.tensor([[-1.0], [0.0], [0.25], [1.0]])
    # h = relu([x, 1 - 2x, 0.5x - 0.25]); y = h1 + 3 h2 - 4 h3 + 0.5
    expected = torch.tensor(
        [0 + 9 - 0 + 0.5, 0 + 3 - 0 + 0.5, 0.25 + 1.5 - 0 + 0.5, 1 + 0 - 1 + 0.5]
    )
    y = render([(w1, b1), (w2, b2)], x)
    assert y.shape == (1, 4, 1)
    torch.testing.assert_close(y[0, :, 0], expected)
    perm = [torch.tensor([2, 0, 1])]
    p = permute_hidden([(w1, b1), (w2, b2)], perm)
    torch.testing.assert_close(p[0][1][0], b1[0, [2, 0, 1]])  # b <- P b
    torch.testing.assert_close(p[1][0][0, 0], w2[0, 0, [2, 0, 1]])  # columns follow
    assert max_diff(render(p, x), y) < 1e-6
    # batched points [B, P, d_0] give the same answer
    torch.testing.assert_close(render([(w1, b1), (w2, b2)], x[None]), y)


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-6), (torch.float32, 1e-5)])
def test_permute_hidden_leaves_render_unchanged(dtype, tol):
    layers = random_inr([1, 5, 4, 1], batch=6, seed=2, dtype=dtype)
    x = torch.linspace(-1, 1, 64, dtype=dtype)[:, None]
    perms = random_hidden_perms([1, 5, 4, 1], batch=6, generator=torch.Generator().manual_seed(0))
    moved = permute_hidden(layers, perms)
    assert max_diff(moved, layers) > 1e-2  # the weights really moved
    # float32: only the summation order changes (~1e-6 round-off)
    assert max_diff(render(moved, x), render(layers, x)) < tol


# ------------------------------------------------------------------ canonicalisation


def test_check6_canonicalisation_invariant_on_gp_and_jumps_at_tie():
    widths = [1, 4, 1]
    torch.manual_seed(0)
    mlp = CanonMLP(widths, hidden=64, depth=2).double()
    layers = random_inr(widths, batch=8, seed=7)
    assert bool(in_general_position(layers).all())
    y = mlp(layers)
    perms = random_hidden_perms(widths, batch=8, generator=torch.Generator().manual_seed(1))
    inv = max_diff(y, mlp(permute_hidden(layers, perms)))
    print(f"canonical invariance {inv:.1e}")
    assert inv < 1e-6
    # canonicalise sorts biases and keeps the function
    canon = canonicalise(layers)
    assert bool((canon[0][1].diff(dim=1) >= 0).all())
    x = torch.linspace(-1, 1, 33, dtype=torch.float64)[:, None]
    assert max_diff(render(canon, x), render(layers, x)) < 1e-12

    # a tie between neurons 0 and 1 with very different incoming/outgoing weights
    w1 = torch.tensor([[[3.0], [-3.0], [0.7], [1.2]]], dtype=torch.float64)
    b1 = torch.tensor([[0.2, 0.2, -0.5, 0.9]], dtype=torch.float64)
    w2 = torch.tensor([[[2.0, -2.0, 0.3, 0.1]]], dtype=torch.float64)
    b2 = torch.tensor([[0.0]], dtype=torch.float64)
    assert not bool(in_general_position([(w1, b1), (w2, b2)])[0])

    def out(delta: float, neuron: int = 0) -> float:
        b = b1.clone()
        b[0, neuron] += delta
        return float(mlp([(w1, b), (w2, b2)])[0, 0].detach())

    jump = abs(out(1e-6) - out(0.0))
    smooth = abs(out(1e-6, neuron=2) - out(0.0, neuron=2))  # away from the tie: continuous
    print(f"canonical jump at tie {jump:.3e}; step away from tie {smooth:.1e}")
    assert jump > 1e-3
    assert smooth < 1e-4


def test_in_general_position_and_quantisation():
    layers = random_inr([2, 16, 16, 1], batch=20, seed=9)
    assert bool(in_general_position(layers).all())
    w, b = layers[1]
    b = b.clone()
    b[5, 3] = b[5, 7]
    gp = in_general_position([layers[0], (w, b), layers[2]])
    assert not bool(gp[5]) and bool(gp[torch.arange(20) != 5].all())
    # the output layer is not a hidden layer: ties there are irrelevant
    out_tie = random_inr([2, 3, 2], seed=1)
    out_tie[1] = (out_tie[1][0], torch.zeros_like(out_tie[1][1]))
    assert bool(in_general_position(out_tie).all())
    # close but distinct biases collide under coarse quantisation, not under fine
    close = [
        (
            torch.randn(1, 3, 1, dtype=torch.float64),
            torch.tensor([[0.500, 0.501, -0.3]], dtype=torch.float64),
        ),
        (torch.randn(1, 1, 3, dtype=torch.float64), torch.zeros(1, 1, dtype=torch.float64)),
    ]
    assert bool(in_general_position(close)[0])
    assert bool(in_general_position(close, bits=16)[0])
    assert not bool(in_general_position(close, bits=6)[0])
    # coarser quantisation never adds GP inputs; at 4 bits most layers of 16 biases collide
    many = random_inr([2, 16, 16, 1], batch=200, seed=11)
    fracs = [float(in_general_position(many, bits=b).double().mean()) for b in (24, 12, 8, 4)]
    print(f"GP fraction at 24/12/8/4 bits: {fracs}")
    assert fracs[0] == 1.0 and fracs == sorted(fracs, reverse=True) and fracs[-1] < 0.5
    torch.testing.assert_close(
        quantise(torch.tensor([0.1], dtype=torch.float64), 11),
        torch.tensor([0.1], dtype=torch.float16).double(),
    )


# --------------------------------------------------------------------------- OCE head


def test_oce_head_init_and_copy_separation():
    torch.manual_seed(0)
    backbone = NPNFN(WIDTHS, channels=16, layers=2).double()
    layers = random_inr(WIDTHS, seed=1)
    feats = backbone(layers)
    x = torch.rand(30, 2, dtype=torch.float64)

    zero = OCEHead(len(WIDTHS) - 1, 16, K, init="zero").double()
    edited, deltas = zero(layers, feats)
    assert copy_separation(deltas) == 0.0
    assert max_diff(oce_render(edited, x), render(layers, x)) == 0.0
    assert zero.s.numel() == 1

    rand = OCEHead(len(WIDTHS) - 1, 16, K, init="random").double()
    edited, deltas = rand(layers, feats)
    sep = copy_separation(deltas)
    print(f"random-init copy_separation {sep:.3f}")
    assert sep > 1e-3
    assert len(edited) == K and all(len(v) == len(WIDTHS) - 1 for v in edited)
    assert edited[0][1][0].shape == layers[1][0].shape
    # v_hat_i = v + s_i * dv_i
    with torch.no_grad():
        rand.s.copy_(torch.tensor([0.0, 1.0, 2.0, 3.0]))
    edited, deltas = rand(layers, feats)
    torch.testing.assert_close(edited[0][0][0], layers[0][0])
    torch.testing.assert_close(edited[3][2][1], layers[2][1] + 3.0 * deltas[3][2][1])
    # identical copies: separation 0 even when the deltas are non-zero
    same = [deltas[1]] * K
    assert copy_separation(same) == 0.0 and copy_separation(deltas[:1]) == 0.0


def test_count_params_counts_heads_and_scales():
    c, k, n_layers = 16, K, len(WIDTHS) - 1
    per_head = c * k + k
    assert count_params(OCEHead(n_layers, c, k)) == 2 * n_layers * per_head + k
    assert count_params(OCEHead(n_layers, c, k, init="zero")) == 2 * n_layers * per_head + 1
    nfn = NPNFN(WIDTHS, channels=c, layers=2)
    gmn = GMN(WIDTHS, channels=c, rounds=2)
    total = sum(p.numel() for p in nfn.parameters())
    assert count_params(nfn) == total > 0
    # embeddings are counted: one per input neuron, per output neuron, per hidden LAYER
    emb = (WIDTHS[0] + WIDTHS[-1] + (len(WIDTHS) - 2) + n_layers) * c
    per_neuron = GMN(WIDTHS, channels=c, rounds=2, shared_hidden_embedding=False)
    assert count_params(per_neuron) - count_params(gmn) == (sum(WIDTHS[1:-1]) - 2) * c
    assert count_params(gmn) > emb
    nfn.blocks[0].in_emb.requires_grad_(False)
    assert count_params(nfn) == total - WIDTHS[0] * c
