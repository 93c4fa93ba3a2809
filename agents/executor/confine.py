"""What a run's process is held to from its exec on, set in the child between fork and exec (by the guard for a
``command`` run, by the sandbox's preexec for the fine-tune): resource limits (``setrlimit``), ``no_new_privs``
and a seccomp filter that refuses the creation of namespaces.

The filter is a small classic-BPF program built here (no libseccomp): ``unshare`` and ``clone`` with any
``CLONE_NEW*`` flag and ``setns`` are refused with EPERM (so ``unshare -Ur`` fails: no user namespace, no way to
gain capabilities inside one), ``clone3`` is answered ENOSYS (its flags are behind a pointer a filter cannot read;
libc then falls back to ``clone``, which the filter can check), x32 system calls and a foreign architecture's are
refused; everything else is allowed. ``no_new_privs`` (required to install a filter without privileges) also
means no set-uid program can give the run more than it has. Both are inherited by every process the run starts
and cannot be undone.

Standard library only: the guard (guard.py) runs as ``python -I -S`` and imports this module by path. The
program and its ctypes buffers are made in the parent (``Confinement.prepare``), so the child only makes
system calls.
"""

import ctypes
import ctypes.util
import errno
import os
import platform
import resource
import struct

PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2

# classic BPF
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000

CLONE_NEWTIME = 0x00000080
CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_NEW_ANY = (CLONE_NEWTIME | CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER
                 | CLONE_NEWPID | CLONE_NEWNET)

# (audit arch, {name: number}, x32 bit or 0) per machine; offsets of struct seccomp_data: nr 0, arch 4, args 16 + 8i
ARCHES = {
    "x86_64": (0xC000003E, {"clone": 56, "unshare": 272, "setns": 308, "clone3": 435}, 0x40000000),
    "aarch64": (0xC00000B7, {"clone": 220, "unshare": 97, "setns": 268, "clone3": 435}, 0),
}


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def seccomp_program(machine: str) -> bytes | None:
    """The filter for ``machine`` (``platform.machine()``) as packed ``struct sock_filter``s, or None where this
    module does not know the machine's system call numbers (then no filter is set, and the agent says so)."""
    if machine not in ARCHES:
        return None
    arch, nr, x32 = ARCHES[machine]
    eperm, enosys = RET_ERRNO | errno.EPERM, RET_ERRNO | errno.ENOSYS
    ops = [
        _op(_LD_W_ABS, 4),                                  # 0: arch
        _op(_JEQ_K, arch, 1, 0),                            # 1: ours -> 3
        _op(_RET_K, enosys),                                # 2: a foreign architecture's call
        _op(_LD_W_ABS, 0),                                  # 3: nr
        _op(_JGE_K, x32, 0, 1) if x32 else _op(_JEQ_K, 0xFFFFFFFF, 0, 1),  # 4: x32 -> 5
        _op(_RET_K, enosys),                                # 5
        _op(_JEQ_K, nr["clone3"], 0, 1),                    # 6
        _op(_RET_K, enosys),                                # 7: clone3 -> libc falls back to clone
        _op(_JEQ_K, nr["setns"], 0, 1),                     # 8
        _op(_RET_K, eperm),                                 # 9: setns: never
        _op(_JEQ_K, nr["unshare"], 2, 0),                   # 10: -> 13
        _op(_JEQ_K, nr["clone"], 1, 0),                     # 11: -> 13
        _op(_RET_K, RET_ALLOW),                             # 12
        _op(_LD_W_ABS, 16),                                 # 13: flags (args[0], low 32 bits)
        _op(_JSET_K, CLONE_NEW_ANY, 0, 1),                  # 14: a new namespace -> 15, else 16
        _op(_RET_K, eperm),                                 # 15
        _op(_RET_K, RET_ALLOW),                             # 16
    ]
    return b"".join(ops)


class _Filter(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class Confinement:
    """The confinement of children, prepared once in the parent; ``apply(rlimits)`` in each child, after its uid
    change and before exec. ``rlimits``: ``(resource, value)`` pairs (soft = hard = value)."""

    def __init__(self, seccomp=True):
        self._libc = None
        self._program = None
        self._fprog = None
        code = seccomp_program(platform.machine()) if seccomp else None
        try:
            self._libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        except OSError:
            code = None
        if code is not None:
            self._program = ctypes.create_string_buffer(code, len(code))
            self._fprog = _Filter(len(code) // 8, ctypes.cast(self._program, ctypes.c_void_p))

    @property
    def filters(self):
        return self._fprog is not None

    def apply(self, rlimits=()):
        """Limits, then no_new_privs, then the filter. Raises OSError naming what could not be set."""
        for which, value in rlimits:
            resource.setrlimit(int(which), (int(value), int(value)))
        if self._libc is None:
            return
        if self._libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            err = ctypes.get_errno()
            raise OSError(err, "cannot set no_new_privs: " + os.strerror(err))
        if self._fprog is not None and self._libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER,
                                                         ctypes.byref(self._fprog), 0, 0) != 0:
            err = ctypes.get_errno()
            raise OSError(err, "cannot install the seccomp filter: " + os.strerror(err))


_shared = []


def shared():
    """The agent's one Confinement (made once, in the agent: a forked child only makes system calls)."""
    if not _shared:
        _shared.append(Confinement())
    return _shared[0]
