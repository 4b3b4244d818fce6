"""Call a served TAIL model over HTTP.

nshot train tail --preset quickstart
nshot serve tail --checkpoint ~/.cache/nshot/runs/tail-quickstart --port 8000 &
python examples/serve_client.py --url http://127.0.0.1:8000/tail
"""

from __future__ import annotations

import argparse

from nshot.data import digits_table, episode_from_table
from nshot.serve import Client, ServeError


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8000/tail")
    ap.add_argument("--token", default=None, help="bearer token (default $NSHOT_SERVE_TOKEN)")
    args = ap.parse_args()
    client = Client(args.url, token=args.token)
    print("health:", client.healthz())
    print("model step:", client.metadata()["checkpoint"]["step"])

    episode = episode_from_table(digits_table(), (5, 6, 7, 8, 9), shots=5, queries=3, label=str)
    query_y = episode.pop("query_y")
    answer = client.predict({**episode, "n_draws": 4})
    print("true:     ", query_y)
    print("predicted:", answer["labels"])

    try:  # a malformed request: one support label missing
        client.predict({**episode, "support_y": episode["support_y"][:-1]})
    except ServeError as err:
        print("rejected:", err.status, err.detail)


if __name__ == "__main__":
    main()
