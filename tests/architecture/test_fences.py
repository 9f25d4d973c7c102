"""Every brief is trusted template parts plus untrusted values, and only the values vary.

Issue 21 (item 3): a request's path or a task's id written into a brief's text reached the model
outside every fence. ``Brief`` keeps the two apart and ``Block`` accepts nothing else; these
tests read the package's source (``fences.py``) so that no construction site builds a brief's
text from what an occurrence brought, and show on planted sources that the reader catches it.
"""

from __future__ import annotations

import textwrap

import pytest

from tests.architecture.fences import scan
from tests.architecture.graph import modules

# Where briefs and blocks are built. Closed lists: a new site is read by the rules below, and
# named here so that a reader that stopped seeing the package cannot pass unnoticed.
BRIEF_SITES = {
    "crashoverride._core.block",
    "crashoverride._security.brief",  # the empty brief of a block that needs none
    "crashoverride.integrations.asgi._after",
    "crashoverride.integrations.asgi._block",
    "crashoverride.integrations.arq",
    "crashoverride.integrations.asgi._ws_block",
    "crashoverride.integrations.asyncio",
    "crashoverride.integrations.celery",
    "crashoverride.integrations.scrapy._callback",
}
BLOCK_SITES = {
    "crashoverride._core.block",
    "crashoverride._core.followup",
    "crashoverride.integrations.asgi._failed",  # a failed request's, or websocket message's
    "crashoverride.integrations.asyncio",
}


def _package() -> dict[str, str]:
    return {name: path.read_text() for name, path in modules().items()}


def test_every_brief_in_the_package_is_fixed_parts_and_fenced_values() -> None:
    found = scan(_package())
    assert [str(v) for v in found.violations] == []


def test_the_construction_sites_are_the_known_ones() -> None:
    found = scan(_package())
    assert {f.module for f in found.briefs} == BRIEF_SITES
    assert {f.module for f in found.blocks} == BLOCK_SITES
    # Every integration's block gets its brief through a Brief: one per kind of unit at least.
    assert len(found.briefs) >= 8, [str(f) for f in found.briefs]


def _violations(source: str, **others: str) -> list[str]:
    sources = {"app": textwrap.dedent(source), **{k: textwrap.dedent(v) for k, v in others.items()}}
    return [v.what for v in scan(sources).violations]


CLEAN = """
    from crashoverride.integration import Block, Brief

    HEAD = "This is the task shown above (`task`)."
    NOTES = {"GET": "GET is safe."}
    OTHER = "Its method is not a standard one."

    class Unit:
        def brief(self, method: str, task_id: str) -> Brief:
            return Brief(
                HEAD, "Finish with set_result().", NOTES.get(method, OTHER),
                NOTES[method] if method in NOTES else OTHER,
                task=task_id, request=f"{method} /x", **({"n": 1} if method else {}),
            )

        def block(self, given: Brief | None = None) -> Block:
            return Block(kind="task", brief=self.brief("GET", "1") if given is None else given)
"""


def test_the_reader_accepts_fixed_parts_and_values() -> None:
    assert _violations(CLEAN) == []
    assert len(scan({"app": textwrap.dedent(CLEAN)}).briefs) == 1


@pytest.mark.parametrize(
    ("planted", "caught"),
    [
        ('Brief(f"This is the task {task_id}.")', "not fixed at import"),
        ("Brief(HEAD.format(id=task_id))", "not fixed at import"),
        ('Brief("The request " + path)', "not fixed at import"),
        ('Brief("The request %s" % path)', "not fixed at import"),
        ("Brief(text)", "not fixed at import"),
        ("Brief(str(path))", "not fixed at import"),
        ("Brief(NOTES.get(method, path))", "not fixed at import"),
        ("Brief(HEAD if ok else path)", "not fixed at import"),
        ("Brief(*parts)", "unpacked from a sequence"),
        ("Brief(ELSEWHERE)", "no module constant of the package"),
        ('Block(kind="x", brief="This is the request " + path)', "not a Brief"),
        ('Block(kind="x", brief=f"task {task_id}")', "not a Brief"),
        ("call_block(f, (), {}, exc, brief=TASK_BRIEF.format(name=path))", "not a Brief"),
        ("call_block(f, (), {}, exc, brief=text)", "not a Brief"),
        ('block.brief = "request " + path', "not a Brief"),
        ("text = TASK_BRIEF.format(name=path)", "template filled in"),
        ("text = TASK_BRIEF + path", "template filled in"),
        ('text = f"{TASK_BRIEF} {path}"', "template filled in"),
        ("NOTES['GET'] = path", "changed at run time"),
        ("NOTES.update(GET=path)", "changed at run time"),
    ],
)
def test_the_reader_catches_a_planted_violation(planted: str, caught: str) -> None:
    source = f"""
        from crashoverride.integration import Block, Brief, call_block
        from elsewhere import ELSEWHERE

        HEAD = "This is the task."
        NOTES = {{"GET": "GET is safe."}}
        TASK_BRIEF = "This is the task {{name}}."

        def build(f, exc, block, text: str, path: str, task_id: str, method: str, ok: bool, parts):
            {planted}
            return Brief(NOTES["GET"])
    """
    found = _violations(source)
    assert found, f"not caught: {planted}"
    assert any(caught in what for what in found), found


def test_the_reader_catches_a_part_rebound_at_run_time_elsewhere() -> None:
    templates = """
        TEXT = "This is the task."

        def reset(path):
            global TEXT
            TEXT = path
    """
    use = """
        from templates import TEXT
        from crashoverride.integration import Brief

        def brief() -> Brief:
            return Brief(TEXT)
    """
    found = scan({"app": textwrap.dedent(use), "templates": textwrap.dedent(templates)})
    assert [(v.module, v.what) for v in found.violations] == [
        ("templates", "TEXT, a brief part, is changed at run time"),
        ("templates", "TEXT, a brief part, is changed at run time"),
    ]


def test_a_brief_builder_must_return_a_brief() -> None:
    found = _violations("""
        def request_brief(path: str) -> str:
            return "The request " + path
    """)
    assert found == ["request_brief() is not annotated to return a Brief"]
