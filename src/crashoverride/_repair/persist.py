"""Making a runtime repair durable: write the fix to the source file, or propose it as a patch.

Off unless the application or handler passes ``allow_source_changes=True``. This is a rail for
honest agents, not a security boundary: ``exec_python`` can write files anyway (the docs say
so). What it adds: a syntax check before writing, a backup, a unified diff logged as
``recovery.source_changed`` and recorded in the report, and the "propose only" mode that writes
a ``.patch`` file for review instead of touching the source.

With a fleet (``RedisCoordination``), what a recovery wrote goes into its fix record
(``_repair.journal``): a persisted function the live one does not run yet, as code other processes
run live; any other file edit, as information only (its redacted diff). Proposals change
nothing anywhere, so they publish nothing.
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import inspect
import itertools
import os
import stat
import sys
import tempfile
import textwrap
import types
from collections.abc import Callable
from typing import Any

from crashoverride._diagnose.source import origin
from crashoverride._observe import events
from crashoverride._observe.report import SourceChange
from crashoverride._security.gate import compile_agent
from crashoverride._security.redact import Redacted, clip, fixed

REFUSED = (
    "source changes are off for this recovery: the application must pass "
    "allow_source_changes=True (to CrashOverride or the handler) before a recovery may change "
    "files. The running process can still be repaired with replace_function()."
)


class SourceEditor:
    """The persistence helpers bound into one recovery's namespace."""

    def __init__(
        self,
        *,
        allowed: bool,
        style: str,
        recovery_id: str,
        redact: Callable[[str], Redacted],
        fields: Callable[[], dict[str, Any]],
    ) -> None:
        self.allowed = allowed
        self.style = style
        self.recovery_id = recovery_id
        self.redact = redact
        self.fields = fields
        self.changes: list[SourceChange] = []
        self._last_written = False

    def persist_function(self, func: Any, new_source: str | None = None) -> str:
        """Write ``func``'s new source (default: what it runs now) over its definition on disk."""
        if not self.allowed:
            raise PermissionError(REFUSED)
        found = origin(getattr(func, "__func__", func))
        if found is None:
            raise ValueError(f"cannot tell which file defines {func!r}")
        path, first_line, original = found
        given = new_source
        if new_source is None:
            new_source = inspect.getsource(func)
        text = _read(path)
        lines = text.splitlines(keepends=True)
        start = first_line - 1
        old_lines = original.splitlines(keepends=True)
        if "".join(lines[start : start + len(old_lines)]) != original:
            # The file moved under us: fall back to finding the original text once.
            if text.count(original) != 1:
                raise ValueError(f"{path} no longer contains the original definition exactly once")
            start = text[: text.index(original)].count("\n")
        indent = old_lines[0][: len(old_lines[0]) - len(old_lines[0].lstrip())]
        body = textwrap.indent(textwrap.dedent(new_source).rstrip("\n") + "\n", indent)
        decorators = [line for line in old_lines if line.lstrip().startswith("@")]
        if decorators and not body.lstrip().startswith("@"):
            body = "".join(decorators) + body  # keep the decorators the live patch lacks
        new_text = "".join(lines[:start]) + body + "".join(lines[start + len(old_lines) :])
        new_text, unresolved = _with_needed_imports(new_text, getattr(func, "__func__", func))
        outcome = self._apply(path, text, new_text)
        if given is not None and self._written():
            _note_function(getattr(func, "__func__", func), given)
        if unresolved:
            outcome += (
                f"; warning: it uses {', '.join(sorted(unresolved))}, which the file does not "
                "define: the next run will fail unless you add them (persist_file_edit)"
            )
        return outcome

    def persist_file_edit(self, path: str, old: str, new: str) -> str:
        """Replace the one occurrence of ``old`` in the file at ``path`` with ``new``."""
        if not self.allowed:
            raise PermissionError(REFUSED)
        text = _read(path)
        count = text.count(old)
        if count != 1:
            raise ValueError(f"`old` must occur exactly once in {path}; it occurs {count} times")
        outcome = self._apply(path, text, text.replace(old, new, 1))
        if self._written():
            from crashoverride._repair.journal import note_file

            note_file(self.recovery_id, _import_relative(path), self.changes[-1].diff)
        return outcome

    def _written(self) -> bool:
        """Whether the last ``_apply`` wrote a file (not: no change, or a proposal)."""
        return bool(self._last_written)

    def _apply(self, path: str, before: str, after: str) -> str:
        self._last_written = False
        if path.endswith(".py"):
            ast.parse(after, path)  # a fix that does not parse is never written
        name = os.path.basename(path)
        diff = "".join(
            difflib.unified_diff(
                before.splitlines(keepends=True), after.splitlines(keepends=True),
                f"a/{name}", f"b/{name}",
            )
        )  # fmt: skip
        if not diff:
            return "no change: the file already has this source"
        redact = self.redact
        if self.style == "patch":
            target = _create(f"{path}.{self.recovery_id}", ".patch", diff)
            change = SourceChange(
                path=redact(path), kind="proposed", diff=redact(diff), file=redact(target)
            )
        else:
            # The backup keeps the source's permission bits, so restoring it is a plain rename.
            mode = stat.S_IMODE(os.stat(path).st_mode)
            backup = _create(f"{path}.{self.recovery_id}", ".bak", before, mode)
            _replace(path, after)
            change = SourceChange(
                path=redact(path), kind="written", diff=redact(diff), file=redact(backup)
            )
            self._last_written = True
        self.changes.append(change)
        events.emit("warning", events.SOURCE_CHANGED, path=change.path, kind=fixed(change.kind),
                  diff=clip(change.diff, 4_000), file=change.file, **self.fields())  # fmt: skip
        if change.kind == "proposed":
            return f"proposed: the patch for {path} was written to {change.file} for review"
        return f"written: {path} updated (backup {change.file})"


def _note_function(func: Any, new_source: str) -> None:
    """A persisted function, for the fix record: a target other processes run live, unless the
    live function runs this code already (then the call that made it run it noted it)."""
    from crashoverride._repair.journal import digest, note

    if not isinstance(func, types.FunctionType):
        return
    compiled = _bare_definition(new_source)
    if compiled is None:
        return  # not one function definition: nothing ``replace_function`` could apply
    source, code = compiled
    if digest(code) != digest(func.__code__):
        note(func, func.__code__, source, new=code, kind="persist")


def _bare_definition(source: str) -> tuple[str, types.CodeType] | None:
    """The one function ``source`` defines, without its decorators, and its code.

    Decorators ran when the module was imported (routes, registries); run again where the
    record is applied live, they would register twice. ``replace_function`` takes the bare
    definition and keeps the decorated function's identity. Compiled, not executed, with no
    inherited ``__future__`` flags, as ``replace_function`` compiles it (the same digest).
    """
    text = textwrap.dedent(source)
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.FunctionDef | ast.AsyncFunctionDef):
        return None
    node = tree.body[0]
    bare = "".join(text.splitlines(keepends=True)[node.lineno - 1 :])
    module = compile_agent(bare, "exec", filename="<persisted>")  # digested, never run
    for const in module.co_consts:
        if isinstance(const, types.CodeType) and const.co_name == node.name:
            return bare, const
    return None


def _import_relative(path: str) -> str:
    """``path`` as every process of a deployment names it: from the ``sys.path`` entry it lies
    under (the deepest), else its file name. Absolute paths differ between hosts, containers and
    virtualenvs, and would tell everyone who reads Redis this host's layout (user names)."""
    real = os.path.realpath(path)
    root = ""
    for entry in sys.path:
        candidate = os.path.realpath(entry or os.curdir)
        if real.startswith(candidate.rstrip(os.sep) + os.sep) and len(candidate) > len(root):
            root = candidate
    if not root:
        return os.path.basename(real)
    return os.path.relpath(real, root).replace(os.sep, "/")


def _global_names(code: Any) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= _global_names(const)
    return names


def _with_needed_imports(text: str, func: Any) -> tuple[str, set[str]]:
    """Add imports for modules the live function uses but the file never imports.

    A repair made at runtime may rely on a module the agent imported into the live module (the
    file never had that import); persisted as is, the next run would fail with a NameError.
    Returns the new text and the names still unresolved (non-module globals).
    """
    import builtins
    import types

    tree = ast.parse(text)
    defined: set[str] = set()
    last_import = 0
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            last_import = node.end_lineno or node.lineno
            defined.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            defined.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            defined.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    live = getattr(func, "__globals__", {})
    missing = {
        name
        for name in _global_names(func.__code__)
        if name in live and name not in defined and not hasattr(builtins, name)
    }
    modules = {n: live[n] for n in missing if isinstance(live[n], types.ModuleType)}
    if not modules:
        return text, missing
    statements = "".join(
        f"import {module.__name__}\n" if module.__name__ == name
        else f"import {module.__name__} as {name}\n"
        for name, module in sorted(modules.items())
    )  # fmt: skip
    if last_import == 0 and tree.body and isinstance(tree.body[0], ast.Expr):
        last_import = tree.body[0].end_lineno or 0  # after the module docstring
    lines = text.splitlines(keepends=True)
    added = "".join(lines[:last_import]) + statements + "".join(lines[last_import:])
    return added, missing - set(modules)


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def _create(stem: str, suffix: str, text: str, mode: int | None = None) -> str:
    """Write ``text`` to a new file ``stem + suffix`` (or ``stem-2 + suffix``...); return its name.

    Exclusive creation: an existing file (a leftover, another writer's, an earlier change of this
    recovery) is never overwritten, and a symlink planted at the name is never written through.
    Not atomic, and need not be: a backup matters only once the source is replaced, which happens
    after this returns with the backup complete and synced.
    """
    for n in itertools.count(1):
        name = f"{stem}{suffix}" if n == 1 else f"{stem}-{n}{suffix}"
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
            fd = os.open(name, flags, 0o666)  # like open(): the umask decides
        except FileExistsError:
            continue
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
                handle.flush()
                if mode is not None:
                    os.chmod(name, mode)
                os.fsync(handle.fileno())
        except BaseException:  # cleanup only: it is re-raised
            with contextlib.suppress(OSError):
                os.unlink(name)
            raise
        return name
    raise AssertionError("unreachable")  # itertools.count never ends


def _replace(path: str, text: str) -> None:
    """Give the file at ``path`` new contents atomically, keeping what makes it that file.

    A crash never leaves a half-written source behind: the text goes to a temporary file that is
    synced, then renamed over the original. The rename would replace a symlink by a regular file,
    so the link is resolved first and its target is replaced (the link keeps pointing at it). The
    temporary file sits in the target's directory (a rename is atomic only within a filesystem),
    has a unique name (two writers or a leftover never collide), takes the original's permission
    bits and, where allowed, owner, and is removed if anything fails.
    """
    real = os.path.realpath(path)
    info = os.stat(real)
    directory, name = os.path.split(real)
    fd, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            if hasattr(os, "chown"):
                # Only root may give a file away; anyone else keeps their own ownership.
                with contextlib.suppress(OSError):
                    os.chown(temporary, info.st_uid, info.st_gid)
            os.chmod(temporary, stat.S_IMODE(info.st_mode))  # after chown, which drops setuid
            os.fsync(handle.fileno())
        os.replace(temporary, real)
    except BaseException:  # cleanup only: it is re-raised
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    _sync_directory(directory)


def _sync_directory(directory: str) -> None:
    # The rename lives in the directory: sync it too, or a crash may bring the old file back.
    if os.name != "posix":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)
