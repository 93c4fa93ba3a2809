"""The guard's forked child on its way to becoming a run's command (stdlib only, like guard.py, which runs as
``python -I -S``): born in the run's cgroup where the kernel allows (clone3), then its descriptors, session,
umask, uid, parent-death signal and confinement (confine.py) set, then the exec. A command that cannot start
exits 127 (126: cannot join the cgroup; 137: its guard was gone) with the reason on its stderr.
"""

import os
import signal
import warnings  # noqa: F401 - os.execvpe imports it: in the guard, not in a child that may have dropped to a uid
# that cannot read the standard library

try:  # imported as agents.executor.guard_child (the agent's tests)
    from . import guard_protocol
except ImportError:  # beside guard.py, run as a file: guard.py put this directory on the path
    import guard_protocol

PR_SET_PDEATHSIG = 1


# A child born in its run's cgroup: clone3 with CLONE_INTO_CGROUP (Linux 5.7+). Joining after a fork, by a write to
# cgroup.procs, migrates the process, and a migration waits for an RCU grace period under the kernel's cgroup
# thread-group lock unless another migration has just done so: measured here, 8-13 ms of every run's start when
# runs start about 70 ms apart (0.4 ms back to back), most of an executor's grant -> process time.
CLONE_INTO_CGROUP = 0x200000000
SYS_CLONE3 = 435  # the same number on every architecture (the generic system call table)
_CLONE3: list = []  # the clone3 call once looked up; [None] where libc or the kernel cannot


def fork_into(procs_fd):
    """``os.fork()``, the child born in the cgroup whose ``cgroup.procs`` is ``procs_fd`` where the kernel allows:
    (pid, True); else a plain fork, (pid, False), and the child joins through ``procs_fd`` itself. 0 in the child,
    as ``os.fork``. The guard is one thread, so a child made by clone3 without Python's fork hooks is in the same
    state as one made by ``os.fork``: it only sets its descriptors, session, uid and signals, then execs."""
    clone = _clone3() if procs_fd is not None else None
    dir_fd = cgroup_dir(procs_fd) if clone is not None else None
    if dir_fd is None:
        return os.fork(), False
    try:
        pid, error = clone(dir_fd)
    finally:
        os.close(dir_fd)  # in the child too (it is close-on-exec anyway)
    if pid >= 0:
        return pid, True
    import errno

    if error in (errno.ENOSYS, errno.EPERM):  # no clone3 here (an older kernel, a seccomp filter): fork from now on
        _CLONE3[:] = [None]
    return os.fork(), False  # and any other refusal (a cgroup this kernel will not start a process in) alike


def _clone3():
    """``clone(dir_fd) -> (pid, errno)``: clone3 into the cgroup directory ``dir_fd``; None where libc has no
    ``syscall``. Called through ``ctypes.PyDLL``, which keeps the GIL held across the call as ``os.fork`` does."""
    if not _CLONE3:
        try:
            import ctypes

            syscall = ctypes.PyDLL(None, use_errno=True).syscall
        except (OSError, AttributeError, ImportError):
            _CLONE3.append(None)
            return None
        syscall.restype = ctypes.c_long
        syscall.argtypes = [ctypes.c_long, ctypes.c_void_p, ctypes.c_size_t]

        class CloneArgs(ctypes.Structure):  # struct clone_args, as far as CLONE_INTO_CGROUP (its 88-byte version)
            _fields_ = [(name, ctypes.c_uint64) for name in (
                "flags", "pidfd", "child_tid", "parent_tid", "exit_signal", "stack", "stack_size", "tls", "set_tid",
                "set_tid_size", "cgroup")]

        def clone(dir_fd: int) -> tuple:
            args = CloneArgs(flags=CLONE_INTO_CGROUP, exit_signal=signal.SIGCHLD, cgroup=dir_fd)
            pid = syscall(SYS_CLONE3, ctypes.addressof(args), ctypes.sizeof(args))
            return pid, (ctypes.get_errno() if pid < 0 else 0)
        _CLONE3.append(clone)
    return _CLONE3[0]


def cgroup_dir(procs_fd: int):
    """The directory of the cgroup whose ``cgroup.procs`` is ``procs_fd``, opened; None unless it is certainly that
    one (the directory's ``cgroup.procs`` is the very file of ``procs_fd``)."""
    try:
        path = os.readlink(f"/proc/self/fd/{procs_fd}")
        if os.path.basename(path) != "cgroup.procs":
            return None
        dir_fd = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        found, given = os.stat("cgroup.procs", dir_fd=dir_fd, follow_symlinks=False), os.fstat(procs_fd)
        if (found.st_dev, found.st_ino) == (given.st_dev, given.st_ino):
            return dir_fd
    except OSError:
        pass
    os.close(dir_fd)
    return None


def exec_command(request: dict, fds: list, moves: tuple, cgroup, devnull: int, guard: int) -> None:
    """In the forked child: what the command's process needs before exec, then exec (never returns)."""
    argv = request["argv"]
    code = guard_protocol.CANNOT_START
    try:
        signal.set_wakeup_fd(-1)
        for sig in (*guard_protocol.SIGNALS, signal.SIGCHLD, signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_DFL)  # not the guard's handlers; Python ignores SIGPIPE, a command not
        # No source is overwritten by a move below.
        high = [fd if fd > guard_protocol.REPORT_FD else _above(fd) for fd in fds]
        os.dup2(devnull, 0)
        for target, index in moves:
            os.dup2(high[index], target)  # inheritable: the command keeps these
        os.setsid()
        if cgroup is not None:
            code = guard_protocol.CANNOT_JOIN
            os.write(high[cgroup], b"0")  # into the run's cgroup before the command can fork (closed at exec)
            code = guard_protocol.CANNOT_START
        if request.get("umask", -1) >= 0:
            os.umask(request["umask"])
        if request.get("cwd"):
            os.chdir(request["cwd"])
        if request.get("uid") is not None:
            os.setgroups([])
            os.setgid(request["gid"] if request.get("gid") is not None else request["uid"])
            os.setuid(request["uid"])
        ask_for_signal_on_parent_death(signal.SIGKILL)  # after the uid change, which clears it
        if os.getppid() != guard:  # the guard died before the request took effect
            os._exit(guard_protocol.AGENT_GONE)
        if request.get("confine"):  # limits, no_new_privs, the seccomp filter (confine.py): they bind the exec
            if _confinement is None:
                raise OSError(f"the guard cannot confine commands: {_confine_error}")
            _confinement.apply(request.get("rlimits") or ())
        env = dict(request["env"])
        if request.get("report"):
            env["TETO_REPORT_FD"] = str(guard_protocol.REPORT_FD)
        os.execvpe(argv[0], argv, env)
    except BaseException as exc:  # noqa: BLE001 - whatever it was, the run's stderr says it and the status tells
        what = "cannot join the run's cgroup" if code == guard_protocol.CANNOT_JOIN else f"cannot start {argv[0]!r}"
        try:
            os.write(2, f"guard: {what}: {exc}\n".encode(errors="replace"))
        finally:
            os._exit(code)


def _above(fd: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, guard_protocol.REPORT_FD + 1)


_prctl = None


def ask_for_signal_on_parent_death(signum: int) -> None:
    """``prctl(PR_SET_PDEATHSIG, signum)`` (the libc function looked up once, in the guard, before any fork)."""
    global _prctl
    try:
        if _prctl is None:
            import ctypes

            _prctl = ctypes.CDLL(None, use_errno=True).prctl
        _prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)
    except (OSError, AttributeError):
        pass


_confinement = None  # confine.Confinement, prepared once at start (the children only make system calls)
_confine_error = None


def prepare_confinement() -> None:
    """Import confine.py beside this file (the guard runs as ``python -I -S``: no package, no path of its own) and
    prepare the filter. A guard that cannot refuses every command asking for it: never one run unconfined."""
    global _confinement, _confine_error
    try:
        try:
            from . import confine  # imported as agents.executor.guard_child (tests)
        except ImportError:  # beside guard.py, run as a file: guard.py put this directory on the path
            import confine
        _confinement = confine.Confinement()
    except Exception as exc:  # noqa: BLE001 - said on every command that needed it
        _confine_error = f"{type(exc).__name__}: {exc}"
