"""The one place pyfleet's version is written (read by pyproject.toml and CMakeLists.txt)."""

__version__ = "0.1.0"
