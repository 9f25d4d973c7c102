"""A recovered HTTP response says so: the recovery's id, and the request id echoed back."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from crashoverride import ConfigurationError, CrashOverride
from crashoverride.testing import done, exec_python, give_up, script
from tests.integrations import asgi_apps
from tests.integrations.asgi_support import named, serve

RESPOND = "respond(200, {'item': 'apple', 'price': PRICES['apple']['cost']})"


def _recovered_app(**options: Any) -> Any:
    model = script(exec_python(RESPOND), done("answered from PRICES"))
    return asgi_apps.starlette_app(crash_override=CrashOverride(model=model, **options))


def test_a_recovered_response_names_its_recovery_and_echoes_the_request_id(
    logs: list[dict[str, Any]],
) -> None:
    with serve(_recovered_app()) as server:
        response = httpx.get(
            server.url + "/price/apple", headers={"X-Request-ID": "req-7"}, timeout=30
        )
    assert (response.status_code, response.json()) == (200, {"item": "apple", "price": 3})
    [succeeded] = named(logs, "recovery.succeeded")
    assert response.headers["crashoverride-recovery"] == succeeded["recovery_id"]
    assert response.headers["x-request-id"] == "req-7"
    assert response.headers.get_list("crashoverride-recovery") == [succeeded["recovery_id"]]


def test_no_request_id_is_made_up_and_a_custom_header_is_echoed() -> None:
    model = script(exec_python(RESPOND), done(), exec_python(RESPOND), done())
    app = asgi_apps.starlette_app(
        crash_override=CrashOverride(model=model, single_flight=False),
        request_id_header="x-correlation-id",
    )
    with serve(app) as server:
        bare = httpx.get(server.url + "/price/apple", timeout=30)
        tagged = httpx.get(
            server.url + "/price/apple", headers={"X-Correlation-ID": "c-1"}, timeout=30
        )
    assert bare.status_code == tagged.status_code == 200
    assert "x-request-id" not in bare.headers and "x-correlation-id" not in bare.headers
    assert tagged.headers["x-correlation-id"] == "c-1"
    assert bare.headers["crashoverride-recovery"] != tagged.headers["crashoverride-recovery"]


def test_recovery_header_false_leaves_the_recovery_unmarked() -> None:
    with serve(_recovered_app(recovery_header=False)) as server:
        response = httpx.get(
            server.url + "/price/apple", headers={"X-Request-ID": "req-8"}, timeout=30
        )
    assert response.status_code == 200
    assert "crashoverride-recovery" not in response.headers
    assert response.headers["x-request-id"] == "req-8"  # the request id is echoed regardless


def test_an_unrecovered_500_carries_no_marker() -> None:
    model = script(give_up("no usable price"))
    app = asgi_apps.starlette_app(crash_override=CrashOverride(model=model))
    with serve(app) as server:
        response = httpx.get(
            server.url + "/price/apple", headers={"X-Request-ID": "req-9"}, timeout=30
        )
    assert response.status_code == 500
    assert "crashoverride-recovery" not in response.headers


def test_recovery_header_must_be_a_bool() -> None:
    with pytest.raises(ConfigurationError, match="recovery_header"):
        CrashOverride(recovery_header="yes")  # type: ignore[arg-type]
