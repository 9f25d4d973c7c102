"""The applications the scenarios run, one module per family: what the agent sees."""
