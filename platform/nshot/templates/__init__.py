"""Templates that ``nshot new`` copies (:mod:`nshot.scaffold`).

``method/`` is a complete method package named ``skeleton`` (a prototypical-network classifier
on a tiny generated dataset); ``nshot new NAME`` writes a copy with ``skeleton`` replaced by
NAME and ``Skeleton`` by its CamelCase. It is a working method, not text with holes: ruff checks
it with the rest of nshot, and the tests register a generated copy and run the conformance
checks on it.
"""
