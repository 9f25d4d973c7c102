"""Benchmarks: each module has ``run() -> list[Row]``; ``python -m benchmarks`` runs them all."""
