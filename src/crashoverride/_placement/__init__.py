"""_placement."""
