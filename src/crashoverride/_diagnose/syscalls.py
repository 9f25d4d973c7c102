"""A seccomp filter for a diagnose snapshot: the kernel refuses what reaches past the copy.

The audit hook (``_diagnose.confine``) sees what Python's own functions do, not native code: an
extension writing a file through its C library, ``os.mkfifo``, or an expression calling libc
through any ``ctypes`` function object it can reach (a library's, the application's, or one it
builds with ``ctypes.CFUNCTYPE`` from an address, which raises no audit event). So this filter,
installed in the forked child and never removable by it, is what holds against code that knows
the mechanism: it assumes the child may make any system call with any argument.

The kernel answers ``EPERM`` to calls that change files (opening for writing, creating,
renaming, removing, changing metadata), start processes (``execve``, ``fork``; ``clone`` only
makes threads), reach the network (``socket``, ``connect``, ``sendto``), touch other processes
(signals, ``ptrace``, their memory or file descriptors), take what others wait for (file
locks, leases, System V and POSIX queues, semaphores, shared memory ids) or change the system
(clock, host name, modules, mounts, keys, quotas, I/O ports). Memory shared with the process
is read-only in the child and stays so: ``mprotect`` never adds write access (nor
``pkey_mprotect``), and ``madvise`` cannot poison a shared page.

A call that takes a target is allowed for this process only, never for its process group, its
user or another pid: ``setpriority`` and ``ioprio_set`` (``PRIO_PROCESS`` of itself only), the
``sched_set*`` calls, ``prlimit64``, ``tgkill``, ``setpgid``, ``migrate_pages``, ``move_pages``.
Requests that take an argument too wide for a filter to judge are allowed from a short list:
``ioctl`` (terminal and descriptor queries: no setting a terminal's modes, its foreground group
or an owner for ``SIGIO``), ``fcntl`` (no locks, leases or owners) and ``futex`` (no requeueing
another process's waiters). Any system call newer than this list was reviewed against is
``ENOSYS``.

The system call numbers are x86-64's; on other machines ``install`` does nothing and the audit
hook alone applies.
"""

from __future__ import annotations

import _ctypes
import ctypes
import errno
import os
import platform
import struct
from collections.abc import Iterable
from typing import Any, NamedTuple

_AUDIT_ARCH_X86_64 = 0xC000003E
_X32_BIT = 0x40000000
_ALLOW, _KILL = 0x7FFF0000, 0x80000000
_EPERM, _ENOSYS = 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS
# BPF_LD|W|ABS, BPF_JMP|JEQ|K, JGE, JA, BPF_ALU|AND|K, BPF_RET
_LD, _JEQ, _JGE, _JA, _AND, _RET = 0x20, 0x15, 0x35, 0x05, 0x54, 0x06
_OWN = -1  # stands for this process's pid in a rule
_REVIEWED = 470  # every call numbered below was reviewed (Linux 6.17); newer ones are ENOSYS

# fmt: off
_REFUSED = (
    85, 76, 77, 82, 264, 316, 87, 263, 84, 83, 258, 86, 265, 88, 266, 133, 259,  # file system
    90, 91, 268, 452, 92, 93, 94, 260, 132, 235, 280, 261,  # chmod, chown, times
    188, 189, 190, 197, 198, 199, 463, 466, 469,  # extended and inode attributes
    304,  # open_by_handle_at: opens with any flags, past the open rule
    41, 42, 44, 46, 307, 49,  # socket, connect, sendto, sendmsg, sendmmsg, bind
    59, 322, 57, 58,  # execve, execveat, fork, vfork
    62, 200, 129, 297, 424, 434, 438, 448,  # signals, pidfd_open/getfd, process_mrelease
    101, 311, 440, 298, 323,  # ptrace, process_vm_writev, process_madvise, perf, userfaultfd
    29, 30, 31, 64, 65, 66, 68, 69, 70, 71, 220,  # System V shared memory, semaphores, queues
    240, 241, 242, 243, 244, 245, 73, 456,  # POSIX queues, flock, futex_requeue
    425, 321, 165, 166, 155, 428, 429, 430, 431, 432, 433, 442, 467,  # io_uring, bpf, mounts
    227, 164, 159, 305, 170, 171, 169, 167, 168, 175, 313, 176, 246, 320, 163, 103,  # system
    172, 173, 153, 179, 443, 156, 300, 301,  # I/O ports, vhangup, quotas, sysctl, fanotify
    248, 249, 250,  # keys
)
_UNAVAILABLE = (435, 437)  # clone3, openat2: their flags are out of a filter's reach
_WRITE_FLAGS = 0o1 | 0o2 | 0o100 | 0o1000 | 0o2000  # O_WRONLY O_RDWR O_CREAT O_TRUNC O_APPEND
_CLONE_THREAD, _PROT_WRITE = 0x10000, 0x2
_IOCTLS = (  # queries: TCGETS TIOCGPGRP TIOCOUTQ TIOCGWINSZ FIONREAD FIONBIO TIOCGETD
    0x5401, 0x540F, 0x5411, 0x5413, 0x541B, 0x5421, 0x5424,
    0x5429, 0x802C542A, 0x80045430, 0x5450, 0x5451, 0x5460,  # TIOCGSID TCGETS2 TIOCGPTN FIO*CLEX
)
_FCNTLS = (  # F_DUPFD, F_{GET,SET}FD, F_{GET,SET}FL, F_GETLK, F_GETOWN, F_{SET,GET}SIG,
    0, 1, 2, 3, 4, 5, 9, 10, 11, 16, 17, 36,  # F_GETOWN_EX, F_GETOWNER_UIDS, F_OFD_GETLK,
    1025, 1030, 1031, 1032, 1033, 1034, 1035, 1037,  # F_GETLEASE, F_DUPFD_CLOEXEC, pipes, seals
)
_FUTEX_OPS = (0, 1, 5, 9, 10)  # WAIT, WAKE, WAKE_OP, WAIT_BITSET, WAKE_BITSET
# fmt: on


class _Test(NamedTuple):
    """``args[arg] & mask`` must be one of ``values`` (``only``), or none of them."""

    arg: int
    values: tuple[int, ...]
    only: bool = True
    mask: int = 0xFFFFFFFF


_SELF = _Test(0, (0, _OWN))  # the first argument is this process (0 or its pid)
# A call allowed only when every test passes. Arguments are read as their low 32 bits: each
# tested one is an int, a pid or flags that fit in them.
_RULES: dict[int, tuple[_Test, ...]] = {
    2: (_Test(1, (0,), mask=_WRITE_FLAGS),),  # open: for reading only
    257: (_Test(2, (0,), mask=_WRITE_FLAGS),),  # openat
    56: (_Test(0, (_CLONE_THREAD,), mask=_CLONE_THREAD),),  # clone: a thread, not a process
    10: (_Test(2, (0,), mask=_PROT_WRITE),),  # mprotect: never write access again
    329: (_Test(2, (0,), mask=_PROT_WRITE),),  # pkey_mprotect
    28: (_Test(2, (100, 101), only=False),),  # madvise: no MADV_HWPOISON, MADV_SOFT_OFFLINE
    16: (_Test(1, _IOCTLS),),  # ioctl
    72: (_Test(1, _FCNTLS),),  # fcntl
    202: (_Test(1, _FUTEX_OPS, mask=0x7F),),  # futex, whatever its PRIVATE/CLOCK flags
    157: (_Test(0, (62,), only=False),),  # prctl: no PR_SCHED_CORE (it takes other pids)
    141: (_Test(0, (0,)), _Test(1, (0, _OWN))),  # setpriority(PRIO_PROCESS, self)
    251: (_Test(0, (1,)), _Test(1, (0, _OWN))),  # ioprio_set(IOPRIO_WHO_PROCESS, self)
    # tgkill (``raise()``), setpgid, sched_setparam, sched_setscheduler, sched_setaffinity,
    # sched_setattr, prlimit64, migrate_pages, move_pages
    **dict.fromkeys((234, 109, 142, 144, 203, 314, 302, 256, 279), (_SELF,)),
}


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k & 0xFFFFFFFF)


def _arg(index: int) -> int:
    return 16 + 8 * index  # low 32 bits of ``seccomp_data.args[index]`` (little-endian)


def _test(test: _Test, own_pid: int) -> list[bytes]:
    """Fall through when the test passes; return ``EPERM`` when it fails."""
    values = [own_pid if value == _OWN else value for value in test.values]
    ops = [_op(_LD, _arg(test.arg))]
    if test.mask != 0xFFFFFFFF:
        ops.append(_op(_AND, test.mask))
    last = len(values) - 1
    if test.only:  # a match jumps past the remaining comparisons and the refusal
        ops += [_op(_JEQ, value, last - i + 1) for i, value in enumerate(values)]
        return [*ops, _op(_RET, _EPERM)]
    ops += [_op(_JEQ, value, last - i + 1) for i, value in enumerate(values)]  # to the refusal
    return [*ops, _op(_JA, 1), _op(_RET, _EPERM)]


def _block(number: int, tests: Iterable[_Test], own_pid: int) -> list[bytes]:
    body = [op for test in tests for op in _test(test, own_pid)] + [_op(_RET, _ALLOW)]
    if len(body) > 255:
        raise ValueError(f"the rule for system call {number} is too long for one jump")
    # Each block ends in a return: the accumulator need not hold the number afterwards.
    return [_op(_JEQ, number, 0, len(body)), *body]


def _program(own_pid: int) -> bytes:
    ops = [_op(_LD, 4), _op(_JEQ, _AUDIT_ARCH_X86_64, 1, 0), _op(_RET, _KILL), _op(_LD, 0),
           _op(_JGE, _X32_BIT, 0, 1), _op(_RET, _EPERM),
           _op(_JGE, _REVIEWED, 0, 1), _op(_RET, _ENOSYS)]  # fmt: skip
    for number in _REFUSED:
        ops += [_op(_JEQ, number, 0, 1), _op(_RET, _EPERM)]
    for number in _UNAVAILABLE:
        ops += [_op(_JEQ, number, 0, 1), _op(_RET, _ENOSYS)]
    for number, tests in _RULES.items():
        ops += _block(number, tests, own_pid)
    ops.append(_op(_RET, _ALLOW))
    return b"".join(ops)


def libc_function(name: str, *argtypes: Any) -> Any:
    """The C library's ``name`` (returning a C int), as a ``ctypes`` object nothing else holds.

    Built from the symbol's address, not looked up on a ``CDLL``: a ``CDLL`` caches what it
    looks up, and a function it makes refers to itself, so both outlive their last use and,
    with the child's collector off, stay reachable from the expression (``gc.get_objects()``).
    This one is freed when the caller drops it.
    """
    address = _ctypes.dlsym(ctypes.pythonapi._handle, name)  # the main program's global scope
    return ctypes.CFUNCTYPE(ctypes.c_int, *argtypes, use_errno=True)(address)


class _Program(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))


def install() -> bool:
    """Install the filter in this process for good; False on machines it is not written for.

    Raises ``OSError`` where it should apply but the kernel refuses it: the snapshot is then
    not used at all (``_diagnose.snapshot``), rather than used with less than it promises.
    Nothing it makes outlives it (``libc_function``).
    """
    if platform.machine() not in ("x86_64", "AMD64"):
        return False
    code = _program(os.getpid())
    buffer = ctypes.create_string_buffer(code, len(code))
    program = _Program(len(code) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    ulong = ctypes.c_ulong
    prctl = libc_function("prctl", ctypes.c_int, ulong, ulong, ulong, ulong)
    # PR_SET_NO_NEW_PRIVS (required without CAP_SYS_ADMIN), then seccomp(SET_MODE_FILTER,
    # FILTER_FLAG_TSYNC): for every thread of the child, also one an after-fork handler
    # started, not only the calling one.
    syscall = libc_function("syscall", ctypes.c_long, ulong, ulong, ctypes.c_void_p)
    if prctl(38, 1, 0, 0, 0) != 0 or syscall(317, 1, 1, ctypes.addressof(program)):
        raise OSError(ctypes.get_errno(), "the kernel refused the seccomp filter")
    return True
