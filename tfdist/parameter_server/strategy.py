"""`tfdist.ParameterServerStrategy`: parameter-server training behind Keras `fit`.

A `tf.distribute.ParameterServerStrategy` (so Keras and TF recognise it)
that Keras 3 and tf-keras can train with their unchanged `fit`,
`evaluate` and `predict`:

- roles from TF_CONFIG: the chief runs the script and returns the
  strategy; on a worker or ps task the constructor serves until the
  process is stopped (`tfdist/parameter_server/roles.py`);
- Keras's step functions are replaced, per model, by tfdist's
  (`tfdist/parameter_server/keras_loop.py`): the chief reads the dataset
  and schedules each step, with its batch, on a worker
  (`tfdist/parameter_server/scheduler.py`), every wait bounded;
- Keras 3's non-atomic counters (metric totals, `optimizer.iterations`)
  become atomic on the models it trains.

Why not TF's own path: Keras 3 has no ClusterCoordinator code (its `fit`
fails with "you need to pass this dataset to
ClusterCoordinator.create_per_worker_dataset"), and tf-keras's needs
`repeat()`, `steps_per_epoch` and enough inter-op threads on every worker.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import tensorflow as tf

from tfdist import errors
from tfdist._internal import keras_compat
from tfdist._internal import keras_ps
from tfdist._internal import keras_sharded
from tfdist._internal import ps_runtime
from tfdist import _validation as validation
from tfdist.cluster import ClusterConfig
from tfdist.cluster import resolver as resolver_lib
from tfdist.cluster import to_cluster_resolver
from tfdist.launch import ports
from tfdist.parameter_server import async_runner
from tfdist.parameter_server import extended as extended_lib
from tfdist.parameter_server import keras_loop
from tfdist.parameter_server import partitioning
from tfdist.parameter_server import roles
from tfdist.parameter_server import scheduler as scheduler_lib
from tfdist.parameter_server import service_input
from tfdist.parameter_server import sync_runner
from tfdist.parameter_server import update_gate
from tfdist.watchdog import peer_watchdog
from tfdist.watchdog import startup

__all__ = ["DEFAULT_TIMEOUT_S", "MODES", "ParameterServerStrategy"]

#: Default bound on start-up and on one step, in seconds.
DEFAULT_TIMEOUT_S = peer_watchdog.DEFAULT_TIMEOUT_S
#: The synchronisation modes.
MODES = ("async", "sync")
#: Steps in flight per worker (queued or running) before `fit` waits.
_IN_FLIGHT_PER_WORKER = 2


def _check_max_staleness(mode: str, max_staleness: object) -> int | None:
    if max_staleness is None:
        return None
    value = validation.check_int("max_staleness", max_staleness)
    if value < 0:
        raise errors.ConfigError(
            f"max_staleness must be >= 0 (the most versions an update may be "
            f"behind); received max_staleness={value!r}. Pass 0 for updates "
            "always applied to the parameters they were computed from, k > 0 "
            "to allow k intervening updates, or None for plain asynchronous "
            "training."
        )
    if mode != "async":
        raise errors.ConfigError(
            f"max_staleness={value!r} applies to asynchronous training; "
            f"received mode={mode!r}, whose updates are never stale. Drop "
            "max_staleness, or use mode='async'."
        )
    return value


def _check_mode(mode: object) -> str:
    if mode not in MODES:
        raise errors.ConfigError(
            f"mode={mode!r} is not a synchronisation mode; expected 'async' "
            "(each worker's update applied as it arrives; with max_staleness=k "
            "for bounded staleness) or 'sync' (all workers' gradients of a "
            "step summed and applied once, as one device with the same "
            "global batch)."
        )
    return str(mode)


class ParameterServerStrategy(tf.distribute.ParameterServerStrategy):
    """Parameter-server training of a Keras model, through its unchanged `fit`.

    The same script runs on every task of a TF_CONFIG cluster with one
    chief, workers and ps tasks. On the chief, the constructor connects to
    the cluster and returns; variables created in `scope()` live on the ps
    tasks; `model.fit`/`evaluate`/`predict` (Keras 3 or tf-keras) run
    their steps on the workers. On a worker or ps task, the constructor
    starts that task's server and never returns (the process serves until
    it is stopped; `python -m tfdist.launch` stops it after the chief exits
    0).

    Contract: construction on the chief blocks until every worker and ps
    task accepts connections, at most `timeout_s` (else
    `WorkerUnavailableError` naming the missing tasks). During `fit`,
    every wait of the chief is bounded: a lost ps raises
    `WorkerUnavailableError` naming it within a few seconds, a step
    running longer than `timeout_s` raises `CollectiveTimeoutError` naming
    its worker. A worker that fails mid-step has its step run again by
    another worker with the same batch, and is waited for until it
    restarts. After an error, build no more steps with this strategy:
    restart the job (BackupAndRestore resumes it).

    Input: Keras's `fit` gets the dataset as on one device; the chief reads
    it and sends each batch with the step that trains on it, so every
    batch is trained on once per epoch, in `async` mode too. With
    `input_service`, the workers read it from a tf.data service instead
    (once per epoch without faults; at most once when a worker dies).

    Args:
      cluster: A `tfdist.cluster.ClusterConfig`, a TF_CONFIG JSON string or
        dict, a TF `ClusterResolver` (TF's first argument), or `None` to
        read the `TF_CONFIG` environment variable.
      cluster_resolver: TF's keyword for `cluster`.
      mode: "async" (default: each worker's update is applied when it
        arrives) or "sync" (each batch `fit` reads is split over the
        workers, their gradients summed and applied once: the update of
        one device with the same global batch, up to float rounding, for
        layers that do not use batch statistics or randomness; see
        `tfdist/parameter_server/sync_runner.py`).
      max_staleness: With `mode="async"`, an int k >= 0: no update is
        applied to parameters more than k steps newer than those its
        gradient was computed from (fewer steps run at once: at most
        floor(k / (2 * steps_per_execution)) + 1 functions in flight; 0
        runs one step at a time). `None`: unbounded.
        `largest_staleness_seen` reports the bound measured.
      variable_partitioner: How variables are split over the ps tasks.
        None (default): tfdist's, by bytes: a variable of more than 1 MiB
        is split by rows into min(num_ps, ceil(bytes / 1 MiB)) shards of
        equal rows (`parameter_server/partitioning.py`); smaller ones stay
        whole, round robin. "whole": no variable is split (TF's default). Or a TF
        partitioner (`tf.distribute.experimental.partitioners`). Split
        variables train under Keras 3 and tf-keras: an `Embedding` table
        looks up, and with a sparse update rule such as SGD updates, only
        the rows of each shard a step uses; optimizer slots split like
        their variable.
      timeout_s: Bound on start-up and on one step, seconds (> 0);
        default `DEFAULT_TIMEOUT_S` (300).
      exactly_once: Whether each update of a step is applied once when TF
        runs a step again after its worker failed mid-step (default True:
        every update of a variable on a ps is checked against a ledger of the
        step, `tfdist.parameter_server.update_gate`; it costs steps/s, see
        benchmarks/RESULTS.md). False: a step cut short by a worker's
        death may apply the updates it had sent twice (finished steps are
        still never run again).
      input_service: Where `fit` and `evaluate` input is read. None
        (default): the chief reads it (any dataset; exactly once per
        epoch). "chief": a tf.data dispatcher and worker started in the
        chief's process serve it and each worker reads its own batches (the
        chief sends steps only). "grpc://host:port": your own tf.data
        service's dispatcher (its workers run the pipeline; TF's
        "distributed_epoch" mode, so the source must be splittable).
        Async mode only; numpy arrays, or a dataset whose cardinality is
        known (or infinite, with `steps_per_epoch`). Without faults a pass
        read to its end trains on each element once, and a pass Keras
        stops early on as many batches as it ran steps; a worker that dies loses the
        batches it had fetched (at most once). A seeded shuffle repeats
        its order every epoch. See
        `tfdist/parameter_server/service_input.py`. `predict` and
        `*_on_batch` always read on the chief.

    Raises:
      ConfigError: For an unknown `mode`, a negative or misplaced
        `max_staleness`, a non-positive `timeout_s`, an `input_service`
        that is not "chief" or "grpc://host:port" or one with
        `mode="sync"`, the evaluator task, or `cluster` and
        `cluster_resolver` both given. Later, from `fit`/`evaluate` with
        an `input_service`: a dataset of unknown cardinality.
      ClusterConfigError: If TF_CONFIG (or `cluster`) is invalid, has no
        chief, worker or ps job, or this task's address is in use.
      TypeError: For a `max_staleness` not an int, a `variable_partitioner`
        not callable (nor None or "whole"), an `exactly_once` not a bool,
        or an `input_service` not a str (nor None).
      WorkerUnavailableError: If a worker or ps task does not start within
        `timeout_s`; names it.

    Example:
      >>> strategy = tfdist.ParameterServerStrategy()  # TF_CONFIG: chief, workers, ps
      >>> with strategy.scope():
      ...     model = build_model()
      ...     model.compile(optimizer="adam", loss="mse")
      >>> model.fit(dataset, epochs=3)
    """

    def __init__(
        self,
        cluster: ClusterConfig | str | dict[str, Any] | None = None,
        *,
        cluster_resolver: tf.distribute.cluster_resolver.ClusterResolver | None = None,
        mode: str = "async",
        max_staleness: int | None = None,
        variable_partitioner: Any = None,
        timeout_s: float | None = None,
        exactly_once: bool = True,
        input_service: str | None = None,
    ) -> None:
        # dict[str, Any]: TF_CONFIG is free-form JSON; parse_tf_config checks it.
        # Any (variable_partitioner): a TF partitioner is any callable.
        mode = _check_mode(mode)
        staleness = _check_max_staleness(mode, max_staleness)
        timeout = validation.check_positive_number(
            "timeout_s", DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s
        )
        partitioning.resolve(variable_partitioner, num_ps=1)  # Checked before anything starts.
        validation.check_bool("exactly_once", exactly_once)
        service_target = service_input.check(input_service, mode)
        config = resolver_lib.resolve_cluster(
            _coordinator_as_chief(cluster), _coordinator_as_chief(cluster_resolver)
        )
        roles.check_cluster(config)
        assert config.task is not None and config.cluster is not None
        startup.report_exposure(config, type(self).__name__)
        if config.task.task_type in roles.SERVING_TASK_TYPES:
            roles.serve(config)  # Never returns.
        startup.check_own_port(config)
        roles.wait_for_tasks(config, timeout)
        resolver = to_cluster_resolver(config)
        variable_partitioner = partitioning.resolve(
            variable_partitioner, len(config.cluster.addresses("ps"))
        )
        # Every update of a step applied once, whatever TF re-runs.
        self._update_gate = update_gate.UpdateGate() if exactly_once else None
        try:
            ps_runtime.initialize_strategy(
                self,
                resolver,
                lambda: extended_lib.ParameterServerExtended(
                    self,
                    resolver,
                    variable_partitioner,
                    adopt=self._update_gate.adopt if self._update_gate else None,
                ),
            )
        except tf.errors.OpError as e:
            raise startup.start_up_error(
                config, timeout, e, jobs=roles.SERVING_TASK_TYPES
            ) from e
        self._cluster_config = config
        self._variable_partitioner = variable_partitioner
        self._mode = mode
        self._max_staleness = staleness
        self._timeout_s = timeout
        self._coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(self)
        self._scheduler = scheduler_lib.StepScheduler(
            self._coordinator,
            config,
            timeout_s=timeout,
            max_in_flight=_IN_FLIGHT_PER_WORKER * len(config.cluster.addresses("worker")),
            max_staleness=staleness,
        )
        self._runner: keras_loop.StepRunner
        if mode == "sync":
            self._runner = sync_runner.SyncRunner(
                self,
                self._scheduler,
                num_workers=len(config.cluster.addresses("worker")),
                gate=self._update_gate,
            )
        else:
            self._runner = async_runner.AsyncRunner(self, self._scheduler, self._update_gate)
        self._input_service_target = service_target
        self._input_service = (
            None if service_target is None else service_input.InputService(service_target, config)
        )
        self._reading = (
            None
            if service_target is None
            else service_input.ReadingSteps(self, self._scheduler, config)
        )

    def scope(self) -> Any:
        """TF's scope; an op in it that finds a ps task lost raises `WorkerUnavailableError` naming it.

        tf-keras runs `fit`/`evaluate`/`predict` in this scope, and reads some
        of its own variables (on the ps tasks) between steps, outside tfdist's
        scheduler: TF's bare `UnavailableError` becomes tfdist's error.
        Inside, tf-keras's `LossScaleOptimizer` works (it refuses strategies
        it does not list; each step's gradients are unscaled once per
        worker replica, and each variable has one copy:
        `keras_compat.loss_scaling_allowed`, undone on exit). With a
        partitioner, Keras 3 takes gradients of split variables and looks up
        their rows per shard inside it (`keras_sharded.active`, also around
        each `run`), and TF and Keras are as they were outside it.
        """
        return _Scope(super().scope(), self._keras_inside_scope())

    @contextlib.contextmanager
    def _keras_inside_scope(self) -> Iterator[None]:
        """What Keras needs inside this scope, undone on leaving it."""
        with contextlib.ExitStack() as stack:
            stack.enter_context(keras_compat.loss_scaling_allowed(type(self)))
            if getattr(self.extended, "splits_variables", False):
                stack.enter_context(keras_sharded.active())  # Keras 3 trains split variables.
            yield

    @property
    def cluster_config(self) -> ClusterConfig:
        """The validated cluster this strategy runs on."""
        return self._cluster_config

    @property
    def mode(self) -> str:
        """"async" or "sync"."""
        return self._mode

    @property
    def max_staleness(self) -> int | None:
        """The staleness bound of async mode, or None."""
        return self._max_staleness

    @property
    def input_service(self) -> str | None:
        """Where the workers read `fit`'s input: None (the chief reads it), "chief" or "grpc://host:port"."""
        return self._input_service_target

    @property
    def timeout_s(self) -> float:
        """Bound on start-up and on one step, seconds."""
        return self._timeout_s

    @property
    def coordinator(self) -> tf.distribute.experimental.coordinator.ClusterCoordinator:
        """TF's `ClusterCoordinator` of this strategy (for custom training loops)."""
        return self._coordinator

    @property
    def executions_by_worker(self) -> dict[int, int]:
        """Scheduled functions (each `steps_per_execution` steps) each worker finished."""
        return dict(self._scheduler.executions_by_worker)

    def variable_shards(self, variable: Any) -> list[tf.Variable]:
        """Where a variable created in `scope()` is stored: its shards in row order, or itself.

        Each returned `tf.Variable`'s `device` names its ps task. Accepts a
        Keras 3 or tf-keras weight (`layer.embeddings`, `optimizer.variables`).
        """
        return extended_lib.shards_of(variable)

    @property
    def largest_staleness_seen(self) -> int:
        """The most steps any step's update may have been stale by, since construction.

        Measured on the chief: for each step, the steps of other scheduled
        functions that ran while it ran (an upper bound on the updates
        applied between its reads of the parameters and its own update).
        With `max_staleness=k`, never more than k.
        """
        return self._scheduler.largest_staleness_seen

    @property
    def steps_rerun_skipped(self) -> int:
        """Re-queued steps not run again because the step ledger showed them finished."""
        return self._scheduler.reruns_skipped

    @property
    def steps_rerun(self) -> int:
        """Times a step was queued again after its worker failed (since construction).

        Includes the re-runs skipped because the step had finished
        (`steps_rerun_skipped`).
        """
        return self._scheduler.reruns

    def experimental_distribute_dataset(
        self, dataset: tf.data.Dataset, options: tf.distribute.InputOptions | None = None
    ) -> tf.distribute.DistributedDataset:
        """Distributes `dataset`: for Keras's loops, read on the chief; else as TF does.

        Called by Keras's `fit`/`evaluate`/`predict` with the dataset they
        iterate: tfdist then takes over that model's step functions (see
        `tfdist/parameter_server/keras_loop.py`) and returns the dataset
        for the chief to iterate, batch by batch. Called from anywhere else
        (a custom loop with `coordinator.create_per_worker_dataset`), it
        returns TF's distributed dataset.

        Args:
          dataset: A `tf.data.Dataset`.
          options: TF's `tf.distribute.InputOptions` (used by TF's path).
        """
        call = keras_ps.calling_model()
        if call is None:
            return super().experimental_distribute_dataset(dataset, options)
        return self._chief_dataset(call, dataset)

    def distribute_datasets_from_function(
        self,
        dataset_fn: Any,
        options: tf.distribute.InputOptions | None = None,
    ) -> tf.distribute.DistributedDataset:
        """As `experimental_distribute_dataset`, for a dataset function.

        Called by tf-keras's `fit` with a `DatasetCreator` (TF's
        parameter-server tutorial): the chief calls `dataset_fn` once, with
        a one-pipeline `tf.distribute.InputContext`, and reads that
        dataset. Called from anywhere else, TF's.

        Args:
          dataset_fn: `InputContext -> tf.data.Dataset`.
          options: TF's `tf.distribute.InputOptions` (used by TF's path).
        """
        # Any (dataset_fn): any callable, as TF accepts.
        call = keras_ps.calling_model()
        if call is None:
            return super().distribute_datasets_from_function(dataset_fn, options)
        return self._chief_dataset(call, dataset_fn(tf.distribute.InputContext()))

    def _chief_dataset(
        self, call: keras_ps.KerasCall, dataset: Any
    ) -> tf.distribute.DistributedDataset:
        if not isinstance(dataset, tf.data.Dataset):
            raise TypeError(
                f"{call.method} was given data the strategy cannot read: "
                f"received {dataset!r} of type {type(dataset).__name__}; "
                "expected a tf.data.Dataset (Keras makes one from arrays)."
            )
        self._loop_for(call.model)
        if self._input_service is not None and call.method in ("fit", "evaluate"):
            return service_input.ServiceDataset(
                dataset,
                self._input_service,
                self._coordinator,
                call.method,
                counted_by_keras=keras_ps.data_batches() is not None,
            )
        return keras_loop.ChiefDataset(
            dataset, synchronous=call.method.endswith("_on_batch")
        )

    def _loop_for(self, model: Any) -> keras_loop.KerasLoop:
        owner = keras_ps.installed_owner(model)
        if isinstance(owner, keras_loop.KerasLoop):
            return owner
        return keras_loop.KerasLoop(
            self,
            model,
            self._runner,
            exact_counters=self._make_counters_exact,
            reading=self._reading,
        )

    def _make_counters_exact(self, variables: Sequence[Any]) -> None:
        keras_ps.make_counters_exact(variables)


class _Scope:
    """TF's strategy scope with `inner` entered inside it; its exit turns TF's error for a lost ps into tfdist's."""

    def __init__(self, scope: Any, inner: Any) -> None:
        self._scope = scope
        self._inner = inner

    def __enter__(self) -> Any:
        entered = self._scope.__enter__()
        self._inner.__enter__()
        return entered

    def __exit__(self, kind: Any, value: BaseException | None, traceback: Any) -> Any:
        self._inner.__exit__(kind, value, traceback)
        suppressed = self._scope.__exit__(kind, value, traceback)
        lost = None if suppressed else scheduler_lib.lost_ps_error(value)
        if lost is not None:
            raise lost from value
        return suppressed


def _coordinator_as_chief(cluster: Any) -> Any:
    """TF's cluster with the coordinator outside it, as one with this process as chief.

    TF's ParameterServerStrategy also takes a resolver of worker and ps
    jobs only, with no task (TF's tutorial's in-process cluster): the
    process that builds the strategy coordinates from outside the cluster.
    tfdist's coordinator is the chief task, so such a resolver gets a chief
    job of this process (a free 127.0.0.1 port) and the task chief:0.
    Anything else is returned as given.
    """
    if not isinstance(cluster, tf.distribute.cluster_resolver.ClusterResolver):
        return cluster
    jobs = cluster.cluster_spec().as_dict()
    if cluster.task_type is not None or "chief" in jobs or not jobs.get("worker"):
        return cluster
    jobs = {**jobs, "chief": [ports.free_local_address()]}
    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(jobs),
        task_type="chief",
        task_id=0,
        rpc_layer=cluster.rpc_layer or "grpc",
    )
