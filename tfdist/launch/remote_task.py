"""The host end of a task started through a remote shell (`--hosts-file`).

    ssh HOST 'python -m tfdist.launch.remote_task --cwd DIR --env TF_CONFIG=... -- python -u train.py'

`tfdist-launch` runs that (`remote.RemoteShell` builds it) for each task on
another host. On the host this module starts the command in `DIR`, with the
host's environment plus each `--env NAME=VALUE`, in its own process group,
and then relays what the launcher writes to its standard input, which the
remote shell carries from the launcher's end of the connection:

- a line holding a signal number (`remote.encode_signal`): that signal to the
  command's process group, as `os.killpg` does for a local task;
- the end of its input (the launcher killed the remote shell, or the
  connection or the launcher is gone): SIGKILL to the group, so no task
  outlives the launcher that supervises it.

It exits with the command's status; a command ended by signal N ends it by
signal N too (the remote shell reports that as ssh does, 255, and the
launcher reads the worker as lost), so a task killed by SIGTERM is not
taken for one that saved and exited 143. SIGTERM, SIGHUP or SIGINT sent to
this process itself (a tty's hang-up, someone on the host) kill the
command's group first, and on Linux the command dies with this process
whatever kills it (`PR_SET_PDEATHSIG`). The command's output goes straight to the
remote shell's. It imports nothing beyond Python's standard library, and
nothing of tfdist imports it (`python -m` runs it as `__main__`).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence

__all__ = ["main"]


def _relay(fd: int, group: int) -> None:
    """Sends each signal read from `fd` to `group`; SIGKILL at its end (or a read error)."""
    pending = b""
    try:
        while chunk := os.read(fd, 4096):
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                try:
                    signal_number = int(line)
                except ValueError:
                    continue
                try:
                    os.killpg(group, signal_number)
                except OSError:  # Gone already, or not a signal.
                    pass
    finally:
        _kill_group(group)


def _die_with_parent() -> None:
    """In the task, before exec: on Linux, SIGKILL when this host end dies, however it dies."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # Not Linux: the relay's kill at the end of input still holds.


def _kill_group(group: int) -> None:
    try:
        os.killpg(group, signal.SIGKILL)
    except OSError:
        pass


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the task; returns its exit status (-N if signal N ended it).

    Args:
      argv: `--cwd DIR [--env NAME=VALUE ...] -- COMMAND [ARG ...]`; `None`
        means `sys.argv[1:]`.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        sys.stderr.write("tfdist.launch.remote_task: no command after `--`\n")
        return 2
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="python -m tfdist.launch.remote_task")
    parser.add_argument("--cwd", required=True)
    parser.add_argument("--env", action="append", default=[])
    args = parser.parse_args(argv[:split])
    command = argv[split + 1 :]
    env = dict(os.environ)
    for pair in args.env:
        name, _, value = pair.partition("=")
        env[name] = value
    try:
        child = subprocess.Popen(
            command,
            cwd=args.cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent,  # No thread runs yet.
        )
    except OSError as e:
        sys.stderr.write(
            f"tfdist.launch.remote_task: cannot start {command[0]!r} in "
            f"{args.cwd!r} on {os.uname().nodename}: {e.strerror or e}\n"
        )
        return 127
    handled = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
    for signal_number in handled:
        signal.signal(signal_number, lambda number, frame: _die(child.pid, number))
    # The relay thread blocks them (a thread inherits its creator's mask): a
    # signal landing there would only be flagged, while the main thread
    # waits in waitpid and never runs the handler.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, handled)
    threading.Thread(target=_relay, args=(0, child.pid), daemon=True).start()
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    code = child.wait()
    _kill_group(child.pid)  # What the task left in its group (it would hold the output open).
    return code


def _die(group: int, signal_number: int) -> None:
    """This process got `signal_number`: the task's group is killed, then this process dies of it."""
    _kill_group(group)
    _exit_as(-signal_number)


def _exit_as(code: int) -> None:
    """Exits with `code`, or dies of signal -`code` (the status the task itself had)."""
    sys.stdout.flush()
    sys.stderr.flush()
    if code < 0:
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # Those have no handler to reset.
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    _exit_as(main())  # Not `sys.exit`: the relay thread may be reading.
