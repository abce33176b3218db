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

A process that starts TensorFlow servers itself (an in-process cluster,
`tfdist.testing.start_local_ps_cluster`) cannot move into a namespace once
TensorFlow runs: its threads would stay outside, and without CAP_SYS_ADMIN
joining a user namespace needs a single-threaded process. So
`restart_in_private_network` re-executes the program, same pid, inside a
fresh namespace, where it runs again from its first line; `network_is_private`
tells the restarted program (or a task of an isolated job) that it is
already inside one. `report_local_exposure` gives the one notice where a
local cluster's servers are on the host's network anyway.

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
    "NOTICE_GIVEN_ENV",
    "PrivateNetwork",
    "exposure_notice",
    "network_is_private",
    "report_local_exposure",
    "restart_in_private_network",
    "should_isolate",
    "unavailable_reason",
]

#: Set (to "1") in the environment of tasks that a launcher runs on the
#: host's network after telling the user (or at the user's request), so
#: the tasks do not repeat the notice.
NOTICE_GIVEN_ENV = "TFDIST_EXPOSURE_NOTICE_GIVEN"
#: Set by `restart_in_private_network` in the program it restarts.
_RESTARTED_ENV = "TFDIST_RESTARTED_IN_PRIVATE_NETWORK"

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


def _check_isolate(isolate: object) -> None:
    if isolate is not None and not isinstance(isolate, bool):
        raise TypeError(
            f"isolate must be True, False or None; received "
            f"isolate={isolate!r} of type {type(isolate).__name__}."
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
    _check_isolate(isolate)
    if isolate is False:
        return False
    reason = unavailable_reason()
    if reason is None:
        return True
    if isolate:
        raise errors.LauncherError(reason)
    report(exposure_notice(reason))
    return False


def network_is_private(pid: int | str = "self") -> bool:
    """Whether process `pid`'s network namespace has no interface but loopback.

    Then a socket listening there, even on every interface (`*:PORT`), is
    reachable only from processes in the same namespace. True in the tasks
    of an isolated job and in a program `restart_in_private_network`
    restarted; False on a host's network and where /proc cannot say (not
    Linux).
    """
    try:
        with open(f"/proc/{pid}/net/dev") as f:
            lines = f.readlines()[2:]  # After the two header lines.
    except OSError:
        return False
    return {line.split(":")[0].strip() for line in lines} == {"lo"}


def _restart_command() -> list[str]:
    """This program's command line, to run it again; LauncherError if it cannot be."""
    if hasattr(sys, "ps1") or sys.flags.interactive or "IPython" in sys.modules:
        raise errors.LauncherError(
            "an interactive session (a Python prompt, IPython or a notebook) "
            "cannot be restarted in a private network namespace"
        )
    argv = list(getattr(sys, "orig_argv", ()))
    if not argv:
        raise errors.LauncherError(
            "this interpreter does not record its command line (sys.orig_argv), "
            "so the program cannot be restarted in a private network namespace"
        )
    return [sys.executable, *argv[1:]]


def restart_in_private_network(
    isolate: bool | None, *, what: str, report: Callable[[str], None]
) -> None:
    """Makes the servers this process starts next reachable only from inside it.

    Call before this process starts any TensorFlow server. Returns at once
    if the process's network is already private (`network_is_private`) or
    `isolate` is False. Otherwise it re-executes the program (same pid,
    arguments, environment and working directory) in a new private network
    namespace and does not return: the program runs again from its first
    line, now inside the namespace, and this call then returns there. So
    call it before work the program should not do twice; what was printed
    stays printed. This costs the program's start-up again (for a script
    that imports TensorFlow, a few seconds).

    Args:
      isolate: True: restart or raise; None: restart where possible, else
        call `report` once with `exposure_notice` and return; False: return.
      what: What starts the servers, for the messages (e.g.
        "start_local_ps_cluster").
      report: Gives the notice to the user.

    Raises:
      LauncherError: If `isolate` is True and the OS does not allow a
        namespace or the program cannot be restarted (an interactive
        session); or if a restarted program is still on the host's network.
      TypeError: If `isolate` is not a bool or None.
    """
    _check_isolate(isolate)
    if isolate is False:
        _reported.add("isolate=False")  # Asked for: no notice later either.
        return
    if network_is_private():
        return
    if os.environ.get(_RESTARTED_ENV):
        raise errors.LauncherError(
            f"{what} restarted this program in a private network namespace, "
            "but its network still has interfaces other than loopback "
            "(/proc/self/net/dev); expected only `lo`. Pass isolate=False to "
            "run on the host's network."
        )
    try:
        command = _restart_command()
        network = PrivateNetwork.create()
    except errors.LauncherError as e:
        reason = f"{what} cannot isolate this process: {e}"
        if isolate:
            raise errors.LauncherError(
                f"{reason}. Run the program under `python -m tfdist.launch`, "
                "or pass isolate=False."
            ) from None
        _report_once(report, exposure_notice(reason + "."))
        return
    wrapped, fds = network.wrap(sys.executable, command)
    for fd in fds:
        os.set_inheritable(fd, True)
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    os.execve(wrapped[0], wrapped, dict(os.environ, **{_RESTARTED_ENV: "1"}))


def report_local_exposure(
    addresses: Sequence[str], *, what: str, report: Callable[[str], None]
) -> None:
    """Gives the exposure notice once if a local cluster's servers are on the host's network.

    A cluster whose every address is on this host (127.0.0.0/8, ::1,
    localhost) could run isolated; if this process's network is not
    private and no launcher already told the user (`NOTICE_GIVEN_ENV`),
    `report` gets `exposure_notice` once per process. Clusters spanning
    hosts must be reachable and get no notice.

    Args:
      addresses: The cluster's `host:port` addresses.
      what: What runs the servers, for the notice.
      report: Gives the notice to the user.
    """
    if os.environ.get(NOTICE_GIVEN_ENV) or network_is_private():
        return
    if not addresses or not all(_is_local(a) for a in addresses):
        return
    _report_once(report, exposure_notice(
        f"{what} runs on a cluster of this host (its addresses are all "
        "loopback) outside a private network namespace: TensorFlow servers "
        "started outside tfdist's launcher (tf.distribute.Server, or "
        "TF_CONFIG set by hand) are not isolated; run the job with "
        "`python -m tfdist.launch` to isolate it."
    ))


def _is_local(address: str) -> bool:
    host = address.rsplit(":", 1)[0].strip("[]")
    return host in ("localhost", "::1") or host.startswith("127.")


_reported: set[str] = set()


def _report_once(report: Callable[[str], None], notice: str) -> None:
    # One notice per process, whichever path found the exposure first.
    if not _reported:
        _reported.add(notice)
        report(notice)
