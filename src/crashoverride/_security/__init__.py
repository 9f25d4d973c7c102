"""_security."""
