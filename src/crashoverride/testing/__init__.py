"""Rehearse recoveries offline: scripted models, a mock OpenAI endpoint, cassettes, pytest.

Steps speak crashoverride's tool contract; every argument of ``script``/``Script`` is one
model turn::

    from crashoverride import CrashOverride
    from crashoverride.testing import done, exec_python, script

    co = CrashOverride(model=script(exec_python("caller['x'] = 1"), done("set x")))

The same steps drive ``MockServer`` (chat completions on loopback, streaming or not, with
faults), which can also replay or record a ``Cassette``. The pytest plugin
(``crashoverride.testing.plugin``) provides fixtures over all of this. After a recovery,
``tool_outputs(model)`` lists the tool results the scripted model was sent.

Nothing here imports the Agents SDK until a ``ScriptedModel`` is built.
"""

from __future__ import annotations

from crashoverride.testing._calls import tool_outputs
from crashoverride.testing._cassette import Cassette, CassetteError, CassetteMismatch
from crashoverride.testing._http import ReceivedRequest
from crashoverride.testing._server import MockServer
from crashoverride.testing._steps import (
    Fault,
    Message,
    Script,
    StepLike,
    ToolCall,
    Turn,
    done,
    eval_python,
    exec_python,
    give_up,
    hang,
    http_error,
    inspect_python,
    junk_arguments,
    malformed,
    output_items,
    rate_limited,
    script,
    spawn_followup,
    tool_call,
    unknown_tool,
)

__all__ = [
    "Cassette",
    "CassetteError",
    "CassetteMismatch",
    "Fault",
    "Message",
    "MockServer",
    "ReceivedRequest",
    "Script",
    "StepLike",
    "ToolCall",
    "Turn",
    "done",
    "eval_python",
    "exec_python",
    "give_up",
    "hang",
    "http_error",
    "inspect_python",
    "junk_arguments",
    "malformed",
    "output_items",
    "rate_limited",
    "script",
    "spawn_followup",
    "tool_call",
    "tool_outputs",
    "unknown_tool",
]
