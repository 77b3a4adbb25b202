"""Versions of the installed Python distributions (pmpipe, the JAX stack, the peers)."""

from __future__ import annotations

import importlib.metadata


def installed(package: str) -> str | None:
    """The installed version of distribution ``package`` ('jaxlib'), None when absent."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None
