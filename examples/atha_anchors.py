"""How distinct are ATHA's text anchors on a tiny CLIP? (the atha method's anchor diagnostic)

    python examples/atha_anchors.py                               # small's tiny CLIP (cached)
    python examples/atha_anchors.py --clip-preset small-cls       # recipe version 7
    python examples/atha_anchors.py --preset smoke --out a.json   # seconds (tests)

ATHA (paper §3) inverts the visual head to put each class prompt's text feature into the
image tower's residual stream: u = the minimum-norm solution of projᵀ u = t, then ln_post's
affine undone. If ``proj`` is ill-conditioned, the inverse amplifies every text feature into
the projection's weakest directions, and the anchors of different classes come out nearly
parallel: then the "best" and "worst" class of a token are nearly the same for every token, and
the head and tail pushes carry little class information. For episode 0 of each domain (the
reproduction's first 1-shot episode, class prompts as initialised) this prints and writes:

* ``proj_condition``: the ratio of the largest to the smallest singular value of ``proj``;
* ``weak3_share``: the mean share of ‖u‖² in the 3 weakest singular directions of ``proj``;
* ``anchor_cos_min`` / ``anchor_cos_max``: the pairwise cosines of the episode's anchors;
* ``text_cos_max``: the largest pairwise cosine of the text features the anchors invert;
* ``modal_best_class_share`` per block: among the patch tokens of the episode's support and
  query images at that block's input, the share whose most similar anchor is the most common
  one (1.0: every token picks the same class; 1/n_way would be an even spread);
* the push's size: ``text_feature_norm`` and ``image_feature_norm`` (the mean norms of the
  class prompts' and the episode images' features before CLIP normalises them),
  ``anchor_norm`` (mean), ``token_norm`` per block (the patch tokens' mean norm at the block's
  input) and ``push_to_token``: ρ⁺'s initial value times the anchors' mean norm over the
  tokens' mean norm at the pushed block, the relative size of the head push ATHA starts with.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from nshot.fileio import print_report
from nshot.method import get


def measure(preset: str, clip_preset: str | None, domains: list[str]) -> dict:
    from nshot.methods.atha.data import domain_pool, sample_episode
    from nshot.methods.atha.model import EpisodeModel, backbone_inverse
    from nshot.nn.backbone import load_backbone

    cfg = get("atha").config(preset)
    if clip_preset is not None:
        cfg = cfg.replace(clip_preset=clip_preset)
    # the reproduction's own tiny CLIP (cached by how it was trained: clip_workers)
    bb = load_backbone(cfg.backbone_spec())
    clip = bb.model
    proj = clip.visual_proj.detach().double()  # [W, E]
    u_basis, sing, _ = torch.linalg.svd(proj, full_matrices=False)  # u_basis [W, min(W, E)]
    weak = u_basis[:, sing.argsort()[:3]]
    out: dict = {
        "preset": preset,
        "clip_preset": cfg.clip_preset,
        "text": cfg.text,
        "pool": clip.cfg.pool,
        "visual_proj_shape": list(proj.shape),
        "proj_condition": float(sing.max() / sing.min()),
        "domains": {},
    }
    for domain in domains:
        pool = domain_pool(domain, cfg.pool_per_class, cfg.seed)
        ep = sample_episode(pool, seed=cfg.seed, episode=0, n_way=cfg.n_way, shots=1,
                            queries=cfg.queries)  # fmt: skip
        model = EpisodeModel(bb, ep.names, cfg, "atha", shots=1, seed=cfg.seed)
        with torch.no_grad():
            text, anchor_text = model.text_features()
            u = (anchor_text @ backbone_inverse(bb)).double()
            anchors = model.anchors(anchor_text)
            an = F.normalize(anchors, dim=-1)
            cos = an @ an.T
            off = cos[~torch.eye(len(an), dtype=torch.bool)]
            tn = F.normalize(text, dim=-1)
            tcos = (tn @ tn.T)[~torch.eye(len(tn), dtype=torch.bool)]
            images = torch.from_numpy(ep.support_x).float()
            images = torch.cat([images, torch.from_numpy(ep.query_x).float()])
            x = (images - clip.cfg.pixel_mean) / clip.cfg.pixel_std
            v = clip.visual
            t = v.patch_embed(x)
            t = torch.cat([v.cls_token.expand(t.shape[0], -1, -1), t], dim=1) + v.pos_embed
            modal, token_norm = [], []
            for blk in v.blocks:
                token_norm.append(float(t[:, 1:].norm(dim=-1).mean()))
                sim = torch.einsum("bld,cd->bcl", F.normalize(t[:, 1:], dim=-1), an)
                best = sim.argmax(dim=1).flatten()
                modal.append(float(torch.bincount(best, minlength=len(an)).max() / best.numel()))
                t = blk(t)
            image_norm = float(clip.encode_image(images).norm(dim=-1).mean())
        anchor_norm = float(anchors.norm(dim=-1).mean())
        out["domains"][domain] = {
            "names": ep.names,
            "weak3_share": float(((u @ weak) ** 2).sum(-1).div(u.pow(2).sum(-1)).mean()),
            "anchor_cos_min": float(off.min()),
            "anchor_cos_max": float(off.max()),
            "text_cos_max": float(tcos.max()),
            "modal_best_class_share": [round(m, 4) for m in modal],
            "text_feature_norm": float(text.norm(dim=-1).mean()),
            "image_feature_norm": image_norm,
            "anchor_norm": anchor_norm,
            "token_norm": [round(n, 4) for n in token_norm],
            "push_to_token": cfg.rho_plus_init * anchor_norm / token_norm[cfg.rho_block],
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="small", help="the atha preset (smoke, small)")
    ap.add_argument("--clip-preset", default=None, help="override the tiny CLIP preset")
    ap.add_argument("--domains", default="textured,sketch,digits")
    ap.add_argument("--out", default=None, help="write the report here (JSON)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    report = measure(args.preset, args.clip_preset, args.domains.split(","))
    print_report(report, args.out)


if __name__ == "__main__":
    main()
