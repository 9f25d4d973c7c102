"""The version of crashoverride: its one spelling (``pyproject.toml`` reads it from here)."""

__version__ = "0.3.0.dev0"
