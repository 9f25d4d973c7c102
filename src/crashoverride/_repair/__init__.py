"""_repair."""
