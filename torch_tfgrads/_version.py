"""The package's version, in one place: pyproject.toml reads it statically (no import, so no torch
needed to read the project's metadata) and `torch_tfgrads.__version__` re-exports it."""

__version__ = "0.1.0"
