"""Runs a Python function on a real multi-process cluster on this machine.

    def all_reduce_ones() -> float:          # top level of an importable module
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        ...
        return float(total)

    results = tfdist.testing.run_local_cluster(all_reduce_ones, num_workers=2)

`run_local_cluster` starts one process per task (the tasks of
`tfdist.launch.make_local_cluster`, so free 127.0.0.1 ports only), each
with its own TF_CONFIG, supervised by `tfdist.launch.LocalJob`: every
output line is prefixed with its task (`[worker:0] ...`), the first task to
fail stops the others, and the timeout kills them all. As with
`tfdist-launch`, the tasks run in a private network namespace of their own
where the OS allows it (~0.15 s more per run), so that nothing outside the
test reaches their servers, which listen on every interface.

Start-up: every task imports TensorFlow (~3 s of CPU). By default that
happens once, in a template process per distinct task environment, from
which each task is forked (`preload`; `tfdist.launch.preload` says what
differs from a fresh interpreter). `preload=()` starts every task as a fresh interpreter.

Each chief/worker process imports `fn` by its module and qualified name
(as `pickle` does), calls `fn(*args)` and pickles the return value back
through a file in a temporary directory. Each ps process starts a
`tf.distribute.Server` for its task and blocks until it is killed once the
chief/worker tasks are done; `fn` does not run there.

Thread limits: unless the caller's `env` (or the parent's environment)
sets them, every task gets `TF_NUM_INTEROP_THREADS` = chief/worker tasks
+ 1 and `TF_NUM_INTRAOP_THREADS` = 1. On a machine with few cores TF sizes
its inter-op pool from the core count; collective ops and parameter-server
RPC handlers each hold an inter-op thread while they wait for their peers,
so with fewer threads than peers + 1 every thread can be blocked waiting
and the cluster deadlocks. One intra-op thread keeps tasks sharing 2 cores
from oversubscribing them. Nothing else is added to the parent's
environment but TF_CONFIG.
"""

from __future__ import annotations

import os
import pickle
import sys
import tempfile
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from tfdist import errors
from tfdist import _validation as validation
from tfdist import launch
from tfdist.testing import _local_task

__all__ = ["run_local_cluster"]

#: Seconds a task stopped by `run_local_cluster` has before SIGKILL; tasks
#: of a test need no clean shutdown.
GRACE_PERIOD_S = 2.0

#: What `run_local_cluster` imports once for all tasks (see its `preload`).
PRELOAD = ("tensorflow",)

# Intra-op threads of every task unless set; see the module docstring.
_INTRAOP_THREADS = "1"


def run_local_cluster(
    fn: Callable[..., Any],  # Any: fn's arguments and result are the caller's.
    *,
    num_workers: int = 2,
    num_ps: int = 0,
    has_chief: bool = False,
    timeout_s: float = 60.0,
    args: Sequence[Any] = (),
    env: Mapping[str, str] | None = None,
    isolate: bool | None = None,
    preload: Sequence[str] = PRELOAD,
) -> tuple[Any, ...]:
    """Runs `fn(*args)` in one process per chief/worker task of a cluster.

    Blocks until every chief/worker task has returned, one has failed, or
    `timeout_s` has passed. However it ends, no task process is left
    running and the temporary directory is removed.

    Args:
      fn: A function defined at the top level of an importable module (or
        of the `__main__` script), so a task can import it by name. It
        typically builds a strategy from TF_CONFIG, such as
        `tf.distribute.MultiWorkerMirroredStrategy()`.
      num_workers: Worker tasks, >= 1.
      num_ps: Parameter-server tasks, >= 0; each runs a
        `tf.distribute.Server` until the others are done.
      has_chief: Whether to add a `chief` task, which runs `fn` too.
      timeout_s: Limit on the whole run, task start-up included (each task
        imports TensorFlow, a few seconds).
      args: Picklable positional arguments, the same for every task.
      env: Environment variables to set in every task, over the parent's
        environment and the thread-limit defaults above.
      isolate: Whether the tasks run in a private network namespace: None
        (where the OS allows it; else a `RuntimeWarning`), True (required)
        or False (the host's network); see `tfdist.launch.LocalJob`.
      preload: Modules every task imports before TF_CONFIG is set, once per
        distinct environment in a template process that each task is
        forked from (`tfdist.launch.LocalJob`'s `preload`), so a task does
        not import them again. `()` starts every task as a fresh
        interpreter.

    Returns:
      The return values of `fn`, one per chief/worker task, in task order:
      the chief (if any), then worker 0, 1, ...

    Raises:
      TypeError: If `fn` cannot be imported by name in another process, or
        `args` cannot be pickled.
      LauncherError: If a count is out of range, or `isolate=True` but
        the OS does not allow it.
      CollectiveError: If a task raised (`err.task` names it; the message
        holds its traceback and `err.__cause__` is its exception when that
        can be unpickled), exited non-zero, or returned a value that cannot
        be pickled.
      CollectiveTimeoutError: If the tasks ran past `timeout_s`; the message
        names the tasks still running, which were killed.

    Example:
      >>> def task_name() -> str:  # At module level.
      ...     return tfdist.cluster.parse_tf_config().task.name
      >>> run_local_cluster(task_name, num_workers=2)
      ('worker:0', 'worker:1')
    """
    return run_job(
        fn,
        shape=launch.JobShape(num_workers, num_ps=num_ps, has_chief=has_chief),
        kind=launch.JobKind.MULTI_WORKER,
        timeout_s=timeout_s,
        args=args,
        env=env,
        isolate=isolate,
        preload=preload,
    )


def run_job(
    fn: Callable[..., Any],
    *,
    shape: launch.JobShape,
    kind: launch.JobKind,
    timeout_s: float,
    args: Sequence[Any],
    env: Mapping[str, str] | None,
    isolate: bool | None,
    preload: Sequence[str],
    worker_restarts: int = launch.DEFAULT_WORKER_RESTARTS,
) -> tuple[Any, ...]:
    """Runs `fn` on the tasks of `shape` under `kind`'s rules; what each ran returned.

    `MULTI_WORKER`: `fn` runs on every chief/worker task (ps tasks run a
    plain server) and every one's value is returned, in task order.
    `PARAMETER_SERVER`: `fn` runs on every task (it serves on workers and
    ps), the job ends when the chief returns, and the chief's value is
    returned (a 1-tuple). Used by `run_local_cluster` and
    `tfdist.testing.run_local_ps_job`, which document the arguments.
    """
    header = _function_header(fn)
    header["serve_ps"] = kind is launch.JobKind.MULTI_WORKER
    timeout_s = validation.check_positive_number("timeout_s", timeout_s)
    if isinstance(args, (str, bytes)) or not isinstance(args, Sequence):
        raise TypeError(
            f"args must be a sequence of fn's positional arguments; received "
            f"args={args!r} of type {type(args).__name__}. Pass a tuple, as "
            "in args=(1, 2)."
        )
    try:
        args_payload = pickle.dumps(tuple(args))
    except Exception as e:  # noqa: BLE001 - pickle raises many types.
        raise TypeError(
            f"args={args!r} cannot be pickled ({e}); expected values a task "
            "process can unpickle. Pass plain values (numbers, str, numpy "
            "arrays), not tensors, locks or open files."
        ) from e
    cluster = launch.make_local_cluster(shape)
    task_env = dict(os.environ)  # The tasks inherit the parent's environment.
    task_env.setdefault("TF_NUM_INTEROP_THREADS", str(cluster.num_workers + 1))
    task_env.setdefault("TF_NUM_INTRAOP_THREADS", _INTRAOP_THREADS)
    task_env.update(env or {})
    with tempfile.TemporaryDirectory(prefix="tfdist-local-cluster-") as tmp:
        call_file = os.path.join(tmp, "call.pkl")
        with open(call_file, "wb") as f:
            pickle.dump(header, f)
            f.write(args_payload)
        task_main = os.path.abspath(_local_task.__file__)
        job = launch.LocalJob(
            cluster,
            lambda task: [sys.executable, task_main, call_file, tmp, task.name],
            env=task_env,
            grace_period_s=GRACE_PERIOD_S,
            kind=kind,
            worker_restarts=worker_restarts,
            isolate=isolate,
            preload=preload,
        )
        result = job.run(timeout_s=timeout_s)
        return _collect(result, tmp, kind)


def _function_header(fn: object) -> dict[str, Any]:
    """What a task needs to import `fn`; raises TypeError if it cannot."""
    if not callable(fn):
        raise TypeError(
            f"fn must be a function; received fn={fn!r} of type "
            f"{type(fn).__name__}."
        )
    module_name = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    fix = (
        "Define it with `def` at the top level of a module (not a lambda, "
        "nested function or bound method), so a task process can import it."
    )
    if not module_name or not qualname or "<" in qualname:
        raise TypeError(
            f"fn={fn!r} cannot be imported by name in another process "
            f"(module={module_name!r}, qualname={qualname!r}). {fix}"
        )
    target: object = sys.modules.get(module_name)
    for part in qualname.split("."):
        target = getattr(target, part, None)
    if target is not fn:
        raise TypeError(
            f"fn={fn!r} is not what {module_name}.{qualname} names in its "
            f"module, so a task would import something else. {fix}"
        )
    main_file = None
    if module_name == "__main__":
        main_file = getattr(sys.modules["__main__"], "__file__", None)
        if main_file is None:
            raise TypeError(
                f"fn={fn!r} is defined in an interactive __main__, which a "
                f"task process cannot import. {fix}"
            )
        main_file = os.path.abspath(main_file)
    return {
        "sys_path": list(sys.path),
        "module": module_name,
        "qualname": qualname,
        "main_file": main_file,
    }


def _read_record(result_dir: str, task_name: str) -> tuple[Any, ...] | None:
    path = _local_task.result_path(result_dir, task_name)
    try:
        with open(path, "rb") as f:
            record = pickle.load(f)
    except FileNotFoundError:
        return None
    except Exception as e:  # noqa: BLE001 - e.g. a class gone from a module.
        return (
            "error",
            type(e).__name__,
            f"unpickling its result: {e}",
            "",
            None,
        )
    return record  # type: ignore[no-any-return]


def _collect(
    result: launch.JobResult, result_dir: str, kind: launch.JobKind
) -> tuple[Any, ...]:
    """Returns the values `run_job` promises, or raises what `result` calls for."""
    if result.outcome is launch.JobOutcome.TIMED_OUT:
        stuck = [
            r.task.name
            for r in result.stopped_tasks
            if r.task.task_type != "ps"
        ] or [r.task.name for r in result.stopped_tasks]
        raise errors.CollectiveTimeoutError(
            f"run_local_cluster ran past timeout_s={result.timeout_s:g} with "
            f"task(s) {', '.join(stuck)} still running; killed every task. "
            "Expected fn to return on every chief/worker task in time: look "
            "for where those tasks block in their output above (prefixed "
            f"[{stuck[0]}]), or raise timeout_s.",
            task=stuck[0] if stuck else None,
        )
    if result.outcome is launch.JobOutcome.SUCCEEDED:
        returning = (
            ("chief",) if kind is launch.JobKind.PARAMETER_SERVER else ("chief", "worker")
        )
        values = []
        for task_result in result.tasks:
            if task_result.task.task_type in returning:
                name = task_result.task.name
                record = _read_record(result_dir, name)
                if record is None or record[0] != "ok":
                    raise _task_error(result, name, record)
                values.append(record[1])
        return tuple(values)
    if result.failed_task is not None:
        name = result.failed_task.name
        raise _task_error(result, name, _read_record(result_dir, name))
    raise errors.CollectiveError(f"run_local_cluster: {result.describe()}")


def _task_error(
    result: launch.JobResult, name: str, record: tuple[Any, ...] | None
) -> errors.CollectiveError:
    """The error for task `name`, chained to its exception if it has one."""
    task_result = result.task_result(name)
    stopped = (
        f" Stopped the other task(s): {', '.join(r.task.name for r in result.stopped_tasks)}."
        if result.stopped_tasks
        else ""
    )
    if record is None or record[0] != "error":
        return errors.CollectiveError(
            f"task {name} {task_result.describe()} without reporting a "
            "result; expected fn to return or raise. It crashed or exited "
            f"first: see its output above, prefixed [{name}].{stopped}",
            task=name,
        )
    _, type_name, message, traceback_text, exception_bytes = record
    error = errors.CollectiveError(
        f"task {name} raised {type_name}: {message}\n"
        f"Expected fn to return on every chief/worker task.{stopped} "
        f"Traceback in task {name}:\n{traceback_text}",
        task=name,
    )
    if exception_bytes is not None:
        try:
            error.__cause__ = pickle.loads(exception_bytes)
        except Exception:  # noqa: BLE001 - e.g. a custom __init__ signature.
            pass
    return error
