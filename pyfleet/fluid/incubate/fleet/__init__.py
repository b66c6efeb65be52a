"""Fluid 1.5's ``paddle.fluid.incubate.fleet`` import paths (re-exports of pyfleet)."""

__all__ = []
