"""Diagnose mode against an expression that knows the mechanism and calls native code.

``ctypes`` gives an expression native calls that raise no audit event: a function object of the
application's (here ``syscall``, looked up before the failure) or one it builds with
``ctypes.CFUNCTYPE`` from an address (which it can work out by reading libc's file). So the
kernel's filter is what must hold in the snapshot: each test calls the system call itself,
with the arguments that would reach past the copy, and checks from outside that nothing of the
process, its files or other processes changed.
"""

from __future__ import annotations

import ctypes
import gc
import json
import mmap
import os
import platform
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from crashoverride import CrashOverride
from crashoverride.testing import done, inspect_python, script, tool_outputs

pytestmark = [
    pytest.mark.slow,  # every test forks snapshots, several start processes
    pytest.mark.skipif(
        not sys.platform.startswith("linux") or platform.machine() != "x86_64",
        reason="the snapshot's seccomp filter is written for Linux on x86-64",
    ),
]

_LIBC = ctypes.CDLL(None, use_errno=True)
SYSCALL = _LIBC.syscall  # the application's own handle on libc's syscall()
SYSCALL_ADDRESS = ctypes.cast(SYSCALL, ctypes.c_void_p).value

# How the expression gets a native ``syscall(number, ...)`` without an audit event.
CALLERS = {
    "the application's function object": "call = app['syscall']",
    "a function built from an address": (
        "call = ctypes.CFUNCTYPE(ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p,"
        " ctypes.c_void_p, ctypes.c_void_p)(app['syscall_address'])"
    ),
}


def inspect_in_diagnose(app: dict[str, Any], *expressions: str) -> list[str]:
    """What a diagnose recovery's model got back for each expression (``app`` is in scope)."""
    model = script(*[inspect_python(e) for e in expressions], done("Root cause: none."))
    co = CrashOverride(model=model, mode="diagnose")
    with pytest.raises(LookupError):
        with co.handler():
            raise LookupError("diagnose me")
    return tool_outputs(model)


def program(source: str, names: str = "{'app': app}") -> str:
    """An expression running ``source`` (statements seeing ``names``); its ``result``."""
    return f"(exec({source!r}, ns := {names}), ns.get('result'))[1]"


def span(match: str) -> tuple[int, int]:
    """Start and length of this process's mapping whose /proc/self/maps line ends in ``match``."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        if line.endswith(match):
            start, end = (int(edge, 16) for edge in line.split()[0].split("-"))
            return start, end - start
    raise LookupError(match)


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """Memory the process shares: anonymous, a file mapped for writing, one mapped read-only."""
    written, read_only = tmp_path / "written.bin", tmp_path / "read-only.bin"
    for path in (written, read_only):
        path.write_bytes(b"precious".ljust(4096, b"\0"))
    anonymous = mmap.mmap(-1, 7 * 4096)  # an unusual size, to find it in /proc/self/maps
    anonymous.write(b"live")
    with open(written, "r+b") as f1, open(read_only, "r+b") as f2:
        maps = {"written": mmap.mmap(f1.fileno(), 0), "read-only": mmap.mmap(f2.fileno(), 0,
                access=mmap.ACCESS_READ)}  # fmt: skip
    spans = {"written": span(str(written)), "read-only": span(str(read_only))}
    for line in Path("/proc/self/maps").read_text().splitlines():
        start, end = (int(edge, 16) for edge in line.split()[0].split("-"))
        if "/dev/zero" in line and end - start == 7 * 4096:
            spans["anonymous"] = (start, end - start)
    try:
        yield {"spans": spans, "anonymous": anonymous, "files": (written, read_only)}
    finally:
        anonymous.close()
        for m in maps.values():
            m.close()


def test_the_confinement_leaves_no_native_function_in_the_snapshot() -> None:
    # The setup looked up mprotect, prctl and syscall; the expression runs with the collector
    # off, so a function object that outlived the setup would still be found.
    addresses = {
        ctypes.cast(getattr(_LIBC, name), ctypes.c_void_p).value: name
        for name in ("mprotect", "prctl", "syscall")
    }
    # The process's own function objects (this module's among them) are not the setup's.
    known = {id(o) for o in gc.get_objects() if isinstance(o, ctypes._CFuncPtr)}
    app: dict[str, Any] = {"addresses": addresses, "known": known}
    found = program(
        "import ctypes, gc\n"
        "result = sorted(app['addresses'].get(ctypes.cast(o, ctypes.c_void_p).value, '')\n"
        "                for o in gc.get_objects()\n"
        "                if isinstance(o, ctypes._CFuncPtr) and id(o) not in app['known'])\n"
        "result = [name for name in result if name]"
    )
    assert inspect_in_diagnose(app, found) == ["[]"]


@pytest.mark.parametrize("caller", list(CALLERS))
def test_native_code_cannot_make_shared_memory_writable_again(
    shared: dict[str, Any], caller: str
) -> None:
    app = {"syscall": SYSCALL, "syscall_address": SYSCALL_ADDRESS, "spans": shared["spans"]}
    attack = program(
        f"import ctypes\n{CALLERS[caller]}\nresult = []\n"
        "for name, (start, length) in sorted(app['spans'].items()):\n"
        "    for number, extra in ((10, None), (329, ctypes.c_void_p(-1))):  # (pkey_)mprotect\n"
        "        done = call(number, ctypes.c_void_p(start), ctypes.c_void_p(length), 3, extra)\n"
        "        if done == 0:\n"
        "            ctypes.memmove(start, b'PWND', 4)\n"
        "        result.append((name, number, done))"
    )
    output = inspect_in_diagnose(app, attack)[0]
    assert shared["anonymous"][:4] == b"live"
    assert [path.read_bytes()[:8] for path in shared["files"]] == [b"precious"] * 2
    refused = [(name, number, -1) for name in sorted(shared["spans"]) for number in (10, 329)]
    assert output == repr(refused)


# -- a target wider than the snapshot: its process group, its user, other processes ----------

_IN_A_SESSION_OF_ITS_OWN = r"""
import ctypes, json, os, sys
from crashoverride import CrashOverride
from crashoverride.testing import done, inspect_python, script, tool_outputs

syscall = ctypes.CDLL(None, use_errno=True).syscall
def ioprio():
    return syscall(252, 1, 0)  # ioprio_get(IOPRIO_WHO_PROCESS, self)
before = (os.getpriority(os.PRIO_PROCESS, 0), ioprio())
model = script(*[inspect_python(e) for e in json.loads(sys.argv[1])], done("Root cause: none."))
try:
    with CrashOverride(model=model, mode="diagnose").handler():
        raise LookupError("diagnose me")
except LookupError:
    pass
print(json.dumps({"before": before, "after": (os.getpriority(os.PRIO_PROCESS, 0), ioprio()),
                  "outputs": tool_outputs(model)}))
"""


def diagnose_in_own_session(*expressions: str) -> dict[str, Any]:
    """A diagnose recovery in a process that leads its own session and process group.

    What reaches past the snapshot to its process group reaches this process (and nothing of
    the test run); its priorities are reported before and after.
    """
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done_ = subprocess.run(
        [sys.executable, "-c", _IN_A_SESSION_OF_ITS_OWN, json.dumps(expressions)],
        capture_output=True, text=True, env=env, start_new_session=True, timeout=120,
    )  # fmt: skip
    assert done_.returncode == 0, (done_.returncode, done_.stderr[-2000:])
    result: dict[str, Any] = json.loads(done_.stdout.splitlines()[-1])
    return result


def test_the_snapshot_cannot_lower_the_priority_of_its_process_group() -> None:
    # PRIO_PGRP/IOPRIO_WHO_PGRP with 0 mean the caller's group: the process that forked it.
    report = diagnose_in_own_session(
        "os.setpriority(os.PRIO_PGRP, 0, 19)",
        "syscall(251, 2, 0, 3 << 13)",  # ioprio_set(IOPRIO_WHO_PGRP, own group, IDLE)
    )
    assert report["after"] == report["before"]
    assert "Operation not permitted" in report["outputs"][0]
    assert report["outputs"][1] == "-1"


def test_the_snapshot_cannot_send_sigio_to_its_process_group() -> None:
    # An owner for SIGIO set with fcntl(F_SETOWN, -pgid): each write to the pipe then signals
    # the whole group, whose default action for SIGIO is to end the process.
    report = diagnose_in_own_session(
        program(
            "r, w = os.pipe()\n"
            "result = [syscall(72, r, 8, -os.getpgid(0)), syscall(72, r, 4, 0o20000),"
            " os.write(w, b'x')]",
            names="{'syscall': syscall, 'os': os}",
        ),
    )
    assert report["outputs"] == ["[-1, 0, 1]"]  # no owner: the write signals no one


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """Another process, in a process group of its own."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            start_new_session=True)  # fmt: skip
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_the_snapshot_cannot_change_how_another_process_is_scheduled(
    sleeper: subprocess.Popen[bytes],
) -> None:
    # sched_attr: size 48, SCHED_OTHER, no flags, nice 19 (the rest zero).
    attr = (48).to_bytes(4, "little") + bytes(12) + (19).to_bytes(4, "little") + bytes(28)
    app = {"syscall": SYSCALL, "pid": sleeper.pid, "attr": attr}
    outputs = inspect_in_diagnose(
        app,
        "app['syscall'](314, app['pid'], app['attr'], 0)",  # sched_setattr
        "os.setpriority(os.PRIO_PGRP, app['pid'], 19)",
    )
    assert outputs[0] == "-1"
    assert "Operation not permitted" in outputs[1]
    assert os.getpriority(os.PRIO_PROCESS, sleeper.pid) == os.getpriority(os.PRIO_PROCESS, 0)
    assert sleeper.poll() is None


def test_the_snapshot_cannot_set_the_terminal_of_the_process() -> None:
    import fcntl
    import struct
    import termios

    master, slave = os.openpty()
    try:
        fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("4H", 24, 80, 0, 0))
        app = {"syscall": SYSCALL, "path": os.ttyname(slave).encode(),
               "size": struct.pack("4H", 1, 1, 0, 0)}  # fmt: skip
        attack = program(
            "call = app['syscall']\nfd = call(2, app['path'], os.O_RDONLY | os.O_NOCTTY)\n"
            "result = (fd >= 0, call(16, fd, 0x5414, app['size']))",  # ioctl(TIOCSWINSZ)
            names="{'app': app, 'os': os}",
        )
        assert inspect_in_diagnose(app, attack) == ["(True, -1)"]
        size = fcntl.ioctl(master, termios.TIOCGWINSZ, bytes(8))
        assert struct.unpack("4H", size)[:2] == (24, 80)
    finally:
        os.close(master)
        os.close(slave)


IPC_PRIVATE, IPC_CREAT, IPC_RMID, IPC_STAT = 0, 0o1000, 0, 2
# kind: (create(...) -> id, remove(id) system calls, a stat call that fails once it is gone)
SYSV = {
    "shared memory": ((29, IPC_PRIVATE, 4096, IPC_CREAT | 0o600), 31, 31),  # shmget, shmctl
    "semaphore": ((64, IPC_PRIVATE, 1, IPC_CREAT | 0o600), 66, 66),  # semget, semctl
    "message queue": ((68, IPC_PRIVATE, IPC_CREAT | 0o600), 71, 71),  # msgget, msgctl
}


@pytest.mark.parametrize("kind", list(SYSV))
def test_the_snapshot_cannot_remove_system_v_objects_of_the_process(kind: str) -> None:
    create, control, _ = SYSV[kind]
    ident = SYSCALL(*create)
    assert ident >= 0
    buffer = ctypes.create_string_buffer(512)

    def exists() -> bool:
        if kind == "semaphore":  # semctl(id, 0, IPC_STAT, &semid_ds)
            return bool(SYSCALL(control, ident, 0, IPC_STAT, buffer) >= 0)
        return bool(SYSCALL(control, ident, IPC_STAT, buffer) >= 0)

    try:
        app = {"syscall": SYSCALL, "id": ident, "control": control}
        remove = "app['syscall'](app['control'], app['id'], 0, 0)"  # IPC_RMID (semnum 0)
        if kind != "semaphore":
            remove = "app['syscall'](app['control'], app['id'], 0)"
        assert inspect_in_diagnose(app, remove) == ["-1"]
        assert exists()
    finally:
        if kind == "semaphore":
            SYSCALL(control, ident, 0, IPC_RMID)
        else:
            SYSCALL(control, ident, IPC_RMID, None)


def test_the_snapshot_cannot_requeue_the_waiters_of_the_process(shared: dict[str, Any]) -> None:
    # A thread of the process waits on a futex in shared memory (multiprocessing's locks and
    # semaphores do). FUTEX_CMP_REQUEUE from the snapshot would move it onto a futex of the
    # snapshot's own, where no one ever wakes it.
    address = shared["spans"]["anonymous"][0]
    timeout = (ctypes.c_long * 2)(10, 0)
    waiting: list[int] = []

    def waiter() -> None:
        waiting.append(threading.get_native_id())
        SYSCALL(202, ctypes.c_void_p(address), 0, int.from_bytes(b"live", "little"), timeout)

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30  # a bound against hanging, not a figure
    while not waiting or not _in_system_call(waiting[0], 202):
        assert thread.is_alive() and time.monotonic() < deadline
        time.sleep(0.01)
    app = {"syscall": SYSCALL, "address": address, "own": ctypes.create_string_buffer(4)}
    requeue = (  # FUTEX_CMP_REQUEUE: wake none, move up to 1000 onto app['own']
        "app['syscall'](202, ctypes.c_void_p(app['address']), 4, 0, 1000, app['own'],"
        " int.from_bytes(b'live', 'little'))"
    )
    assert inspect_in_diagnose(app, requeue) == ["-1"]
    assert SYSCALL(202, ctypes.c_void_p(address), 1, 1) == 1  # FUTEX_WAKE: still waiting here
    thread.join(15)


def _in_system_call(tid: int, number: int) -> bool:
    try:
        text = Path(f"/proc/self/task/{tid}/syscall").read_text()
    except OSError:
        return False
    return text.split()[0] == str(number)


def test_what_a_snapshot_does_for_itself_still_works() -> None:
    app = {"syscall": SYSCALL}
    outputs = inspect_in_diagnose(
        app,
        "(os.setpriority(os.PRIO_PROCESS, 0, 19), os.getpriority(os.PRIO_PROCESS, 0))",
        "app['syscall'](251, 1, 0, 3 << 13)",  # ioprio_set(IOPRIO_WHO_PROCESS, self, IDLE)
        "__import__('threading').Thread(target=int).start()",
        "len([bytearray(1 << 20) for _ in range(64)])",
        "(os.set_blocking(0, False), os.get_blocking(0), os.isatty(0))",
    )
    assert outputs == ["(None, 19)", "0", "OK (no output, no value)", "64", "(None, False, False)"]
