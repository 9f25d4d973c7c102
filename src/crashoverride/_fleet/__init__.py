"""_fleet."""
