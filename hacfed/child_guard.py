"""Runs one child of a hacfed process so that nothing it starts outlives that hacfed process.

    python -P -m hacfed.child_guard PARENT_PID GRACE_S -- PROGRAM [ARGS...]

Why: a `ProcessSupervisor` stops its children when its `with` block ends, but nothing runs in a
process killed with SIGKILL, and Flower's daemons start children of their own (the SuperLink a
SuperExec and a ServerApp, a SuperNode a SuperExec and ClientApps) that may leave their parent's
process group. So `hacfed.procs.start_process` starts every child through this small guard:

- it becomes a child subreaper (Linux `PR_SET_CHILD_SUBREAPER`), so whatever PROGRAM's descendants
  leave behind is re-parented to it, not to init, and stays findable;
- it runs PROGRAM in the guard's process group (which the guard leads), with the guard's stdio;
- once hacfed (PARENT_PID) is gone, however it ended, the guard's parent changes: it sends SIGTERM
  to every descendant, SIGKILL to what is left after GRACE_S, and exits;
- once PROGRAM exits, it does the same to what PROGRAM left behind, then exits as PROGRAM did
  (the same code, or the same signal), so the supervisor sees PROGRAM's exit status.

The guard itself passes no signal on: hacfed stops a child by signalling its whole process group
(`hacfed.proc_table.signal_group`), which reaches PROGRAM directly, and a second SIGTERM would cut
Flower's graceful shutdown short (its handler restores the default one). It imports nothing heavy:
it starts in a few tens of milliseconds.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from types import FrameType

from hacfed.proc_table import ProcId, descendants

PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
POLL_S = 0.2  # how often the guard looks whether its parent is still there
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def guarded_argv(argv: list[str], parent_pid: int, grace_s: float) -> list[str]:
    """The command that runs `argv` under a guard watching `parent_pid`."""
    return [sys.executable, "-P", "-m", "hacfed.child_guard", str(parent_pid), repr(float(grace_s)), "--", *argv]


def become_subreaper() -> None:
    """Orphaned descendants come to this process instead of init (Linux only; elsewhere a no-op)."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


class Guard:
    """The guard's state: PROGRAM's pid and exit status, whether a stop signal reached the group."""

    def __init__(self, parent_pid: int, grace_s: float) -> None:
        self.parent_pid, self.grace_s = parent_pid, grace_s
        self.program: int | None = None
        self.status: int | None = None  # PROGRAM's wait status, once it exited
        self.signalled = False  # a SIGTERM/SIGINT/SIGHUP reached the guard (and so PROGRAM's group)

    def parent_gone(self) -> bool:
        return os.getppid() != self.parent_pid

    def note_signal(self, _signum: int, _frame: FrameType | None) -> None:
        self.signalled = True

    def reap(self) -> None:
        """Collect every exited child (PROGRAM and adopted orphans); remember PROGRAM's status."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.program:
                self.status = status

    def start(self, argv: list[str]) -> None:
        # SIGCHLD is blocked so that `wait_for_change` can wait for it; PROGRAM starts unblocked.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
        self.program = os.posix_spawnp(argv[0], argv, os.environ, setsigmask=())

    def wait_for_change(self) -> None:
        signal.sigtimedwait({signal.SIGCHLD}, POLL_S)

    def end_descendants(self) -> None:
        """SIGTERM to every descendant still running, SIGKILL to what is left after the grace period;
        reap them all. None gets SIGTERM twice: after a stop signal to the guard's process group,
        only the descendants that left the group get one."""
        group = os.getpgrp()
        victims = [v for v in descendants(os.getpid()) if not (self.signalled and _group_of(v.pid) == group)]
        _send(victims, signal.SIGTERM)
        victims = descendants(os.getpid())
        deadline = time.monotonic() + self.grace_s
        while any(v.running() for v in victims) and time.monotonic() < deadline:
            self.reap()
            time.sleep(0.05)
        for victim in victims:
            victim.kill_if_same()
        while any(v.running() for v in victims):
            self.reap()
            time.sleep(0.02)
        self.reap()

    def run(self, argv: list[str]) -> int:
        """Start PROGRAM, watch it and the parent; returns PROGRAM's wait status."""
        if self.parent_gone():
            return 1 << 8  # the parent died before the guard started: start nothing
        for sig in _STOP_SIGNALS:
            signal.signal(sig, self.note_signal)
        try:
            self.start(argv)
        except OSError as exc:
            print(f"hacfed.child_guard: cannot start {argv[0]}: {exc}", file=sys.stderr, flush=True)
            return 127 << 8
        while self.status is None:
            self.reap()
            if self.status is None and self.parent_gone():
                self.end_descendants()
            elif self.status is None:
                self.wait_for_change()
        self.end_descendants()
        return self.status


def _send(victims: list[ProcId], sig: signal.Signals) -> None:
    for victim in victims:
        if victim.running():
            try:
                os.kill(victim.pid, sig)
            except ProcessLookupError:
                pass


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def exit_like(status: int) -> None:
    """End this process the way PROGRAM ended: its exit code, or killed by the same signal."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
        os.kill(os.getpid(), sig)
        time.sleep(1.0)  # the signal is delivered before this returns; never reached
    sys.exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


def main(argv: list[str]) -> None:
    if len(argv) < 4 or argv[2] != "--":
        sys.exit("usage: python -P -m hacfed.child_guard PARENT_PID GRACE_S -- PROGRAM [ARGS...]")
    guard = Guard(int(argv[0]), float(argv[1]))
    become_subreaper()
    exit_like(guard.run(argv[3:]))


if __name__ == "__main__":
    main(sys.argv[1:])
