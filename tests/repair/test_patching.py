"""Live code repair that reaches every caller, and the source of patched objects."""

from __future__ import annotations

import gc
import importlib
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from crashoverride import CrashOverride
from crashoverride._diagnose import source
from crashoverride._diagnose.source import origin, show_source
from crashoverride._repair.patching import replace_function
from crashoverride._security.gate import compile_source
from crashoverride.testing import done, exec_python, script, tool_outputs
from tests.fixtures.pricing import make_counter


@pytest.fixture
def modules() -> Iterator[tuple[object, object]]:
    import tests.fixtures.checkout as checkout
    import tests.fixtures.pricing as pricing

    yield pricing, checkout
    importlib.reload(pricing)
    importlib.reload(checkout)


NEW_PRICE = "def unit_price(sku):\n    return {'apple': 3}[sku]\n"


def test_rebinding_the_module_attribute_misses_from_imports(modules: tuple[object, object]) -> None:
    pricing, checkout = modules
    model = script(
        exec_python(
            f"import tests.fixtures.pricing as pricing\nexec({NEW_PRICE!r}, vars(pricing))"
        ),
        done(),
    )
    co = CrashOverride(model=model)
    repaired = lambda _: pricing.unit_price("apple") == 3  # type: ignore[attr-defined]  # noqa: E731
    with co.handler(postcondition=repaired):
        raise ValueError("trigger")
    assert pricing.unit_price("apple") == 3  # type: ignore[attr-defined]
    with pytest.raises(KeyError):  # `from pricing import unit_price` still holds the old one
        checkout.total("apple", 2)  # type: ignore[attr-defined]


def test_replace_function_reaches_every_reference(modules: tuple[object, object]) -> None:
    pricing, checkout = modules
    held = pricing.unit_price  # type: ignore[attr-defined]
    model = script(
        exec_python(
            "import tests.fixtures.pricing as pricing\n"
            f"replace_function(pricing.unit_price, {NEW_PRICE!r})"
        ),
        exec_python("print(show_source(pricing.unit_price))"),
        done(),
    )
    co = CrashOverride(model=model)
    repaired = lambda _: checkout.total("apple", 2) == 6  # type: ignore[attr-defined]  # noqa: E731
    with co.handler(postcondition=repaired):
        raise ValueError("trigger")
    assert checkout.total("apple", 2) == 6  # type: ignore[attr-defined]
    assert held("apple") == 3  # even a reference taken before the repair
    assert held.__name__ == "unit_price"
    outputs = tool_outputs(model)
    assert "now runs the new code for every caller" in outputs[0]
    assert "return {'apple': 3}[sku]" in outputs[1]  # show_source sees the live code


LOADED: list[str] = []  # what the lazy proxy below was asked


class _LazyProxy:
    """A stand-in for another module's object (a library's lazy proxy, say): asking what
    class it is loads something (openai's proxies import hundreds of modules)."""

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        LOADED.append("loaded")
        return type


def test_rebind_everywhere_touches_nothing_but_the_names_it_rebinds(
    modules: tuple[object, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    lazy = types.ModuleType("lazy_proxies")
    lazy.proxy = _LazyProxy()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "lazy_proxies", lazy)
    LOADED.clear()
    model = script(
        exec_python(
            "import tests.fixtures.pricing as pricing\n"
            f"new = {{}}\nexec({NEW_PRICE!r}, vars(pricing), new)\n"
            "rebind_everywhere(pricing.unit_price, new['unit_price'])"
        ),
        done(),
    )
    _, checkout = modules
    with CrashOverride(model=model).handler(postcondition=lambda _: True):
        raise ValueError("trigger")
    assert checkout.total("apple", 2) == 6  # type: ignore[attr-defined]  # its copy too
    assert LOADED == []


def test_replace_function_refuses_builtins_and_mismatched_closures() -> None:
    with pytest.raises(TypeError, match="not a Python function"):
        replace_function(len, "def len(x):\n    return 0\n")
    from tests.fixtures.pricing import make_counter

    bump = make_counter()
    with pytest.raises(ValueError, match="free variables"):
        replace_function(bump, "def bump():\n    return 1\n")
    with pytest.raises(ValueError, match="exactly one function"):
        replace_function(make_counter, "x = 1\n")


def test_show_source_of_unpatched_and_builtin_objects() -> None:
    from tests.fixtures.pricing import make_counter

    assert "def make_counter" in show_source(make_counter)
    assert "no source" in show_source(len)


def _made_in_a_file(tmp_path: Path) -> tuple[str, dict[str, Any]]:
    source = tmp_path / "made.py"
    source.write_text("def make():\n    def f(x):\n        return x\n\n    return f\n")
    namespace: dict[str, Any] = {}
    exec(compile(source.read_text(), str(source), "exec"), namespace)
    return str(source), namespace


def test_origins_do_not_outlive_the_functions_they_describe(tmp_path: Path) -> None:

    path, namespace = _made_in_a_file(tmp_path)
    gc.collect()
    before = len(source.ORIGINS)
    for i in range(200):  # a long-running server repairs many short-lived functions
        f = namespace["make"]()
        replace_function(f, f"def f(x):\n    return x + {i}\n")
        assert f(1) == 1 + i
        assert origin(f) == (path, 2, "    def f(x):\n        return x\n")
        del f
    gc.collect()
    assert len(source.ORIGINS) <= before


def test_origin_survives_renamed_and_repeated_replacements(tmp_path: Path) -> None:
    path, namespace = _made_in_a_file(tmp_path)
    f = namespace["make"]()
    original = (path, 2, "    def f(x):\n        return x\n")
    replace_function(f, "def fixed(x):\n    return 2\n")  # the agent named it differently
    assert f(0) == 2 and origin(f) == original
    replace_function(f, "def f(x):\n    return 3\n")  # patched again: still the file's original
    assert f(0) == 3 and origin(f) == original
    handed: dict[str, Any] = {}
    exec(compile_source("def f(x):\n    return 4\n"), handed)
    replace_function(f, handed["f"])  # a function object from the agent's snippet
    assert f(0) == 4 and origin(handed["f"]) == original
    own = origin(make_counter)
    assert own is not None and own[0].endswith("pricing.py")
    replace_function(f, make_counter)  # a function from a real file lends its code...
    assert origin(make_counter) == own  # ...and still persists to its own definition
    assert origin(f) == original
