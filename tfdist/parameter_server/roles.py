"""What each task of a parameter-server job does: the chief trains, the others serve.

TF_CONFIG roles map onto the parameter-server model as follows:

    chief      runs the user's script: builds the model, schedules every
               step on the workers (tf.distribute's "coordinator")
    worker:i   serves: runs the steps the chief schedules on it
    ps:j       serves: holds variables (or shards of them) and applies the
               updates the steps send it
    evaluator  not part of training; the strategy refuses to run there

The same script runs on every task. On a worker or ps task, building the
strategy starts that task's TF server and serves until the process is
stopped (the launcher stops workers and ps once the chief exits 0).

Bounds: the chief waits at most `timeout_s` for every worker and ps task
to accept connections before TF connects to them (TF itself would wait
without bound), and names the ones that did not.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
import time
from typing import Any, NoReturn

from absl import logging

from tfdist import errors
from tfdist.cluster import ClusterConfig
from tfdist.parameter_server import serving_notice
from tfdist.watchdog import startup

__all__ = [
    "SERVING_TASK_TYPES",
    "check_cluster",
    "inter_op_threads",
    "serve",
    "wait_for_tasks",
]

#: Task types whose process serves (never returns from the strategy).
SERVING_TASK_TYPES = ("worker", "ps")

#: How long the chief waits between two checks of the tasks it waits for.
_POLL_INTERVAL_S = 0.25

_LAUNCH_HINT = (
    "Run every task with the same TF_CONFIG cluster, e.g. `python -m "
    "tfdist.launch --chief --workers 2 --ps 1 -- python -u train.py`, or "
    "in one process with `tfdist.testing.start_local_ps_cluster()`."
)


def check_cluster(config: ClusterConfig) -> None:
    """Raises unless `config` is a parameter-server cluster this task can run in.

    Needs one chief, at least one worker and at least one ps task; this
    task must be one of them (not the evaluator).

    Raises:
      ClusterConfigError: If the cluster is missing, or lacks a chief, a
        worker or a ps job (`field` names it). (Several chief tasks are
        refused by `tfdist.cluster` already.)
      ConfigError: If this task is the evaluator.
    """
    if config.cluster is None or config.task is None:
        raise errors.ClusterConfigError(
            "tfdist.ParameterServerStrategy needs a cluster with a chief, "
            "worker and ps tasks; received no cluster (TF_CONFIG is unset or "
            f"has none). {_LAUNCH_HINT}",
            field="cluster",
        )
    cluster = config.cluster
    for job, what in (
        ("chief", "the task that runs the training loop"),
        ("worker", "the tasks that run the steps"),
        ("ps", "the tasks that hold the variables"),
    ):
        if not cluster.addresses(job):
            raise errors.ClusterConfigError(
                f"the cluster has no {job!r} job ({what}); received jobs "
                f"{', '.join(repr(j) for j in cluster.job_names)}. A "
                "parameter-server cluster needs one chief, at least one "
                f"worker and at least one ps task. {_LAUNCH_HINT}",
                field=f"cluster.{job}",
            )
    if config.task.task_type == "evaluator":
        raise errors.ConfigError(
            "tfdist.ParameterServerStrategy does not run on the evaluator; "
            f"received task={config.task.name!r}. Run your evaluation loop "
            "there without building the strategy (e.g. keras.utils."
            "SidecarEvaluator reading the chief's checkpoints), or drop the "
            "evaluator from the cluster."
        )


def inter_op_threads(config: ClusterConfig) -> int:
    """Inter-op threads a serving task needs: one per peer that can wait on it, plus slack.

    A ps task serves every worker and the chief at once; a worker serves
    the chief and waits on the ps tasks. Every blocked RPC holds a thread
    (see `tfdist._internal.ps_runtime.server_config`).
    """
    assert config.cluster is not None
    peers = config.cluster.num_tasks - 1
    return max(os.cpu_count() or 1, peers + 2)


def serve(config: ClusterConfig) -> NoReturn:
    """Starts this worker/ps task's TF server and serves until the process ends.

    Called by the strategy's constructor on worker and ps tasks; never
    returns. SIGTERM (the launcher's stop, or a preemption notice) does not
    end the process at once: it serves on until the chief no longer
    accepts connections (checked every `_POLL_INTERVAL_S`), then exits with
    `errors.PREEMPTED_EXIT_CODE` (143). A chief stopped by the same notice
    (`tfdist.elastic.Elastic`) thus finishes its steps in flight and saves
    from the ps tasks before they go; the launcher's (or Kubernetes')
    grace period bounds the wait. A ps task also posts its notice where the
    chief's `Elastic` polls for it (`serving_notice`): a SIGTERM to that ps
    task alone stops the chief at a step too. A second SIGTERM exits at
    once. SIGINT raises `KeyboardInterrupt` here.

    Raises:
      ClusterConfigError: If this task's address is already in use.
    """
    import tensorflow as tf  # The server needs TF; checks above do not.

    from tfdist._internal import ps_runtime

    assert config.cluster is not None and config.task is not None
    startup.check_own_port(config)
    is_ps = config.task.task_type == "ps"
    if is_ps:  # One a task killed earlier left, before the chief can look.
        serving_notice.clear(config)
    threads = inter_op_threads(config)
    server = tf.distribute.Server(
        tf.train.ClusterSpec(config.cluster.to_dict()),
        job_name=config.task.task_type,
        task_index=config.task.task_id,
        protocol=config.rpc_layer,
        config=ps_runtime.server_config(threads),
        start=True,
    )
    logging.info(
        "tfdist: task %s serves %s at %s (%d inter-op threads) until the job "
        "ends; the chief runs the training loop.",
        config.task.name,
        "variables" if config.task.task_type == "ps" else "steps",
        server.target,
        threads,
    )
    if threading.current_thread() is not threading.main_thread():
        while True:  # Signals reach the main thread only: served until the process ends.
            time.sleep(3600)
    try:
        signal.signal(signal.SIGTERM, _notice)
        _sleep_until_a_handler_raises()
    except _Notice:
        pass
    cleanup = (lambda: serving_notice.clear(config)) if is_ps else (lambda: None)
    signal.signal(signal.SIGTERM, lambda *_: _exit_now(cleanup))
    if is_ps:  # The chief's Elastic polls for it, stops at a step and saves.
        try:
            serving_notice.post(config)
        except OSError as e:
            logging.error(
                "tfdist: task %s could not tell the chief of its notice (%s); the "
                "chief saves only if it gets one too.", config.task.name, e,
            )
    logging.warning(
        "tfdist: task %s received SIGTERM; it serves until the chief has exited, "
        "then exits %d.", config.task.name, errors.PREEMPTED_EXIT_CODE,
    )
    while not startup.unreachable_peers(config, jobs=("chief",)):
        time.sleep(_POLL_INTERVAL_S)
    _exit_now(cleanup)


def _sleep_until_a_handler_raises() -> NoReturn:
    """Blocks the main thread until a Python signal handler raises in it.

    Not `time.sleep` nor `server.join()`: a signal sent to the process lands
    on any thread that does not block it, most often one of TF's; Python's
    C-level handler then only flags it, and a main thread asleep in a
    system call is never woken to run the Python handler (a SIGTERM sat
    unhandled for minutes). The wakeup fd is written by whichever thread
    took the signal, so `select` returns and the handler runs here.
    """
    readable, writable = os.pipe()
    os.set_blocking(writable, False)
    signal.set_wakeup_fd(writable)
    while True:
        select.select([readable], [], [])
        os.read(readable, 512)  # Pending handlers run before the next line.


class _Notice(Exception):
    """SIGTERM reached a serving task (raised by its handler to end the idle sleep)."""


def _notice(signal_number: int, frame: Any) -> NoReturn:
    del signal_number, frame
    raise _Notice


def _exit_now(cleanup: Any) -> NoReturn:
    """Runs `cleanup`, then exits 143 at once: a serving task holds nothing to save or tear down."""
    try:
        cleanup()
    except OSError:
        pass
    logging.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(errors.PREEMPTED_EXIT_CODE)


def wait_for_tasks(config: ClusterConfig, timeout_s: float) -> None:
    """Blocks until every worker and ps task accepts connections, at most `timeout_s`.

    Raises:
      WorkerUnavailableError: Naming the tasks that did not start in time
        (`err.task` is the first).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        missing = startup.unreachable_peers(config, jobs=SERVING_TASK_TYPES)
        if not missing:
            return
        if time.monotonic() >= deadline:
            raise errors.WorkerUnavailableError(
                f"the parameter-server cluster did not start within "
                f"timeout_s={timeout_s:g} s: {', '.join(missing)} did not "
                "accept connections (not started, exited during start-up, or "
                f"unreachable from the chief). {_LAUNCH_HINT} Then check those "
                "tasks' logs, or raise timeout_s.",
                task=missing[0].split(" ")[0],
            )
        time.sleep(_POLL_INTERVAL_S)
