"""Forget facts with ZeroUnlearn through the Python API, measure it, and generate from the edit.

    python examples/zerounlearn_api.py --preset smoke     # the tiny LM nshot trains (a minute)
    python examples/zerounlearn_api.py --preset small     # SmolLM2-135M-Instruct (needs the
                                                          # smollm2 extra; several minutes)

The same from the command line: `nshot train zerounlearn --preset small`, then
`nshot eval zerounlearn --checkpoint ~/.cache/nshot/runs/zerounlearn-small`, and
`nshot serve zerounlearn --checkpoint ...` for an HTTP endpoint.
"""

from __future__ import annotations

import argparse

from nshot.method import get
from nshot.train import Scaling, fit, load_checkpoint


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="smoke")
    ap.add_argument("--storage", "--output", help="where runs live (default: nshot's storage)")
    args = ap.parse_args()

    method = get("zerounlearn")
    cfg = method.config(args.preset)
    # the edit runs on one worker with full weights (Ray Train local mode here)
    result = fit(
        "zerounlearn",
        cfg,
        scaling=Scaling(workers=0),
        storage=args.storage,
        name=f"example-zerounlearn-{args.preset}",
        overwrite=True,
    )
    m = result.metrics
    print(f"forgotten facts answered (Eff): {m['eff_before']:.0f}% -> {m['eff']:.0f}%")
    print(f"retained facts answered (Spe):  {m['spe_before']:.0f}% -> {m['spe']:.0f}%")
    print(f"held-out perplexity:            {m['ppl_before']:.1f} -> {m['ppl']:.1f}")

    ckpt = load_checkpoint(result.checkpoint, method="zerounlearn")
    predictor = method.predictor(ckpt)
    forgotten = ckpt.extra["forget"][0]
    prompt = forgotten["template"].replace("{}", forgotten["subject"])
    answer = predictor(predictor.Request(prompt=prompt, max_new_tokens=4))
    print(
        f"{prompt!r} -> {answer.completion!r} (true answer {forgotten['answer']!r}; "
        f"neutral first token: {answer.neutral})"
    )
    print("top next tokens:", [(t.token, round(t.prob, 3)) for t in answer.next_token_top_k])


if __name__ == "__main__":
    main()
