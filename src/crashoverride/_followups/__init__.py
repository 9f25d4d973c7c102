"""_followups."""
