"""Load a real CLIP by path (no open_clip, no torchvision) and classify images zero-shot: the
backbone of the ``paper`` presets of atha (ViT-B/16) and dirclip (ViT-B/32).

    # a Hugging Face CLIP folder, fetched beforehand
    hf download openai/clip-vit-base-patch32 --local-dir ~/models/clip-b32
    python examples/clip_paper.py --clip-path ~/models/clip-b32 \\
        --images cat.jpg dog.jpg --classes cat dog "traffic light"

    # an OpenAI / open_clip state dict in safetensors, with the BPE files of any CLIP folder
    python examples/clip_paper.py --clip-path ~/models/open_clip_model.safetensors \\
        --clip-tokenizer ~/models/clip-b32 --images ~/data/val       # an ImageFolder: accuracy

    python examples/clip_paper.py --tiny      # a tiny random CLIP written to a temp folder

With ``--tiny`` (CPU, seconds; no download) it writes a random CLIP in the Hugging Face format
and a small image folder, also saves the same weights as an OpenAI-format file, loads both and
prints the largest difference of their logits (the mapping of ``nshot.nn.hfclip``), then runs
the zero-shot classification (at chance: the weights are random). The methods' paper runs
themselves are in their READMEs (``nshot reproduce atha --preset paper --set clip_path=...``).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch


def _tiny(root: Path) -> tuple[Path, Path, Path]:
    """A tiny random CLIP (HF folder + OpenAI-format file) and a two-class image folder."""
    from PIL import Image
    from safetensors.torch import save_file

    from nshot.nn.hfclip import hf_to_openai, load_pretrained_clip, write_tiny_clip

    folder = write_tiny_clip(root / "clip-hf", seed=0)
    single = root / "clip-openai" / "open_clip_model.safetensors"
    single.parent.mkdir()
    save_file(hf_to_openai(load_pretrained_clip(folder).model), str(single))
    rng = np.random.default_rng(0)
    for c, name in enumerate(("dark", "bright")):
        (root / "images" / name).mkdir(parents=True)
        for i in range(4):
            img = np.clip(60 + 120 * c + rng.normal(0, 25, (48, 64, 3)), 0, 255)
            Image.fromarray(img.astype(np.uint8)).save(root / "images" / name / f"{i}.png")
    return folder, single, root / "images"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clip-path", help="a Hugging Face CLIP folder or OpenAI-format .safetensors")
    ap.add_argument("--clip-tokenizer", help="BPE files for an OpenAI-format file (a folder or "
                    "bpe_simple_vocab_16e6.txt.gz)")  # fmt: skip
    ap.add_argument("--images", nargs="*", default=[], help="image files, or one ImageFolder root")
    ap.add_argument("--classes", nargs="*", default=[], help="class names (ImageFolder: its own)")
    ap.add_argument("--template", default="a photo of a {}.")
    ap.add_argument("--tiny", action="store_true", help="a tiny random CLIP (no download)")
    args = ap.parse_args()

    from nshot.nn.hfclip import image_folder, load_image, load_pretrained_clip

    with tempfile.TemporaryDirectory() as tmp:
        if args.tiny:
            folder, single, images = _tiny(Path(tmp))
            a = load_pretrained_clip(folder)
            b = load_pretrained_clip(single, tokenizer=folder)
            x = torch.rand(2, 3, a.image_size, a.image_size)
            with torch.no_grad():
                diff = float((a.logits(x, ["a photo", "of a"]) - b.logits(x, ["a photo", "of a"]))
                             .abs().max())  # fmt: skip
            print(f"HF folder vs OpenAI-format file: max |Δ logit| = {diff:.2e}")
            clip, paths = a, [str(images)]
        else:
            if not args.clip_path:
                ap.error("--clip-path is required (or --tiny)")
            clip, paths = load_pretrained_clip(args.clip_path, args.clip_tokenizer), args.images
        v = clip.model.config.vision_config
        print(f"CLIP ({clip.fmt}): patch {v.patch_size}, width {v.hidden_size}, "
              f"{v.num_hidden_layers} blocks, {clip.image_size} px")  # fmt: skip
        labels = None
        if len(paths) == 1 and Path(paths[0]).is_dir():
            f = image_folder(paths[0])
            files, labels, names = list(f.paths), f.labels, f.class_names()
        else:
            files, names = [Path(p) for p in paths], list(args.classes)
        if not files:
            return
        if len(names) < 2:
            ap.error("--classes needs at least two names")
        with torch.no_grad():
            text = clip.encode_text([args.template.format(n) for n in names], normalize=True)
            correct = 0
            for i, path in enumerate(files):
                img = torch.from_numpy(load_image(path, clip.image_size))[None]
                feat = clip.encode_image(img, normalize=True)
                probs = (clip.model.logit_scale.exp() * feat @ text.T).softmax(-1)[0]
                k = int(probs.argmax())
                if labels is not None:
                    correct += int(k == labels[i])
                print(f"{path.name}: {names[k]} ({float(probs[k]):.2f})")
        if labels is not None:
            print(f"zero-shot accuracy: {correct / len(files):.3f} on {len(files)} images")


if __name__ == "__main__":
    main()
