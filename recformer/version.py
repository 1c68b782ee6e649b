"""The installed recformer's version: ``recformer --version`` and every export's manifest read it
from here (a module of its own, so neither imports the other)."""

from __future__ import annotations


def version() -> str:
    """The installed distribution's version (pyproject.toml), or the source tree's when not installed."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("recformer")
    except PackageNotFoundError:
        return "unknown (not installed; pip install -e .)"
