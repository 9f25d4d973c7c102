"""_agent."""
