"""Framework integrations (installed as ``crashoverride.integrations``)."""
