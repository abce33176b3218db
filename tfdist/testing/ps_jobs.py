"""Parameter-server clusters on this machine: in this process, or as a job of processes.

    config = tfdist.testing.start_local_ps_cluster(num_workers=2, num_ps=2)
    strategy = tfdist.ParameterServerStrategy(config)   # this process is the chief

`start_local_ps_cluster` starts the worker and ps servers inside this
process (TF's in-process servers; each with enough inter-op threads) and
returns the chief's `ClusterConfig`: the quickest way to try or test the
strategy, one process, no TF_CONFIG. The servers live until the process
exits (TF cannot stop an in-process server), so start one cluster per
process. TensorFlow's servers listen on every interface, without
authentication; so first the program restarts itself in a private network
namespace, where they are reachable only from inside this process.

`run_local_ps_job(fn, ...)` runs `fn` as the script of every task of a
real parameter-server job (one process per task, on free 127.0.0.1 ports,
under `tfdist.launch`'s parameter-server rules): `fn` typically builds
`tfdist.ParameterServerStrategy()`, which serves on the worker and ps
tasks, and trains on the chief; the job ends when the chief returns, and
its return value is returned.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tfdist import errors
from tfdist import launch
from tfdist._internal import ps_runtime
from tfdist.cluster import ClusterConfig
from tfdist.cluster import TaskSpec
from tfdist.launch import isolation
from tfdist.parameter_server import roles
from tfdist.testing import local_jobs

__all__ = ["run_local_ps_job", "start_local_ps_cluster"]


def start_local_ps_cluster(
    num_workers: int = 2, num_ps: int = 1, *, isolate: bool | None = None
) -> ClusterConfig:
    """Starts worker and ps servers in this process; returns the chief's config.

    Call it at the start of the program, before work it should not do
    twice: unless this process's network is already private (a task of an
    isolated job), the program first restarts in a private network
    namespace, same pid and arguments, and runs again from its first line
    (its start-up paid twice: a few seconds for a script that imports
    TensorFlow). Then the servers, and anything else the process serves
    (the chief's tf.data service), are reachable only from inside it.

    Args:
      num_workers: Worker tasks, >= 1.
      num_ps: Parameter-server tasks, >= 1.
      isolate: None: restart in a private network where the OS allows it
        and the program can be restarted (not an interactive session),
        else warn once and serve on the host's network; True: restart or
        raise; False: serve on every interface of the host, reachable by
        anyone who can reach it.

    Returns:
      The `ClusterConfig` of the chief (this process), for
      `tfdist.ParameterServerStrategy(config)`.

    Raises:
      TypeError: If a count is not an int, or `isolate` not a bool or None.
      LauncherError: If a count is out of range, no free port is found, or
        `isolate=True` and this process cannot be isolated.

    Example:
      >>> config = start_local_ps_cluster(num_workers=2, num_ps=1)
      >>> strategy = tfdist.ParameterServerStrategy(config)
    """
    import tensorflow as tf  # Servers need TF.

    if num_ps < 1:
        raise errors.LauncherError(
            f"num_ps must be >= 1 for a parameter-server cluster; received "
            f"num_ps={num_ps!r}. Pass num_ps=1 or more."
        )
    shape = launch.JobShape(num_workers, num_ps=num_ps, has_chief=True)
    isolation.restart_in_private_network(
        isolate, what="start_local_ps_cluster", report=_warn_exposed)
    cluster = launch.make_local_cluster(shape)
    for task in shape.tasks():
        if task.task_type == "chief":
            continue
        config = ClusterConfig(cluster=cluster, task=task)
        server = tf.distribute.Server(
            tf.train.ClusterSpec(cluster.to_dict()),
            job_name=task.task_type,
            task_index=task.task_id,
            protocol=config.rpc_layer,
            config=ps_runtime.server_config(roles.inter_op_threads(config)),
            start=True,
        )
        _SERVERS.append(server)
    return ClusterConfig(cluster=cluster, task=TaskSpec("chief", 0))


def _warn_exposed(notice: str) -> None:
    # stacklevel 5: the caller of start_local_ps_cluster (through
    # restart_in_private_network and its once-per-process guard).
    warnings.warn(notice, RuntimeWarning, stacklevel=5)


#: The in-process servers: kept alive for the life of the process.
_SERVERS: list[Any] = []


def run_local_ps_job(
    fn: Callable[..., Any],  # Any: fn's arguments and result are the caller's.
    *,
    num_workers: int = 2,
    num_ps: int = 1,
    timeout_s: float = 120.0,
    args: Sequence[Any] = (),
    env: Mapping[str, str] | None = None,
    isolate: bool | None = None,
    worker_restarts: int = launch.DEFAULT_WORKER_RESTARTS,
    preload: Sequence[str] = local_jobs.PRELOAD,
) -> Any:
    """Runs `fn(*args)` as every task of a local parameter-server job; returns the chief's value.

    Every task (chief, workers, ps) runs `fn`; with `fn` building
    `tfdist.ParameterServerStrategy()`, workers and ps serve and the chief
    trains. The job ends when the chief returns (the other tasks are then
    stopped) or fails; a worker that dies is restarted alone, up to
    `worker_restarts` times (as `tfdist.launch` does). However it ends, no
    task process is left running.

    Args:
      fn: A function defined at the top level of an importable module.
      num_workers: Worker tasks, >= 1.
      num_ps: Parameter-server tasks, >= 1.
      timeout_s: Limit on the whole job, start-up included.
      args: Picklable positional arguments, the same for every task.
      env: Environment variables to set in every task.
      isolate: Private network namespace: None (where the OS allows),
        True (required) or False.
      worker_restarts: How many times each worker may be restarted alone.
      preload: Modules imported once, each task forked from a template
        that has them (as `run_local_cluster`'s `preload`).

    Returns:
      The chief's return value.

    Raises:
      TypeError, LauncherError: As `run_local_cluster`.
      CollectiveError: If the chief raised (its exception is the
        `__cause__`) or a ps task died; `err.task` names the task.
      CollectiveTimeoutError: If the job ran past `timeout_s`.
    """
    if num_ps < 1:
        raise errors.LauncherError(
            f"num_ps must be >= 1 for a parameter-server job; received "
            f"num_ps={num_ps!r}. Use tfdist.testing.run_local_cluster for jobs "
            "without ps tasks."
        )
    (value,) = local_jobs.run_job(
        fn,
        shape=launch.JobShape(num_workers, num_ps=num_ps, has_chief=True),
        kind=launch.JobKind.PARAMETER_SERVER,
        timeout_s=timeout_s,
        args=args,
        env=env,
        isolate=isolate,
        preload=preload,
        worker_restarts=worker_restarts,
    )
    return value
