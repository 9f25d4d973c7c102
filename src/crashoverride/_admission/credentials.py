"""Whether a model can be reached at all: the pipeline's first admission check (and doctor's).

Kept apart from ``_agent.run`` on purpose: asking must not import the SDK, the agent machinery or
anyio, so that a recovery refused for want of credentials ends in milliseconds.
"""

from __future__ import annotations

import os

from crashoverride._config.settings import Settings

NO_API_KEY = "no API key: set OPENAI_API_KEY or pass api_key= (or base_url=)"


def missing_credentials(settings: Settings) -> str | None:
    """Why no model can be reached with ``settings``, or None."""
    model = settings.model
    if model is not None and not isinstance(model, str):
        return None  # an SDK Model instance brings its own client (or needs none)
    if settings.openai_client_factory is not None or settings.base_url is not None:
        return None  # the user's client, or a server that usually ignores the key
    if settings.api_key is None and not os.environ.get("OPENAI_API_KEY"):
        return NO_API_KEY
    return None
