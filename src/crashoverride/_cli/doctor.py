"""``crashoverride doctor``: could a recovery run right now, and if not, why not.

Every check is something a recovery depends on. The endpoint is checked by doing what a
recovery's first model turn does: one real request, through the ``openai`` client, to the
endpoint and API a recovery would use (chat completions when a base URL is given, the SDK's
default, the Responses API, otherwise), with a short timeout and no retry. Its answer is
classified so the user knows what to fix: unreachable, auth rejected, model not found, wrong
API shape (not an OpenAI-compatible endpoint at that URL), another error, or ok.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import os
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

OPENAI_URL = "https://api.openai.com/v1"
# A one-word answer: the cheapest request that still proves the model can answer.
PROBE_TEXT = "Reply with the single word: ok"
CHAT = "chat completions"
RESPONSES = "Responses API"


@dataclass
class Check:
    """One line of the doctor's report. ``status``: ``ok``, ``fail`` or ``info``."""

    name: str
    status: str
    detail: str
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        return {**{k: v for k, v in data.items() if k != "extra"}, **self.extra}


@dataclass
class Target:
    """The endpoint and API a recovery would use, from the doctor's arguments and environment."""

    url: str
    api: str
    key: str | None
    model: str


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _caller_locals_work() -> bool:
    from crashoverride._placement.frames import CallerLocals

    frame = sys._getframe()
    probe = 0
    CallerLocals(frame)["probe"] = 1
    return probe == 1


# ------------------------------------------------------------------------------ the endpoint


def _error_of(body: str) -> dict[str, Any]:
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return {}
    return error if isinstance(error, dict) else {"message": str(error)}


def classify(status: int, body: str, model: str) -> tuple[str, str]:
    """(verdict, detail) for an HTTP error answer of the endpoint."""
    error = _error_of(body)
    message = str(error.get("message") or "").strip()
    said = f": {message[:200]}" if message else ""
    if status in (401, 403):
        return "auth rejected", f"HTTP {status}{said}"
    about_model = error.get("code") == "model_not_found" or error.get("param") == "model"
    if status in (400, 404) and (about_model or (model in message and "model" in message.lower())):
        return "model not found", f"HTTP {status}: the endpoint does not serve {model!r}{said}"
    if status == 404:
        what = "an OpenAI-style error" if error else "no OpenAI-style error body"
        return "wrong API shape", (
            f"HTTP 404 with {what}: no OpenAI-compatible API at this URL (a base URL usually "
            f"ends in /v1){said}"
        )
    if status == 429:
        return "rate limited", f"HTTP 429: rate limited or out of quota{said}"
    return "endpoint error", f"HTTP {status}{said}"


def probe(target: Target, timeout: float) -> Check:
    """One real, minimal request to ``target``; never raises for the endpoint's failures."""
    from openai import APIConnectionError, APIStatusError, APITimeoutError, OpenAI

    # Local servers usually ignore the key, but the client requires one (as recoveries do).
    client = OpenAI(
        api_key=target.key or "unused", base_url=target.url, max_retries=0, timeout=timeout
    )
    where = f"{target.api} at {target.url}"
    began = time.perf_counter()
    try:
        if target.api == CHAT:
            raw: Any = client.chat.completions.with_raw_response.create(
                model=target.model, messages=[{"role": "user", "content": PROBE_TEXT}]
            )
        else:
            raw = client.responses.with_raw_response.create(
                model=target.model, input=PROBE_TEXT, max_output_tokens=16
            )
        status, body = raw.http_response.status_code, raw.http_response.text
    except APITimeoutError:
        return _endpoint("unreachable", f"no answer within {timeout:g} s ({where})", target)
    except APIConnectionError as exc:
        cause = exc.__cause__ or exc
        return _endpoint("unreachable", f"{type(cause).__name__}: {cause} ({where})", target)
    except APIStatusError as exc:
        verdict, detail = classify(exc.status_code, exc.response.text, target.model)
        return _endpoint(verdict, f"{_masked(detail, target.key)} ({where})", target)
    finally:
        client.close()
    latency = round((time.perf_counter() - began) * 1000, 1)
    try:
        answer = json.loads(body)
    except ValueError:
        answer = None
    expected = "choices" if target.api == CHAT else "output"
    if not isinstance(answer, dict) or expected not in answer:
        shown = "not JSON" if answer is None else f"JSON without {expected!r}"
        detail = f"HTTP {status} but the body is {shown}: not an OpenAI-compatible {where}"
        return _endpoint("wrong API shape", detail, target)
    model = str(answer.get("model") or target.model)
    detail = f"{model} answered in {latency:g} ms ({where})"
    return _endpoint("ok", detail, target, model=model, latency_ms=latency)


def _masked(text: str, key: str | None) -> str:
    # An endpoint may echo the key it refused; the doctor never prints one.
    return text.replace(key, "***") if key else text


def _endpoint(verdict: str, detail: str, target: Target, **extra: Any) -> Check:
    status = "ok" if verdict == "ok" else "fail"
    facts = {"verdict": verdict, "url": target.url, "api": target.api, "model": target.model}
    return Check("endpoint", status, detail, {**facts, **extra})


def _target(base_url: str | None, model: str | None) -> Target | Check:
    """What a recovery would talk to, or the check that says it cannot talk to anything."""
    from crashoverride._admission.credentials import missing_credentials
    from crashoverride._config.settings import Settings
    from crashoverride._errors import ConfigurationError

    try:  # validated as ``CrashOverride(base_url=..., model=...)`` would
        settings = Settings.for_app(base_url=base_url, model=model)
    except ConfigurationError as exc:
        return Check("endpoint", "fail", f"not checked: {exc}", {"verdict": "bad argument"})
    missing = missing_credentials(settings)  # the pipeline's own admission check
    if missing is not None:
        why = f"{missing}: recoveries would fail at once"
        return Check("endpoint", "fail", why, {"verdict": "no credentials"})
    key = os.environ.get("OPENAI_API_KEY") or None
    try:
        from agents.models.default_models import get_default_model
    except Exception as exc:
        why = f"not checked: the Agents SDK does not import ({exc})"
        return Check("endpoint", "fail", why, {"verdict": "not checked"})
    name = model or get_default_model()
    if base_url:
        # ``base_url=`` recoveries speak chat completions (see ``_agent.run``).
        return Target(base_url.rstrip("/"), CHAT, key, name)
    # Without ``base_url=`` the SDK's default provider decides: the Responses API, at
    # OPENAI_BASE_URL when set (the openai client reads it), else at OpenAI.
    url = (os.environ.get("OPENAI_BASE_URL") or OPENAI_URL).rstrip("/")
    return Target(url, RESPONSES, key, name)


# ------------------------------------------------------------------------------- the report


def checks(
    *, base_url: str | None, model: str | None, timeout: float, celery_app: str | None
) -> list[Check]:
    found: list[Check] = []
    version = ".".join(map(str, sys.version_info[:3]))
    found.append(Check("python", "ok" if sys.version_info >= (3, 11) else "fail", version))
    works = _caller_locals_work()
    how = "native write-through proxy (PEP 667)" if sys.version_info >= (3, 13) else (
        "PyFrame_LocalsToFast")  # fmt: skip
    found.append(Check("caller locals write-through", "ok" if works else "fail",
                       how if works else "NOT working"))  # fmt: skip
    sdk = _version("openai-agents")
    found.append(Check("openai-agents", "ok" if sdk else "fail", sdk or "not installed"))
    found.append(Check("openai", "info", _version("openai") or "not installed"))
    found.extend(_extras())
    key = os.environ.get("OPENAI_API_KEY")
    shown_key = "configured (OPENAI_API_KEY, not shown)" if key else "not configured"
    found.append(Check("API key", "info", shown_key))
    found.append(_warm_up(base_url, model))
    target = _target(base_url, model)
    found.append(target if isinstance(target, Check) else probe(target, timeout))
    found.append(_celery_check(celery_app))
    tracing_off = os.environ.get("OPENAI_AGENTS_DISABLE_TRACING", "").lower() in ("1", "true")
    tracing = "off (crashoverride disables it per run unless tracing=True)"
    found.append(
        Check("SDK tracing", "info", tracing + ("; also off globally" if tracing_off else ""))
    )
    return found


# Extras that only gather others (``all``) or serve this repository (``dev``): not features.
_GATHERING = frozenset({"all", "dev"})
_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_OF_EXTRA = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")


def _extras() -> list[Check]:
    """One line per extra the installed package declares: installed, or how to install it."""
    try:
        meta = importlib.metadata.metadata("crashoverride")
    except importlib.metadata.PackageNotFoundError:
        return [Check("extras", "info", "unknown: crashoverride is not installed as a package")]
    needs: dict[str, list[str]] = {}
    for extra in meta.get_all("Provides-Extra") or ():
        if extra not in _GATHERING:
            needs[extra] = []
    for requirement in meta.get_all("Requires-Dist") or ():
        marker = _OF_EXTRA.search(requirement)
        name = _REQUIREMENT.match(requirement)
        if marker is not None and name is not None and marker.group(1) in needs:
            needs[marker.group(1)].append(name.group(1))
    found = []
    for extra, dists in sorted(needs.items()):
        versions = [(dist, _version(dist)) for dist in dists]
        absent = [dist for dist, version in versions if version is None]
        if absent:
            detail = (
                f"not installed ({', '.join(absent)} missing): pip install 'crashoverride[{extra}]'"
            )
        else:
            detail = "installed (" + ", ".join(f"{d} {v}" for d, v in versions) + ")"
        found.append(Check(f"extra {extra}", "info", detail))
    return found


def _warm_up(base_url: str | None, model: str | None) -> Check:
    """Whether ``CrashOverrideMiddleware`` would import the Agents SDK at lifespan startup: not
    when no recovery could reach a model (the same admission check a recovery asks first)."""
    from crashoverride._admission.credentials import missing_credentials
    from crashoverride._config.settings import Settings
    from crashoverride._errors import ConfigurationError

    name = "ASGI lifespan warm-up"
    try:
        settings = Settings.for_app(base_url=base_url, model=model)
    except ConfigurationError as exc:
        return Check(name, "info", f"not known: {exc}")
    missing = missing_credentials(settings)
    if missing is not None:
        return Check(name, "info", f"skipped: {missing}; no recovery could run, so the "
                     "middleware does not import the Agents SDK at startup")  # fmt: skip
    return Check(name, "info", "runs: the middleware imports the Agents SDK at lifespan "
                 "startup, so the first recovery does not wait for it")  # fmt: skip


def _importable_here() -> None:
    # ``celery -A shop worker`` finds ``shop`` in the directory it is started from; the
    # ``crashoverride`` console script does not put that directory on the path, so do it here.
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)


def _celery_check(spec: str | None) -> Check:
    name = "celery follow-up queue"
    if spec is None:
        if importlib.util.find_spec("celery") is None:
            return Check(name, "info", "celery not installed")
        return Check(name, "info", "not checked: pass --celery-app module:app to check that a "
                     "running worker consumes the follow-up queue")  # fmt: skip
    try:
        from celery.utils.imports import symbol_by_name

        # By name: ``integrations`` is mapped into the package at install time.
        support = importlib.import_module("crashoverride.integrations.celery")
        _importable_here()
        app = symbol_by_name(spec)
    except Exception as exc:
        return Check(name, "fail", f"could not load {spec!r}: {type(exc).__name__}: {exc}")
    queue = support.followup_queue(app)
    consumers = support.queue_consumers(app, queue)
    if consumers is None:
        return Check(name, "fail", f"could not ask the workers about {queue!r} (broker down?)",
                     {"queue": queue})  # fmt: skip
    if not consumers:
        why = f"no running worker consumes {queue!r}: follow-ups would wait in the broker"
        return Check(name, "fail", f"{why} (start one with -Q celery,{queue})", {"queue": queue})
    detail = f"{queue!r} consumed by {', '.join(sorted(consumers))}"
    return Check(name, "ok", detail, {"queue": queue, "consumers": sorted(consumers)})


def verdict(found: list[Check]) -> str:
    """One line: healthy, or every failed check with what went wrong."""
    failed = [c for c in found if c.status == "fail"]
    if failed:
        said = [
            f"{c.name}: {c.extra['verdict']} - {c.detail}" if "verdict" in c.extra
            else f"{c.name}: {c.detail}"
            for c in failed
        ]  # fmt: skip
        return "NOT healthy: " + "; ".join(said)
    endpoint = next(c for c in found if c.name == "endpoint")
    return f"healthy: a recovery could run now ({endpoint.detail})"


def render(found: list[Check], *, as_json: bool) -> str:
    """The report: the verdict first (``doctor | head -1`` is the answer), then each check."""
    healthy = not any(c.status == "fail" for c in found)
    if as_json:
        return json.dumps({"healthy": healthy, "verdict": verdict(found),
                           "checks": [c.as_dict() for c in found]}, indent=2)  # fmt: skip
    mark = {"ok": "ok  ", "fail": "FAIL", "info": "info"}
    lines = [verdict(found)] + [f"{mark[c.status]} {c.name}: {c.detail}" for c in found]
    return "\n".join(lines)
