"""The `tfdist-launch` command line (`python -m tfdist.launch`).

    python -m tfdist.launch --workers 2 --ps 1 -- python -u train.py --steps 10
    tfdist-launch --workers 2 --print-tf-config --hosts h0:2222,h1:2222
    tfdist-launch --workers 4 --chief --emit tfjob --image me/train:1 -- \\
        python train.py

A thin command line over `restart.run_local_job`, `hosts.cluster_from_hosts`
and `tfjob.tfjob_manifest`; see `supervisor` for the supervision rules.
Exit statuses: 0 success, 1 a task failed, 2 bad arguments, 124 timeout,
128+N stopped by signal N (130 for Ctrl-C).

This module imports nothing from TensorFlow, so `--help` is instant.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Callable
from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import NoReturn
from typing import TextIO

from tfdist import errors
from tfdist.cluster import spec
from tfdist.launch import hosts as hosts_lib
from tfdist.launch import job
from tfdist.launch import membership
from tfdist.launch import remote
from tfdist.launch import restart
from tfdist.launch import supervisor
from tfdist.launch import tfjob

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

__all__ = ["run_cli"]

_PROG = "tfdist-launch"
_EXIT_USAGE = 2
_USAGE = f"""\
{_PROG} --workers N|MIN:MAX [--ps M] [--chief] [--evaluator]
                     [--restarts K] [--worker-restarts K] [--timeout-s T]
                     [--grace-period-s S] [--no-isolate] [--preload MODULES]
                     [--slots-file PATH] -- COMMAND [ARG ...]
       {_PROG} --workers N|MIN:MAX --hosts-file PATH [--rsh CMD] [--port P]
                     [--env NAMES] [...] -- COMMAND [ARG ...]
       {_PROG} --workers N [...] --print-tf-config --hosts H:P,H:P,... \
[-- COMMAND ...]
       {_PROG} --workers N [...] --emit tfjob [--name NAME] [--image IMAGE]
                     [--restarts K] [--timeout-s T] [--no-network-policy]
                     -- COMMAND [ARG ...]"""
_DESCRIPTION = """\
Runs COMMAND once per task of a TF_CONFIG cluster on this machine (addresses
127.0.0.1:<free port>), each task with its own TF_CONFIG, and prefixes every
output line with the task ("[worker:1] ..."). SIGINT/SIGTERM are forwarded to
every task. Python tasks buffer piped output: use `python -u` to see lines as
they are printed.

multi-worker jobs (no --ps): the job succeeds when every chief/worker task
exits 0; an evaluator still running is then stopped. When a task exits
non-zero the others are stopped and the job fails.

elastic jobs (--workers MIN:MAX, --slots-file or --hosts-file): the job
starts MAX workers (at most the slots file's count) and goes on with fewer
when one is lost, down to MIN (each loss uses one of --restarts; in a
parameter-server job, a worker past its --worker-restarts); a task that
exits 143 (tfdist.elastic saved it at a step after SIGTERM) is relaunched
without using a restart; a change of the slots file's count stops the tasks
at a step (SIGTERM) and relaunches with the new count. Scripts resume with
tfdist.elastic.Elastic.

on several hosts (--hosts-file): each task runs on a host the file lists
(`HOST slots=N` per line, as in MPI and Horovod hostfiles), started through
--rsh (default `ssh -T -o BatchMode=yes`) in this directory, with TF_CONFIG,
PATH, PYTHONPATH, PYTHONUNBUFFERED, VIRTUAL_ENV and the --env names set from
this process; signals are relayed to it over the connection. Every host needs
this Python at the same path with tfdist, and this directory. The k-th task on
a host listens on --port + k. The file is re-read as a slots file is: when the hosts the tasks would run on change, the tasks are
stopped at a step and relaunched there; a host whose worker is lost is left
out until the file drops it.

parameter-server jobs (--ps M, which needs --chief): the chief runs the
training script; worker and ps tasks serve until the job ends. The job
succeeds when the chief exits 0, and the serving tasks are then stopped. A
worker that exits non-zero (or is killed) is restarted alone, with the same
TF_CONFIG and port, up to --worker-restarts times, while the chief carries on.
The chief, a ps task or the evaluator exiting non-zero, or a worker beyond its
restarts, fails the job.

network: TensorFlow's servers listen on every interface (*:PORT), whatever
the address in TF_CONFIG, and let anyone who reaches them run code. So on
Linux all tasks run in one private network namespace, whose only interface is
its own loopback: they reach each other, nothing outside the job reaches them,
and they reach nothing outside it (no downloads, no network file systems).
Where the OS does not allow that, the launcher says so and runs them on the
host's network. --no-isolate does that on purpose: then firewall the ports."""
_EPILOG = f"""\
exit status: 0 success, 1 a task failed, 2 bad arguments, 124 --timeout-s
exceeded, 128+N stopped by signal N (130 for Ctrl-C).

examples:
  {_PROG} --workers 2 -- python -u train.py --epochs 3
  {_PROG} --workers 2:4 --restarts 10 -- python -u train.py
  {_PROG} --workers 2:8 --hosts-file hosts.txt --restarts 10 -- python -u train.py
  {_PROG} --chief --workers 2 --ps 2 --restarts 1 -- python -u train_ps.py
  {_PROG} --workers 2 --chief --print-tf-config \
--hosts 10.0.0.1:2222,10.0.0.2:2222,10.0.0.3:2222
  {_PROG} --workers 4 --emit tfjob --image registry/me/train:1 -- python train.py
"""


class _UsageError(Exception):
    """Bad command line; the message says what and how to fix it."""


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser that raises instead of exiting, and writes to `out`."""

    def __init__(self, out: TextIO) -> None:
        super().__init__(
            prog=_PROG,
            usage=_USAGE,
            description=_DESCRIPTION,
            epilog=_EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        self._out = out

    def print_help(self, file: SupportsWrite[str] | None = None) -> None:
        super().print_help(file if file is not None else self._out)

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        if message:
            self._out.write(message)
        raise _Exit(status)

    def error(self, message: str) -> NoReturn:
        if message.startswith("unrecognized arguments"):
            message += (
                f". Put the command to run after `--`, as in: {_PROG} "
                "--workers 2 -- python train.py"
            )
        elif "required" in message:
            message += ". Pass the number of worker tasks, as in --workers 2"
        raise _UsageError(message)


class _Exit(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


def _count_type(flag: str, minimum: int, example: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value: int | None = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(
                f"expected an integer >= {minimum}, received {flag} "
                f"{text!r}. Pass e.g. {flag} {example}"
            )
        return value

    return parse


def _seconds_type(flag: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value: float | None = float(text)
        except ValueError:
            value = None
        if value is None or not 0 < value < float("inf"):
            raise argparse.ArgumentTypeError(
                f"expected a number of seconds > 0, received {flag} {text!r}. "
                f"Pass e.g. {flag} 600"
            )
        return value

    return parse


def _workers_type(text: str) -> membership.WorkerRange:
    try:
        return membership.WorkerRange.parse(text)
    except errors.LauncherError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def _rsh_type(text: str) -> tuple[str, ...]:
    try:
        argv = tuple(shlex.split(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"cannot split --rsh {text!r}: {e}") from e
    if not argv:
        raise argparse.ArgumentTypeError(
            f"expected a remote shell command, received --rsh {text!r}. Pass "
            "e.g. --rsh 'ssh -T -o BatchMode=yes -p 2200'"
        )
    return argv


def _port_type(text: str) -> int:
    value = _count_type("--port", 1, "2222")(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(
            f"expected a TCP port <= 65535, received --port {text!r}. Pass "
            "e.g. --port 2222"
        )
    return value


def _names_type(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(","))
    if not all(name.isidentifier() for name in names):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated variable names, received --env "
            f"{text!r}. Pass e.g. --env HOME,DATA_DIR"
        )
    return names


def _modules_type(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(","))
    if not all(
        name and all(part.isidentifier() for part in name.split("."))
        for name in names
    ):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated module names, received --preload "
            f"{text!r}. Pass e.g. --preload tensorflow"
        )
    return names


def _build_parser(out: TextIO) -> _Parser:
    parser = _Parser(out)
    tasks = parser.add_argument_group("tasks")
    tasks.add_argument(
        "--workers",
        required=True,
        type=_workers_type,
        metavar="N|MIN:MAX",
        help="worker tasks (>= 1), or the range an elastic job runs in",
    )
    tasks.add_argument(
        "--ps",
        default=0,
        type=_count_type("--ps", 0, "1"),
        metavar="M",
        help="parameter-server tasks (default 0)",
    )
    tasks.add_argument("--chief", action="store_true", help="add a chief task")
    tasks.add_argument(
        "--evaluator", action="store_true", help="add an evaluator task"
    )
    run = parser.add_argument_group("running locally")
    run.add_argument(
        "--restarts",
        type=_count_type("--restarts", 0, "2"),
        metavar="K",
        help="relaunch the whole job on fresh ports after it fails, up to K "
        "times (default 0; with --emit: the TFJob's backoffLimit)",
    )
    run.add_argument(
        "--worker-restarts",
        type=_count_type("--worker-restarts", 0, "3"),
        metavar="K",
        help="parameter-server jobs only: restart a worker task that exits "
        "non-zero, alone and with the same TF_CONFIG and port, up to K times "
        "per worker, before its exit fails the job (default "
        f"{supervisor.DEFAULT_WORKER_RESTARTS}); --restarts then relaunches "
        "the whole job",
    )
    run.add_argument(
        "--timeout-s",
        type=_seconds_type("--timeout-s"),
        metavar="T",
        help="limit on the whole job, restarts included; then every task is "
        "killed and the exit status is 124 (with --emit: the TFJob's "
        "activeDeadlineSeconds)",
    )
    run.add_argument(
        "--grace-period-s",
        type=_seconds_type("--grace-period-s"),
        metavar="S",
        help="seconds a stopped task has to exit before SIGKILL (default "
        f"{supervisor.DEFAULT_GRACE_PERIOD_S:g})",
    )
    run.add_argument(
        "--no-isolate",
        action="store_true",
        help="run the tasks on this host's network, reachable on every "
        "interface, instead of in a private network namespace (for tasks "
        "that need the network: downloads, remote storage)",
    )
    run.add_argument(
        "--slots-file",
        metavar="PATH",
        help="elastic jobs: a file holding the number of worker slots the "
        "job may use now, re-read every "
        f"{membership.POLL_S:g} s; when it changes the tasks are stopped at "
        "a step and the job goes on with min(slots, MAX) workers",
    )
    run.add_argument(
        "--hosts-file",
        metavar="PATH",
        help="run the tasks on the hosts this file lists (HOST slots=N per "
        "line) through --rsh, instead of on this machine; re-read while the "
        "job runs",
    )
    run.add_argument(
        "--rsh",
        type=_rsh_type,
        metavar="CMD",
        help="with --hosts-file: the remote shell that starts a task, run as "
        f"CMD HOST COMMAND (default {shlex.join(remote.DEFAULT_RSH)!r})",
    )
    run.add_argument(
        "--port",
        type=_port_type,
        metavar="P",
        help="with --hosts-file: the first task's port on each host (default "
        f"{hosts_lib.DEFAULT_PORT}; the k-th task on a host listens on P+k)",
    )
    run.add_argument(
        "--env",
        type=_names_type,
        metavar="NAMES",
        help="with --hosts-file: comma-separated variables of this "
        "environment to set in every task too",
    )
    run.add_argument(
        "--preload",
        type=_modules_type,
        metavar="MODULES",
        help="comma-separated modules (e.g. tensorflow) to import once, in "
        "a template process that every `python SCRIPT.py` task is forked "
        "from, instead of each task importing them: a task and a restart "
        "then start in a fraction of a second (default: none; each task is "
        "a fresh interpreter)",
    )
    real = parser.add_argument_group("describing a real cluster")
    real.add_argument(
        "--print-tf-config",
        action="store_true",
        help="print each task's TF_CONFIG for --hosts instead of launching",
    )
    real.add_argument(
        "--hosts",
        metavar="H:P,...",
        help="one host:port per task, in the order chief, workers, ps, "
        "evaluator (with --print-tf-config)",
    )
    real.add_argument(
        "--emit",
        choices=("tfjob",),
        help="print a Kubeflow TFJob manifest instead of launching",
    )
    real.add_argument(
        "--name",
        help=f"TFJob name (with --emit; default {tfjob.DEFAULT_TFJOB_NAME})",
    )
    real.add_argument(
        "--no-network-policy",
        action="store_true",
        help="with --emit: leave out the NetworkPolicy that admits traffic "
        "to the job's pods only from the job's own pods",
    )
    real.add_argument(
        "--image",
        help="container image with TensorFlow, tfdist and the script (with "
        f"--emit; default {tfjob.DEFAULT_TFJOB_IMAGE})",
    )
    return parser


def _check_modes(args: argparse.Namespace, command: Sequence[str]) -> None:
    """Rejects flag combinations that mean nothing; see the messages."""
    if args.print_tf_config and args.emit:
        raise _UsageError(
            "--print-tf-config and --emit tfjob are two different modes; "
            "received both. Pass only one of them (or neither, to launch "
            "locally)."
        )
    if args.hosts is not None and not args.print_tf_config:
        raise _UsageError(
            f"--hosts {args.hosts!r} only applies to --print-tf-config. Add "
            "--print-tf-config, or drop --hosts to launch on 127.0.0.1."
        )
    if args.workers.is_elastic and args.print_tf_config:
        raise _UsageError(
            f"--print-tf-config prints a fixed cluster; received --workers "
            f"{args.workers}. Pass the number of workers, as in --workers "
            f"{args.workers.maximum}."
        )
    if args.slots_file is not None and (args.print_tf_config or args.emit):
        raise _UsageError(
            f"--slots-file {args.slots_file!r} only applies to jobs this "
            "launcher runs; --print-tf-config and --emit tfjob launch "
            "nothing. Drop --slots-file."
        )
    if args.hosts_file is None:
        for flag, value in (
            ("--rsh", args.rsh and shlex.join(args.rsh)),
            ("--port", args.port),
            ("--env", args.env and ",".join(args.env)),
        ):
            if value is not None:
                raise _UsageError(
                    f"{flag} {value} only applies to --hosts-file. Add "
                    f"--hosts-file PATH, or drop {flag}."
                )
    else:
        for flag, value in (
            ("--slots-file", args.slots_file),
            ("--no-isolate", args.no_isolate or None),
            ("--preload", args.preload and ",".join(args.preload)),
            ("--print-tf-config", args.print_tf_config or None),
            ("--emit", args.emit),
        ):
            if value is not None:
                shown = "" if value is True else f" {value}"
                raise _UsageError(
                    f"{flag}{shown} does not go with --hosts-file "
                    f"{args.hosts_file!r}: its slots are the job's count, its "
                    "tasks run on their hosts' networks, each started afresh, "
                    f"and it launches them. Drop {flag}."
                )
    if args.print_tf_config:
        if args.hosts is None:
            raise _UsageError(
                "--print-tf-config needs --hosts, one host:port per task. "
                "Add e.g. --hosts 10.0.0.1:2222,10.0.0.2:2222."
            )
        for flag, value in (
            ("--restarts", args.restarts),
            ("--timeout-s", args.timeout_s),
            ("--grace-period-s", args.grace_period_s),
        ):
            if value is not None:
                raise _UsageError(
                    f"{flag} {value} does not apply to --print-tf-config, "
                    f"which launches nothing. Drop {flag}."
                )
    if args.ps and not args.chief:
        raise _UsageError(
            f"--ps {args.ps} makes this a parameter-server job, whose chief "
            "runs the training script (TensorFlow's ParameterServerStrategy "
            "coordinates from it), but there is no --chief. Add --chief, or "
            "drop --ps for a multi-worker job."
        )
    if args.worker_restarts is not None:
        if not args.ps:
            raise _UsageError(
                f"--worker-restarts {args.worker_restarts} only applies to "
                "parameter-server jobs (--ps M --chief); in a multi-worker "
                "job a failed task fails the job. Use --restarts to relaunch "
                "the whole job, or add --ps."
            )
        if args.print_tf_config or args.emit:
            raise _UsageError(
                f"--worker-restarts {args.worker_restarts} does not apply to "
                "--print-tf-config or --emit tfjob, which launch nothing "
                "(Kubeflow restarts failed pods itself). Drop "
                "--worker-restarts."
            )
    if args.print_tf_config or args.emit:
        mode = "--print-tf-config" if args.print_tf_config else "--emit tfjob"
        for flag, value in (
            ("--no-isolate", args.no_isolate or None),
            ("--preload", args.preload and ",".join(args.preload)),
        ):
            if value is not None:
                shown = "" if value is True else f" {value}"
                raise _UsageError(
                    f"{flag}{shown} does not apply to {mode}, which launches "
                    f"nothing. Drop {flag}."
                )
    if not args.emit:
        for flag, value in (
            ("--name", args.name),
            ("--image", args.image),
            ("--no-network-policy", args.no_network_policy or None),
        ):
            if value is not None:
                shown = "" if value is True else f" {value!r}"
                raise _UsageError(
                    f"{flag}{shown} only applies to --emit tfjob. Add "
                    f"--emit tfjob, or drop {flag}."
                )
    elif args.grace_period_s is not None:
        raise _UsageError(
            f"--grace-period-s {args.grace_period_s:g} does not apply to "
            "--emit tfjob, which launches nothing. Drop --grace-period-s."
        )
    if not command and not args.print_tf_config:
        raise _UsageError(
            "no command to run; expected it after `--`, as in: "
            f"{_PROG} --workers {args.workers} -- python -u train.py"
        )


def _shape(args: argparse.Namespace) -> job.JobShape:
    return job.JobShape(
        args.workers.maximum,
        num_ps=args.ps,
        has_chief=args.chief,
        has_evaluator=args.evaluator,
    )


def _print_tf_configs(
    args: argparse.Namespace, command: Sequence[str], out: TextIO
) -> None:
    hosts = [h.strip() for h in args.hosts.split(",")]
    shape = _shape(args)
    try:
        cluster = hosts_lib.cluster_from_hosts(hosts, shape)
    except errors.LauncherError as e:
        raise _UsageError(f"--hosts {args.hosts!r}: {e}") from e
    for task in cluster.tasks():
        config = spec.ClusterConfig(cluster=cluster, task=task)
        out.write(f"# {task.name} on {cluster.address(task)}\n")
        out.write(f"export TF_CONFIG={shlex.quote(config.to_json())}\n")
        if command:
            out.write(f"{shlex.join(command)}\n")
    out.flush()


def run_cli(
    argv: Sequence[str] | None = None,
    *,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Runs the `tfdist-launch` command line; returns its exit status.

    Blocks until the job ends. In the main thread, SIGINT and SIGTERM are
    forwarded to the tasks while the job runs, and restored afterwards.

    Args:
      argv: The arguments after the program name; `None` means
        `sys.argv[1:]`. Everything after the first `--` is the command.
      stdout: Where task stdout and printed TF_CONFIGs/manifests go; `None`
        means `sys.stdout`.
      stderr: Where task stderr and launcher messages go; `None` means
        `sys.stderr`.

    Returns:
      0 on success, 1 if a task failed, 2 for bad arguments (with a message
      on `stderr`), 124 on timeout, 128+N if stopped by signal N.

    Example:
      >>> run_cli(["--workers", "2", "--", "python", "-c", "print(1)"])
      0
    """
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" in argv:
        split = argv.index("--")
        flags, command = argv[:split], argv[split + 1 :]
    else:
        flags, command = argv, []
    parser = _build_parser(out)
    try:
        args = parser.parse_args(flags)
        _check_modes(args, command)
        if args.print_tf_config:
            _print_tf_configs(args, command, out)
            return 0
        if args.emit:
            out.write(
                tfjob.tfjob_manifest(
                    command,
                    _shape(args),
                    name=args.name or tfjob.DEFAULT_TFJOB_NAME,
                    image=args.image or tfjob.DEFAULT_TFJOB_IMAGE,
                    restarts=args.restarts,
                    timeout_s=args.timeout_s,
                    network_policy=not args.no_network_policy,
                    min_workers=args.workers.minimum,
                )
            )
            out.flush()
            return 0
        env = dict(os.environ)  # The tasks inherit this process's environment.
        result = restart.run_local_job(
            command,
            _shape(args),
            env=env,
            restarts=args.restarts or 0,
            worker_restarts=(
                supervisor.DEFAULT_WORKER_RESTARTS
                if args.worker_restarts is None
                else args.worker_restarts
            ),
            timeout_s=args.timeout_s,
            grace_period_s=(
                args.grace_period_s or supervisor.DEFAULT_GRACE_PERIOD_S
            ),
            isolate=False if args.no_isolate else None,
            forward_signals=True,
            preload=args.preload or (),
            min_workers=args.workers.minimum,
            slots_file=args.slots_file,
            hosts_file=args.hosts_file,
            remote_shell=(
                remote.RemoteShell(args.rsh or remote.DEFAULT_RSH, forward_env=args.env or ())
                if args.hosts_file is not None
                else None
            ),
            port=args.port or hosts_lib.DEFAULT_PORT,
            stdout=out,
            stderr=err,
        )
    except _Exit as e:
        return e.status
    except (_UsageError, errors.ConfigError) as e:
        err.write(f"usage: {_USAGE}\n{_PROG}: error: {e}\n")
        err.flush()
        return _EXIT_USAGE
    err.write(f"{_PROG}: {result.describe()}\n")
    err.flush()
    return result.exit_status
