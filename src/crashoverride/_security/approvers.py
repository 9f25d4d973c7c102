"""An approver's identity across processes, and several approvers asked as one.

A follow-up may run in another process (``SubprocessRunner``, a Celery worker) and must run
there under its recovery's ``approve=``. A callable cannot travel in a JSON payload, so its
name does: ``reference`` writes ``"module:qualname"`` only when importing that name gives back
the very same object, and ``resolve`` finds it again in the other process. An approver that no
name leads back to (a lambda, a closure, a bound method, anything defined in ``__main__``) has
no reference: a job that needs it can run only where the object itself is at hand.

``AllOf`` is how a process adds its own approver to the one a job brings: each is asked in
turn and the first that does not approve decides (the gate names each in ``approved_by``).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import sys
from typing import Any

from crashoverride._security.audit import Approval, ApprovalRequest, Approver
from crashoverride._security.verdict import judge


def reference(approve: Any) -> str:
    """``"module:qualname"`` naming ``approve`` importably, or ``""`` when no name leads back."""
    module_name = getattr(approve, "__module__", None)  # an instance: its class's module
    # ``__main__`` is another module in every other process (there: the runner's own).
    module = sys.modules.get(module_name) if isinstance(module_name, str) else None
    if module is None or module_name == "__main__":
        return ""
    qualname = getattr(approve, "__qualname__", None)
    if isinstance(qualname, str) and "<" not in qualname and _walk(module, qualname) is approve:
        return f"{module_name}:{qualname}"
    # A callable instance bound to a module-level name (``approve=policy``).
    for name, value in list(vars(module).items()):
        if value is approve:
            return f"{module_name}:{name}"
    return ""


def resolve(ref: str) -> Approver:
    """The approver ``reference`` named, imported if need be.

    Raises:
        LookupError: Why no approver can be found under that name here.
    """
    module_name, _, qualname = ref.partition(":")
    if not module_name or not qualname or "<" in qualname:
        raise LookupError(f"{ref!r} names no importable object")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or the module's own code failing to import
        raise LookupError(f"cannot import {module_name}: {type(exc).__name__}: {exc}") from None
    found = _walk(module, qualname)
    if found is None:
        raise LookupError(f"{module_name} has no {qualname}")
    if inspect.isclass(found) or not callable(found):
        raise LookupError(f"{ref} is not an approver (a function or a callable object)")
    approver: Approver = found
    return approver


def _walk(module: Any, qualname: str) -> Any:
    target = module
    for part in qualname.split("."):
        target = getattr(target, part, None)
        if target is None:
            return None
    return target


class AllOf:
    """Several approvers as one ``approve=``: asked in order, the first no decides.

    The gate asks each itself (``approvers``), in the owner's context, and names each in the
    audit record; calling the object asks them the same way for any other caller.
    """

    __slots__ = ("approvers",)

    def __init__(self, *approvers: Approver) -> None:
        self.approvers = approvers

    async def __call__(self, call: ApprovalRequest) -> Approval:
        for approver in self.approvers:
            said = judge(functools.partial(approver, call), what="it")
            if inspect.isawaitable(said):
                said = await said
            if said is not True:
                return str(said)
        return True


def each(approve: Approver) -> tuple[Approver, ...]:
    """The approvers ``approve`` stands for, in the order they are asked."""
    return approve.approvers if isinstance(approve, AllOf) else (approve,)
