"""_admission."""
