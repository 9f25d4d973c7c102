"""A seccomp filter for a diagnose snapshot: the kernel refuses what no audit event reports.

PEP 578 audit events cover what Python's own functions do, not what C code does directly: an
extension writing a file through its C library, ``os.mkfifo``, ``signal.pidfd_send_signal``.
This filter, installed in the forked child (``_diagnose.confine``) and never removable by it, makes
the kernel answer ``EPERM`` to system calls that change files, start or signal other processes, or
talk to the network: opening for writing, creating, renaming, removing and changing files,
``socket``/``connect``/``sendto``, ``execve``, ``fork`` (``clone`` without ``CLONE_THREAD``),
signals to another process, ``ptrace`` and writes into other processes' memory, changing another
process's priority, CPU affinity or limits, taking file locks or messages others wait for, typing
into a terminal, and system settings (clock, host name, modules, mounts, keys).

The system call numbers are x86-64's; on other machines ``install`` does nothing and the audit
hook alone applies.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct

_AUDIT_ARCH_X86_64 = 0xC000003E
_X32_BIT = 0x40000000
_ALLOW, _KILL = 0x7FFF0000, 0x80000000
_EPERM, _ENOSYS = 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS
_LD, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|.., BPF_RET
_WRITE_FLAGS = 0o1 | 0o2 | 0o100 | 0o1000 | 0o2000  # O_WRONLY O_RDWR O_CREAT O_TRUNC O_APPEND
_CLONE_THREAD = 0x10000

# fmt: off
_REFUSED = (
    85, 76, 77, 82, 264, 316, 87, 263, 84, 83, 258, 86, 265, 88, 266, 133, 259,  # file system
    90, 91, 268, 92, 93, 94, 260, 132, 235, 280, 261, 188, 189, 190, 197, 198, 199,  # metadata
    41, 42, 44, 46, 307, 49,  # socket, connect, sendto, sendmsg, sendmmsg, bind
    59, 322, 57, 58,  # execve, execveat, fork, vfork
    62, 200, 129, 297, 424, 434,  # kill, tkill, sigqueueinfo x2, pidfd_send_signal, pidfd_open
    101, 311, 440,  # ptrace, process_vm_writev, process_madvise
    30, 69, 65, 220, 425, 321, 165, 166,  # shmat, msgsnd, semop x2, io_uring, bpf, (u)mount
    227, 164, 159, 305, 170, 171, 169, 167, 168, 175, 313, 176, 246, 320, 163, 103,  # the system
    73, 70, 240, 241, 248, 249, 250,  # flock, msgrcv, mq_open/unlink, keys: others' state
)
_UNAVAILABLE = (435, 437)  # clone3, openat2: their flags are out of a filter's reach
# (syscall, argument index, flags that refuse it when set) and (syscall, argument, allowed when set)
_REFUSED_WITH = ((2, 1, _WRITE_FLAGS), (257, 2, _WRITE_FLAGS))  # open, openat
_ALLOWED_WITH = ((56, 0, _CLONE_THREAD),)  # clone: a thread, not a process
_REFUSED_EQUAL = ((16, 1, 0x5412),)  # ioctl(TIOCSTI): typing into a terminal
# (syscall, argument): allowed only for this process (0 or its pid): tgkill (``raise()``),
# setpriority, sched_setscheduler, sched_setaffinity, ioprio_set, prlimit64.
_THIS_PROCESS_ONLY = ((234, 0), (141, 1), (144, 0), (203, 0), (251, 1), (302, 0))
# fmt: on


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def _arg(index: int) -> int:
    return 16 + 8 * index  # low 32 bits of ``seccomp_data.args[index]`` (little-endian)


def _program(own_pid: int) -> bytes:
    ops = [_op(_LD, 4), _op(_JEQ, _AUDIT_ARCH_X86_64, 1, 0), _op(_RET, _KILL), _op(_LD, 0),
           _op(_JGE, _X32_BIT, 0, 1), _op(_RET, _EPERM)]  # fmt: skip
    for number in _REFUSED:
        ops += [_op(_JEQ, number, 0, 1), _op(_RET, _EPERM)]
    for number in _UNAVAILABLE:
        ops += [_op(_JEQ, number, 0, 1), _op(_RET, _ENOSYS)]
    # Each block below ends in a return: the accumulator need not hold the number afterwards.
    for number, index, flags in _REFUSED_WITH:
        ops += [_op(_JEQ, number, 0, 4), _op(_LD, _arg(index)), _op(_JSET, flags, 0, 1),
                _op(_RET, _EPERM), _op(_RET, _ALLOW)]  # fmt: skip
    for number, index, flags in _ALLOWED_WITH:
        ops += [_op(_JEQ, number, 0, 4), _op(_LD, _arg(index)), _op(_JSET, flags, 0, 1),
                _op(_RET, _ALLOW), _op(_RET, _EPERM)]  # fmt: skip
    for number, index, value in _REFUSED_EQUAL:
        ops += [_op(_JEQ, number, 0, 4), _op(_LD, _arg(index)), _op(_JEQ, value, 0, 1),
                _op(_RET, _EPERM), _op(_RET, _ALLOW)]  # fmt: skip
    for number, index in _THIS_PROCESS_ONLY:
        ops += [_op(_JEQ, number, 0, 5), _op(_LD, _arg(index)), _op(_JEQ, 0, 2, 0),
                _op(_JEQ, own_pid, 1, 0), _op(_RET, _EPERM), _op(_RET, _ALLOW)]  # fmt: skip
    ops.append(_op(_RET, _ALLOW))
    return b"".join(ops)


class _Program(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))


def install() -> bool:
    """Install the filter in this process for good; False on machines it is not written for.

    Raises ``OSError`` where it should apply but the kernel refuses it: the snapshot is then
    not used at all (``_diagnose.snapshot``), rather than used with less than it promises.
    """
    if platform.machine() not in ("x86_64", "AMD64"):
        return False
    code = _program(os.getpid())
    buffer = ctypes.create_string_buffer(code, len(code))
    program = _Program(len(code) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                           ctypes.c_ulong)  # fmt: skip
    # PR_SET_NO_NEW_PRIVS (required without CAP_SYS_ADMIN), then seccomp(SET_MODE_FILTER,
    # FILTER_FLAG_TSYNC): for every thread of the child, also one an after-fork handler
    # started, not only the calling one.
    libc.syscall.argtypes = (ctypes.c_long, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_void_p)
    if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.syscall(317, 1, 1, ctypes.addressof(program)):
        raise OSError(ctypes.get_errno(), "the kernel refused the seccomp filter")
    return True
