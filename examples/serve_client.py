"""Call a served TAIL model over HTTP.

nshot train tail --preset small
nshot serve tail --checkpoint ~/.cache/nshot/runs/tail-small --port 8000 &
python examples/serve_client.py --url http://127.0.0.1:8000/tail
"""

from __future__ import annotations

import argparse

import numpy as np

from nshot.data import digits_table, table_to_numpy
from nshot.serve import Client, ServeError


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8000/tail")
    ap.add_argument("--token", default=None, help="bearer token (default $NSHOT_SERVE_TOKEN)")
    args = ap.parse_args()
    client = Client(args.url, token=args.token)
    print("health:", client.healthz())
    print("model step:", client.metadata()["checkpoint"]["step"])

    x, y = table_to_numpy(digits_table())
    rng = np.random.default_rng(0)
    sx, sy, qx, qy = [], [], [], []
    for c in (5, 6, 7, 8, 9):
        rows = rng.choice(np.flatnonzero(y == c), 8, replace=False)
        sx += x[rows[:5]].tolist()
        sy += [str(c)] * 5
        qx += x[rows[5:]].tolist()
        qy += [str(c)] * 3
    answer = client.predict({"support_x": sx, "support_y": sy, "query_x": qx, "n_draws": 4})
    print("true:     ", qy)
    print("predicted:", answer["labels"])

    try:  # a malformed request: one support label missing
        client.predict({"support_x": sx, "support_y": sy[:-1], "query_x": qx})
    except ServeError as err:
        print("rejected:", err.status, err.detail)


if __name__ == "__main__":
    main()
