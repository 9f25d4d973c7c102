"""Framework integrations, written against the public contract only.

Modules: ``asgi`` (``CrashOverrideMiddleware`` for Starlette/FastAPI; a subpackage:
``_middleware`` for the options, the scope types and the lifespan, ``_http`` for the request
path, ``_exchange`` for one HTTP exchange, ``_block`` for what a failed request looks like to
the recovery, ``_after`` for failures after the response started, ``_failed`` for what a
failed request or message shows the recovery alike, ``_websocket`` and ``_ws_*`` for
websocket messages, ``_options`` for option checks, ``_units`` for idempotency keys),
``asyncio`` (recovered tasks and task groups), ``celery`` (recovered tasks, follow-ups as a
Celery task), ``scrapy`` (a spider middleware that recovers failing callbacks; a subpackage:
``_middleware`` for the middleware, ``_callback`` for what a failed callback looks like to the
recovery, ``_outputs`` for what a callback yielded), ``arq``
(recovered jobs, follow-ups as an arq job).

May import: ``crashoverride``, ``crashoverride.integration``, ``crashoverride.followups``
(public names only; ``tests/architecture/test_layering.py`` checks it).
"""
