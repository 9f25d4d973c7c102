"""Cut a forked snapshot (``_diagnose.snapshot``) off from everything it shares with the process.

Only ever called in the child, right after ``fork``: every step here is irreversible on
purpose, and the parent never runs any of it. The audit hook stops what Python's own functions
do; native code (``ctypes``) raises no event for a call, so the kernel's filter
(``_diagnose.syscalls``) is what holds against it, and the ``ctypes`` functions used here are
freed before the expression runs.
"""

from __future__ import annotations

import ctypes
import os
import sys
from typing import Any

from crashoverride._diagnose import syscalls

# Audit events that reach outside the snapshot (files, network, other processes, raw memory).
_REFUSED = frozenset({
    "os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.chflags",
    "os.lchflags", "os.link", "os.symlink", "os.truncate", "os.utime", "os.setxattr",
    "os.removexattr", "os.system", "os.fork", "os.forkpty", "os.kill", "os.killpg",
    "os.startfile", "shutil.chown", "subprocess.Popen", "pty.spawn", "resource.prlimit",
    "sys.remote_exec",
    # Setting a function's ``__defaults__`` or ``__code__``: keeps this hook as it is.
    "object.__setattr__", "object.__delattr__",
    # Hand-made bytecode (``CodeType(...)``, ``code.replace``) can read and write memory
    # out of bounds: the classic way around checks made in Python.
    "code.__new__",
})  # fmt: skip
_REFUSED_PREFIXES = (
    "socket.", "ctypes.", "os.exec", "os.spawn", "os.posix_spawn", "sqlite3.", "syslog.",
    "fcntl.", "_winapi.", "winreg.", "msvcrt.", "webbrowser.",
)  # fmt: skip
_WRITE_MODE = ("w", "a", "x", "+")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
# What may be opened even for reading: files and directories, and the devices that hand out
# nothing anyone else waits for. Reading a pipe, a FIFO or a terminal takes the data from its
# other reader: ``/proc/<pid>/fd/<n>`` reopens any pipe of the process.
_HARMLESS_DEVICES = frozenset(os.makedev(1, minor) for minor in (3, 5, 8, 9))  # null zero random


def confine(keep: int) -> None:
    """Make shared memory read-only, drop inherited descriptors but ``keep``, add the hook.

    Then the kernel's filter (``_diagnose.syscalls``) and the audit hook: both last until ``_exit``.
    """
    _protect_shared_memory()
    _drop_descriptors(keep)
    syscalls.install()
    sys.addaudithook(_refuse)


def _protect_shared_memory() -> None:
    # A shared mapping is the one piece of memory a fork does not copy. Without write access
    # a store into it faults and the child dies, which the parent reports. Once the filter is
    # in, no ``mprotect`` adds write access back, here or to a shared mapping the process keeps
    # read-only itself (of a file it opened for writing).
    mprotect = syscalls.libc_function("mprotect", ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    prot_read = 1
    with open("/proc/self/maps", encoding="ascii", errors="replace") as maps:
        spans = [line.split(maxsplit=2)[:2] for line in maps]
    for span, perms in spans:
        if perms[1:2] == "w" and perms[3:4] == "s":
            start, end = (int(edge, 16) for edge in span.split("-"))
            if mprotect(start, end - start, prot_read) != 0:
                raise OSError(ctypes.get_errno(), f"cannot make shared memory read-only: {span}")


def _drop_descriptors(keep: int) -> None:
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        if fd != null:
            os.dup2(null, fd)
    # Closing in the child leaves the process's connections and files open and untouched.
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd != keep:
            try:
                os.close(fd)
            except OSError:  # the descriptor ``listdir`` itself used is already gone
                pass


def _refuse(
    event: str,
    args: tuple[Any, ...],
    _refused: frozenset[str] = _REFUSED,
    _prefixes: tuple[str, ...] = _REFUSED_PREFIXES,
    _write_mode: tuple[str, ...] = _WRITE_MODE,
    _write_flags: int = _WRITE_FLAGS,
    _stat: Any = os.stat,
    _oserror: type[Exception] = OSError,
    _devices: frozenset[int] = _HARMLESS_DEVICES,
    _len: Any = len,
    _has: Any = str.__contains__,
    _starts: Any = str.startswith,
    _and: Any = int.__and__,
    _str: type = str,
    _int: type = int,
    _type: type = type,
    _error: type[Exception] = PermissionError,
) -> None:
    # Everything this hook uses is bound here, at definition: an expression may rebind
    # module globals or builtins in the child, but not these defaults (a tuple, which cannot
    # be changed in place, and replacing it raises an audit event this hook refuses; keyword-
    # only defaults would live in a mutable dict) nor the methods of built-in types.
    if _type(event) is not _str:
        return
    refused = event in _refused or _starts(event, _prefixes)
    if event == "open" and _len(args) >= 3:
        path, mode, flags = args[0], args[1], args[2]
        refused = _type(flags) is _int and _and(flags, _write_flags) != 0
        if _type(mode) is _str:
            for letter in _write_mode:
                refused = refused or _has(mode, letter)
        if not refused and _type(path) is not _int:  # a path (str or bytes), not an own fd
            try:
                found = _stat(path)
            except _oserror:
                found = None  # the open fails by itself
            if found is not None:
                kind = _and(found.st_mode, 0o170000)
                refused = not (
                    kind == 0o100000 or kind == 0o040000
                    or (kind == 0o020000 and found.st_rdev in _devices)
                )  # fmt: skip
    elif event == "mmap.__new__" and _len(args) >= 1:
        refused = args[0] != -1  # a file mapping; anonymous memory stays in the copy
    if refused:
        raise _error(f"diagnose mode is read-only: {event} refused")
