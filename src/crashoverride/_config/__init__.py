"""_config."""
