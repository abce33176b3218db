"""Starting a task on another host through a remote shell (`--hosts-file`).

    shell = RemoteShell()                                  # ssh -T -o BatchMode=yes
    argv = shell.command("10.0.0.2", ["python", "-u", "train.py"],
                         {"TF_CONFIG": "..."}, cwd="/shared/job")
    # ['ssh', '-T', '-o', 'BatchMode=yes', '10.0.0.2', '/usr/bin/python3 -m
    #  tfdist.launch.remote_task --cwd /shared/job --env TF_CONFIG=... -- python -u train.py']

The launcher runs `argv` as a local process, the task's stand-in: the remote
shell runs `tfdist.launch.remote_task` on the host, which starts the command
and relays the signals the launcher writes to the remote shell's standard
input (`encode_signal`); the remote shell's exit status is the
task's (128+N if signal N ended it; ssh's own 255 when the host cannot be
reached, the connection drops or the task died of a signal: the launcher
reads each as a lost task).

What every host must have, as with MPI and Horovod: the same Python
interpreter path as the launcher's (`sys.executable`, or `python`), tfdist
installed for it, the working directory at the same path (a shared file
system) and the remote shell reachable without a password (`BatchMode=yes`
makes ssh fail instead of asking). A task gets the host's login environment
plus its TF_CONFIG and the launcher's values of `FORWARDED_ENV` and of the
names passed to `RemoteShell(forward_env=...)`.

This module imports nothing from TensorFlow.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping
from collections.abc import Sequence

from tfdist import errors

__all__ = ["DEFAULT_RSH", "FORWARDED_ENV", "RemoteShell", "encode_signal"]

#: The remote shell `--rsh` defaults to: no terminal (a hang-up would not
#: relay), and failing at once where a password would be asked.
DEFAULT_RSH = ("ssh", "-T", "-o", "BatchMode=yes")

#: Variables of the launcher's environment every remote task gets (when set).
FORWARDED_ENV = ("PATH", "PYTHONPATH", "PYTHONUNBUFFERED", "VIRTUAL_ENV")


def encode_signal(signal_number: int) -> bytes:
    """The line that asks `remote_task` on the host to send `signal_number` to its task."""
    return f"{int(signal_number)}\n".encode()


class RemoteShell:
    """Builds the local command that runs a task on a host.

    Args:
      rsh: The remote shell and its options; it is run as
        `rsh + [host, shell_command]`, as ssh is.
      python: The interpreter to run `tfdist.launch.remote_task` with on the
        hosts; `None` means this one's path (`sys.executable`).
      cwd: The directory the task runs in on the host; `None` means the
        launcher's.
      forward_env: Names of more variables of the launcher's environment to
        give every task.

    Raises:
      LauncherError: If `rsh` is empty or a name in `forward_env` is not a
        variable name.
    """

    def __init__(
        self,
        rsh: Sequence[str] = DEFAULT_RSH,
        *,
        python: str | None = None,
        cwd: str | None = None,
        forward_env: Sequence[str] = (),
    ) -> None:
        if isinstance(rsh, str) or not rsh or not all(isinstance(a, str) and a for a in rsh):
            raise errors.LauncherError(
                f"rsh must be a non-empty sequence of arguments; received "
                f"rsh={rsh!r}. Pass e.g. --rsh 'ssh -T -o BatchMode=yes'."
            )
        bad = [n for n in forward_env if not (isinstance(n, str) and n.isidentifier())]
        if bad:
            raise errors.LauncherError(
                f"--env takes variable names; received {', '.join(map(repr, bad))}. "
                "Pass e.g. --env HOME,DATA_DIR (the values are the launcher's)."
            )
        self.rsh = tuple(rsh)
        self.python = python or sys.executable or "python"
        self._cwd = cwd
        self.forward_env = tuple(dict.fromkeys((*FORWARDED_ENV, *forward_env)))

    def command(
        self, host: str, command: Sequence[str], env: Mapping[str, str], *, cwd: str
    ) -> list[str]:
        """The local argv that runs `command` on `host`.

        Args:
          host: Where the task runs.
          command: The task's program and arguments.
          env: The launcher's view of the task's environment (its TF_CONFIG
            included): `TF_CONFIG`, the `TFDIST_` variables and the forwarded
            names are passed on, nothing else.
          cwd: The launcher's working directory (used unless the shell was
            given one).
        """
        passed = {
            name: value
            for name, value in env.items()
            if name == "TF_CONFIG" or name.startswith("TFDIST_") or name in self.forward_env
        }
        remote = [self.python, "-m", "tfdist.launch.remote_task", "--cwd", self._cwd or cwd]
        for name, value in sorted(passed.items()):
            remote += ["--env", f"{name}={value}"]
        remote += ["--", *command]
        return [*self.rsh, host, shlex.join(remote)]
