"""Private network namespaces: nothing outside a local job reaches its tasks.

TensorFlow's gRPC server has no bind-address setting (its `ServerDef`
carries only a port) and no authentication: each task listens on every
interface of the host (`*:PORT`), and whoever reaches the port can run
graphs in the task, so read and write its files. The 127.0.0.1 addresses
in TF_CONFIG do not change that. So `LocalJob` runs all tasks of a job in
one private network namespace, whose only interface is its own loopback:

    with PrivateNetwork.create() as network:     # a fresh namespace, lo up
        argv, fds = network.wrap(program, argv)  # runs argv inside it
        subprocess.Popen(argv, pass_fds=fds, ...)

The tasks reach each other over that loopback at the cluster's 127.0.0.1
addresses, as before; nothing outside the namespace, this host's other
processes included, reaches them; and they reach nothing outside it
either: no downloads, no remote file systems (`--no-isolate` for those).

How (Linux): a helper process (`_netns.py create`, standard library only)
calls unshare(CLONE_NEWNET) or, without CAP_SYS_ADMIN, unshare(CLONE_NEWUSER
| CLONE_NEWNET) mapping only its own uid/gid; it brings `lo` up and waits
while this process opens its /proc/PID/ns/{net,user} files, which keep the
namespaces alive after the helper exits. Every task then starts as
`python -I -S _netns.py enter NET_FD USER_FD PROGRAM -- ARGV`, which
setns()es into them and execs PROGRAM: same pid, same process group, same
pipes, so supervision and signals work unchanged. The namespace goes away
once its last task has exited and `close` has released the descriptors.

Where the OS refuses (not Linux, a container without the capability,
user namespaces disabled), `unavailable_reason` says why, and
`should_isolate` decides what happens then: an error if isolation was
required, else one notice and the host network.

This module imports nothing from TensorFlow.
"""

from __future__ import annotations

import functools
import os
import select
import subprocess
import sys
from collections.abc import Callable
from collections.abc import Sequence

from tfdist import errors
from tfdist.launch import _netns

__all__ = [
    "PrivateNetwork",
    "exposure_notice",
    "should_isolate",
    "unavailable_reason",
]

# The helper script; run by path with `python -I -S` (see _netns.py).
_NETNS_SCRIPT = os.path.abspath(_netns.__file__)
# Bound on the helper's start-up (~40 ms); only a broken system gets near.
_CREATE_TIMEOUT_S = 30.0


class PrivateNetwork:
    """A private network namespace, loopback only, that tasks can run in.

    Create with `PrivateNetwork.create()`; `close()` (or leaving a `with`
    block) releases it. Commands wrapped by `wrap` all run in the same
    namespace, so they reach each other over its loopback.
    """

    def __init__(self, net_fd: int, user_fd: int | None) -> None:
        self._net_fd: int | None = net_fd
        self._user_fd = user_fd

    @classmethod
    def create(cls) -> PrivateNetwork:
        """Creates a namespace with its loopback interface up.

        Raises:
          LauncherError: If the OS does not allow it; the message says why.
        """
        if not sys.platform.startswith("linux"):
            raise errors.LauncherError(
                f"cannot create a private network namespace on "
                f"sys.platform={sys.platform!r}; network namespaces are "
                "Linux-only. Run the job with isolate=False (--no-isolate)."
            )
        helper = subprocess.Popen(
            [sys.executable, "-I", "-S", _NETNS_SCRIPT, "create"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert helper.stdout is not None and helper.stdin is not None
        try:
            ready, _, _ = select.select(
                [helper.stdout], [], [], _CREATE_TIMEOUT_S
            )
            line = helper.stdout.readline().strip() if ready else ""
            if not line.startswith("ready "):
                problem = line.removeprefix("error: ") or (
                    f"no answer in {_CREATE_TIMEOUT_S:g} s"
                )
                raise errors.LauncherError(
                    "cannot create a private network namespace for the job "
                    f"({problem}). Expected "
                    "Linux with CAP_SYS_ADMIN or unprivileged user "
                    "namespaces (a container may need --cap-add SYS_ADMIN, "
                    "or user namespaces enabled); or run the job with "
                    "isolate=False (--no-isolate)."
                )
            kinds = line.split()[1].split("+")
            user_fd = None
            if "user" in kinds:
                user_fd = os.open(
                    f"/proc/{helper.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC
                )
            net_fd = os.open(
                f"/proc/{helper.pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC
            )
            helper.stdin.close()  # The helper may exit now.
            helper.wait()
            return cls(net_fd, user_fd)
        finally:
            if helper.returncode is None:
                helper.kill()
                helper.wait()
            helper.stdout.close()

    def wrap(
        self, program: str, argv: Sequence[str]
    ) -> tuple[list[str], tuple[int, ...]]:
        """Returns a command that runs `program` with `argv` in the namespace.

        Args:
          program: The path of the executable (already looked up).
          argv: Its arguments, `argv[0]` included.

        Returns:
          The command to start, and the file descriptors to pass to it
          (`subprocess.Popen(command, pass_fds=fds)`).

        Raises:
          RuntimeError: If the namespace was closed.
        """
        if self._net_fd is None:
            raise RuntimeError(
                "PrivateNetwork.wrap() was called after close(); create a "
                "new PrivateNetwork."
            )
        user_fd = -1 if self._user_fd is None else self._user_fd
        command = [
            sys.executable,
            "-I",
            "-S",
            _NETNS_SCRIPT,
            "enter",
            str(self._net_fd),
            str(user_fd),
            program,
            "--",
            *argv,
        ]
        fds = (self._net_fd,) if user_fd < 0 else (self._net_fd, user_fd)
        return command, fds

    def descriptors(self) -> tuple[int, ...]:
        """`(net_fd,)` or `(net_fd, user_fd)`: what a process joins (`_netns.join`).

        Raises:
          RuntimeError: If the namespace was closed.
        """
        if self._net_fd is None:
            raise RuntimeError(
                "PrivateNetwork.descriptors() was called after close(); "
                "create a new PrivateNetwork."
            )
        if self._user_fd is None:
            return (self._net_fd,)
        return (self._net_fd, self._user_fd)

    def close(self) -> None:
        """Releases the namespace; processes already in it keep running."""
        for fd in (self._net_fd, self._user_fd):
            if fd is not None:
                os.close(fd)
        self._net_fd = self._user_fd = None

    def __enter__(self) -> PrivateNetwork:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


@functools.cache
def unavailable_reason() -> str | None:
    """Why this process cannot create private networks, or `None` if it can.

    Tries once per process (creating and releasing one namespace, ~40 ms)
    and remembers the answer.
    """
    try:
        PrivateNetwork.create().close()
    except errors.LauncherError as e:
        return str(e)
    return None


def exposure_notice(reason: str) -> str:
    """The one notice given when a job runs unisolated against its will."""
    return (
        f"running the tasks on this host's network, not isolated: {reason} "
        "TensorFlow's servers listen on every interface (*:PORT) without "
        "authentication, so anyone who can reach this host can run code in "
        "the tasks while the job runs; see docs/security.md in tfdist's repository."
    )


def should_isolate(
    isolate: bool | None, *, report: Callable[[str], None]
) -> bool:
    """Decides whether a job runs in a private network namespace.

    Args:
      isolate: True: it must (an error if it cannot); False: it does not;
        None: it does where the OS allows it, else `report` is called once
        with `exposure_notice` and it does not.
      report: Gives the notice to the user.

    Returns:
      Whether to isolate the job.

    Raises:
      LauncherError: If `isolate` is True and the OS does not allow it.
      TypeError: If `isolate` is not a bool or None.
    """
    if isolate is not None and not isinstance(isolate, bool):
        raise TypeError(
            f"isolate must be True, False or None; received "
            f"isolate={isolate!r} of type {type(isolate).__name__}."
        )
    if isolate is False:
        return False
    reason = unavailable_reason()
    if reason is None:
        return True
    if isolate:
        raise errors.LauncherError(reason)
    report(exposure_notice(reason))
    return False
