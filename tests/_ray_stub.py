"""A stand-in for ``ray.init`` that refuses to start Ray (the ``ray_refused`` fixture of
``conftest.py``): a command that raises :class:`RayStarted` got past every check it makes
before Ray starts."""

from __future__ import annotations


class RayStarted(Exception):  # noqa: N818 - a signal, not an error
    """Raised by the stand-in for ``ray.init``: the command got past its checks."""


def refuse(*_args, **_kwargs):
    raise RayStarted
