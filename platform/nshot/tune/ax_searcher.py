"""``--search ax``: Ax (BoTorch GP + acquisition, Sobol initialisation) through Ax 1.x's
``ax.api.Client``.

Ray 2.60's own ``AxSearch`` reads ``objective.metric`` from the Ax experiment, which Ax 1.x no
longer has, so nshot drives the current Ax API itself. State is saved with Ax's own JSON
(``Client.save_to_json_file``): nothing is pickled.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ray.tune.search import Searcher

from nshot.errors import NshotError
from nshot.fileio import atomic_write
from nshot.tune.space import Choice, Float, SearchSpace


def _ax_parameters(space: SearchSpace) -> list[Any]:
    from ax.api.configs import ChoiceParameterConfig, RangeParameterConfig

    out = []
    for name, p in space.params.items():
        if isinstance(p, Choice):
            kinds = {type(v) for v in p.values}
            if len(kinds) != 1 or kinds.pop() not in (str, int, float, bool):
                raise NshotError(
                    f"--search ax: parameter '{name}': Ax choices must all be str, int, float "
                    "or bool of one type"
                )
            typ = {str: "str", int: "int", float: "float", bool: "bool"}[type(p.values[0])]
            out.append(
                ChoiceParameterConfig(
                    name=name, parameter_type=typ, values=list(p.values), is_ordered=False
                )
            )
        else:
            typ = "float" if isinstance(p, Float) else "int"
            cast = float if typ == "float" else int
            out.append(
                RangeParameterConfig(
                    name=name,
                    parameter_type=typ,
                    bounds=(cast(p.low), cast(p.high)),
                    scaling="log" if p.log else "linear",
                )
            )
    return out


class AxClientSearcher(Searcher):
    """Ray Tune searcher over an ``ax.api.Client`` experiment."""

    def __init__(self, space: SearchSpace, metric: str = "f", mode: str = "max", seed: int = 0):
        super().__init__(metric=metric, mode=mode)
        from ax.api.client import Client

        self._space = space
        self._client = Client(random_seed=seed)
        self._client.configure_experiment(parameters=_ax_parameters(space), name="nshot")
        self._client.configure_optimization(objective=metric if mode == "max" else f"-{metric}")
        self._trials: dict[str, int] = {}

    def set_search_properties(self, metric, mode, config, **spec) -> bool:  # noqa: ANN001
        if config and SearchSpace.from_tune(config) != self._space:
            return False
        return True

    def suggest(self, trial_id: str) -> dict[str, Any] | None:
        [(index, params)] = self._client.get_next_trials(max_trials=1).items()
        self._trials[trial_id] = int(index)
        return {**self._space.fixed, **dict(params)}

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False):
        index = self._trials.pop(trial_id, None)
        if index is None:
            return
        if error or not result or result.get(self.metric) is None:
            self._client.mark_trial_failed(trial_index=index)
            return
        self._client.complete_trial(
            trial_index=index, raw_data={self.metric: float(result[self.metric])}
        )

    def save(self, checkpoint_path: str) -> None:
        tmp = f"{checkpoint_path}.ax.json"
        self._client.save_to_json_file(tmp)
        state = {"ax": json.loads(open(tmp).read()), "trials": self._trials}
        os.remove(tmp)
        atomic_write(checkpoint_path, json.dumps(state))

    def restore(self, checkpoint_path: str) -> None:
        from ax.api.client import Client

        with open(checkpoint_path) as fh:
            state = json.load(fh)
        tmp = f"{checkpoint_path}.ax.json"
        with open(tmp, "w") as fh:
            json.dump(state["ax"], fh)
        try:
            self._client = Client.load_from_json_file(tmp)
        finally:
            os.remove(tmp)
        self._trials = {k: int(v) for k, v in state["trials"].items()}
