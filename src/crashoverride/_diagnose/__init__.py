"""_diagnose."""
