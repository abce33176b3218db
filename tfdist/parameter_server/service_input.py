"""Input the workers read themselves, from TF's tf.data service (`input_service=`).

By default the chief reads the dataset `fit` is given and sends each batch
with the step that trains on it (`keras_loop`). With
`ParameterServerStrategy(input_service=...)` the chief sends steps only,
and each worker reads its batches from a tf.data service:

    input_service="chief"             the chief starts a dispatcher and one
                                      tf.data worker in its own process
    input_service="grpc://host:port"  a service the user runs (its tf.data
                                      workers anywhere: input work scales
                                      past one machine)

    each iterator Keras makes (an epoch)  -> a new service job: the
                                             pipeline runs afresh
    train_function(iterator):             # Keras's loop on the chief
        schedule read_steps(the job's readers) on a free worker
    read_steps(reader):                   # on that worker, k = steps_per_execution
        k times: batch = reader.get_next_as_optional()
                 logs = cond(batch has a value, train_step(batch), metrics so far)
        return (batches read, logs)
    epoch barrier (finite data):          # before Keras reads the metrics
        schedule read_steps until every worker has read past the end

What holds:

- Without faults, every element of the dataset is trained on once per
  epoch: a job hands each element to one reader, and the barrier trains
  on what a reader fetched ahead but had no step for. Keras runs as many
  steps as the dataset's cardinality says (it must be known, or infinite
  with `steps_per_epoch`: one job then spans `fit`). With a user's service
  of several tf.data workers (processing mode "distributed_epoch"), each
  may end on a partial batch: those batches train in the barrier.
- A worker that dies loses the batches it had fetched (the step it ran,
  and up to a few read ahead): each element is trained on at most once.
  TF runs that step again elsewhere, on the next batch of the job; these
  steps are not recorded (`step_ledger`) and their updates not gated
  (`update_gate`), because a re-run trains on other data. The chief-read
  default is exactly-once.
- Asynchronous mode only: synchronous mode splits each batch the chief
  reads over all workers.
- A seeded shuffle repeats its order every epoch (each job rebuilds the
  pipeline from its graph; on one device the same seed reshuffles every
  epoch); an unseeded shuffle reshuffles.

`"chief"` runs the pipeline in "parallel_epochs" mode on its one tf.data
worker (any pipeline); a user's service runs it in "distributed_epoch"
mode (the source's splits go to its tf.data workers; TF needs a splittable
source, e.g. files, `range` or `from_tensor_slices`).

Contract: called from the thread running Keras's loop, as the scheduler's
methods are.
"""

from __future__ import annotations

import itertools
import secrets
import time
from typing import Any, NamedTuple

import tensorflow as tf

from tfdist import errors
from tfdist._internal import ps_runtime
from tfdist._internal import tf_data
from tfdist.cluster import ClusterConfig
from tfdist.cluster import spec as spec_lib
from tfdist.parameter_server import async_runner
from tfdist.parameter_server import scheduler as scheduler_lib

__all__ = ["CHIEF", "InputService", "Read", "ServiceDataset", "ServiceIterator", "check"]

#: `input_service` value: a dispatcher and one tf.data worker in the chief.
CHIEF = "chief"
_SCHEME = "grpc://"
#: Batches a worker's reader requests ahead of its steps (lost if it dies).
_READ_AHEAD = 1


def check(input_service: object, mode: str) -> str | None:
    """`input_service` as given, validated; raises before anything starts.

    Raises:
      TypeError: For anything but None or a str.
      ConfigError: For a str that is neither "chief" nor "grpc://host:port",
        or any service with `mode="sync"`.
    """
    if input_service is None:
        return None
    if not isinstance(input_service, str):
        raise TypeError(
            f"input_service must be None, 'chief' or 'grpc://host:port'; received "
            f"{input_service!r} of type {type(input_service).__name__}."
        )
    if input_service != CHIEF and not (
        input_service.startswith(_SCHEME) and ":" in input_service[len(_SCHEME) :]
    ):
        raise errors.ConfigError(
            f"input_service={input_service!r} is not a tf.data service; expected "
            "None (the chief reads the dataset, the default), 'chief' (tfdist "
            "starts a dispatcher and a tf.data worker in the chief) or the "
            "address of your dispatcher, 'grpc://host:port'."
        )
    if mode != "async":
        raise errors.ConfigError(
            f"input_service={input_service!r} lets each worker read its own "
            f"batches; received mode={mode!r}, which splits every batch the "
            "chief reads over all workers. Drop input_service (the chief reads), "
            "or use mode='async'."
        )
    return input_service


class InputService:
    """The tf.data service the workers read from; started on first use.

    Args:
      target: "chief" or "grpc://host:port" (see `check`).
      config: The cluster (the chief's host is where its servers listen).
    """

    def __init__(self, target: str, config: ClusterConfig) -> None:
        assert config.cluster is not None
        self._target = target
        chief = config.cluster.chief_task
        assert chief is not None
        self._chief_host = spec_lib.Address.parse(config.cluster.address(chief)).host
        self._servers: tuple[Any, Any] | None = None
        self._address: str | None = None
        self._jobs = itertools.count()
        self._name = secrets.token_hex(4)

    @property
    def processing_mode(self) -> str:
        """TF's processing mode: "parallel_epochs" on the chief's one tf.data worker, else "distributed_epoch"."""
        return "parallel_epochs" if self._target == CHIEF else "distributed_epoch"

    def address(self) -> str:
        """The dispatcher's address, "grpc://host:port" (starts the chief's servers once)."""
        if self._address is None:
            if self._target == CHIEF:
                self._servers, address = tf_data.start_local_service(self._chief_host)
                self._address = _SCHEME + address
            else:
                self._address = self._target
        return self._address

    def job_name(self) -> str:
        """A name no other job of this process has."""
        return f"tfdist-ps-{self._name}-{next(self._jobs)}"


class Read(NamedTuple):
    """What a reading step function returns.

    Attributes:
      batches: int32 scalar, the batches it trained on (fewer than it
        tried: its reader is past the end of the job).
      logs: The last step's logs (the metrics so far after a missed read).
    """

    batches: Any
    logs: Any


class ServiceIterator:
    """One pass over a `ServiceDataset`: one service job, read by the workers.

    The job and the workers' readers are made at the first step; a peek
    with `next()` (Keras builds a model from one batch) reads on the chief
    instead, from a pipeline of its own.
    """

    def __init__(self, owner: ServiceDataset) -> None:
        self._owner = owner
        self._readers: Any = None
        self._chief_iterator: Any = None
        self.drained = False

    @property
    def finite(self) -> bool:
        return self._owner.cardinality != tf.data.INFINITE_CARDINALITY

    def readers(self) -> Any:
        """Each worker's reader of this pass's job (a per-worker iterator)."""
        if self._readers is None:
            self._readers = self._owner.start_job()
        return self._readers

    def close(self) -> None:
        """Drops the readers (the job ends on the service when they are freed)."""
        self._readers = None

    def __iter__(self) -> ServiceIterator:
        return self

    def __next__(self) -> Any:
        if self._chief_iterator is None:
            self._chief_iterator = iter(self._owner.dataset)
        return next(self._chief_iterator)

    def get_next(self) -> Any:
        return next(self)


class ServiceDataset(tf.distribute.DistributedDataset):
    """The "distributed" dataset Keras gets: `dataset`, read by the workers from `service`.

    Args:
      dataset: The user's dataset (each element one batch).
      service: Where it is served.
      coordinator: TF's coordinator (it makes each worker's reader).
      method: The Keras method reading it (for errors).

    Raises:
      ConfigError: If `dataset`'s cardinality is unknown.
    """

    def __init__(
        self,
        dataset: tf.data.Dataset,
        service: InputService,
        coordinator: tf.distribute.experimental.coordinator.ClusterCoordinator,
        method: str,
    ) -> None:
        cardinality = int(dataset.cardinality())
        if cardinality == tf.data.UNKNOWN_CARDINALITY:
            raise errors.ConfigError(
                f"{method} with input_service needs a dataset whose number of "
                "batches is known (Keras runs that many steps while the workers "
                "read); received a dataset of unknown cardinality (e.g. after "
                "filter, or from a generator). Add "
                ".apply(tf.data.experimental.assert_cardinality(num_batches)), "
                "or .repeat() and steps_per_epoch, or drop input_service (the "
                "chief then reads any dataset)."
            )
        self.dataset = dataset
        self._service = service
        self._coordinator = coordinator
        self._dataset_id: Any = None

    def start_job(self) -> Any:
        """A new job over the dataset; each worker's reader of it."""
        service = self._service
        address = service.address()
        if self._dataset_id is None:
            self._dataset_id = tf.data.experimental.service.register_dataset(
                address, self.dataset
            )
        dataset_id, spec = self._dataset_id, self.dataset.element_spec
        mode, job = service.processing_mode, service.job_name()

        def read() -> tf.data.Dataset:
            return tf.data.experimental.service.from_dataset_id(
                processing_mode=mode,
                service=address,
                dataset_id=dataset_id,
                element_spec=spec,
                job_name=job,
                # What a reader holds is lost with its worker: hold little.
                max_outstanding_requests=_READ_AHEAD,
            )

        return iter(self._coordinator.create_per_worker_dataset(read))

    def __iter__(self) -> ServiceIterator:
        return ServiceIterator(self)

    @property
    def element_spec(self) -> Any:
        return self.dataset.element_spec

    @property
    def cardinality(self) -> int:
        return int(self.dataset.cardinality())

    def reduce(self, initial_state: Any, reduce_func: Any) -> Any:
        return self.dataset.reduce(initial_state, reduce_func)


class ReadingSteps:
    """Compiles, schedules and drains steps that read their batches on the workers.

    Args:
      strategy: The strategy (steps traced and scheduled in its scope).
      scheduler: Where steps are queued (shared with the chief-read steps).
      num_workers: Workers of the cluster.
    """

    def __init__(
        self,
        strategy: tf.distribute.Strategy,
        scheduler: scheduler_lib.StepScheduler,
        num_workers: int,
    ) -> None:
        self._strategy = strategy
        self._scheduler = scheduler
        self._num_workers = num_workers
        self._open: dict[int, tuple[ServiceIterator, Any, int]] = {}

    def compile(self, kind: str, model: Any, count: int, *, keras3: bool) -> Any:
        """`reader -> Read`: `count` steps of `kind` of `model`, each reading its batch.

        A `tf.function`; trace it with `reader_spec` of the readers it reads.
        """
        one_step = async_runner.step_body(self._strategy, kind, model)
        # Keras 3 compiles its step without autograph; tf-keras with it.
        return tf.function(_reading_steps(one_step, model, count), autograph=not keras3)

    @staticmethod
    def reader_spec(readers: Any) -> Any:
        """What a function traced on the chief takes for one worker's reader."""
        return ps_runtime.worker_value_spec(readers)

    def submit(self, iterator: ServiceIterator, compiled: Any, count: int) -> scheduler_lib.Step:
        """Schedules `compiled` (from `compile`) on `iterator`'s readers; its `Step`.

        The step's result is a `Read`. The iterator is drained at the next
        `drain` (if finite).
        """
        self._open[id(iterator)] = (iterator, compiled, count)
        return self._schedule(compiled, iterator.readers(), count)

    def _schedule(self, compiled: Any, readers: Any, count: int) -> scheduler_lib.Step:
        with self._strategy.scope():
            return self._scheduler.schedule(
                compiled, (readers,), num_steps=count, steps_per_function=count
            )

    def drain(self) -> None:
        """Trains on what the readers of finite passes still hold; then drops them.

        Called at the epoch barrier, after every scheduled step finished:
        schedules reading steps, a round of one per worker at a time, until
        a step on each worker found its reader past the end (at most
        `timeout_s` of the scheduler, else `CollectiveTimeoutError`).
        """
        for key, (iterator, compiled, count) in list(self._open.items()):
            if not iterator.finite:
                continue  # One job spans fit: what is read ahead stays for the next epoch.
            del self._open[key]
            self._drain(iterator, compiled, count)
            iterator.close()

    def _drain(self, iterator: ServiceIterator, compiled: Any, count: int) -> None:
        ended: set[int] = set()
        deadline = time.monotonic() + self._scheduler.timeout_s
        while len(ended) < self._num_workers:
            if time.monotonic() > deadline:
                raise errors.CollectiveTimeoutError(
                    f"the workers did not read to the end of the epoch's tf.data "
                    f"service job within timeout_s={self._scheduler.timeout_s:g} s "
                    f"(workers past the end: {sorted(ended)} of "
                    f"{self._num_workers}). Check the workers' and the service's "
                    "logs, or raise timeout_s.",
                )
            steps = [
                self._schedule(compiled, iterator.readers(), count)
                for _ in range(self._num_workers)
            ]
            for step in steps:
                read = self._scheduler.result(step)
                if int(read.batches) < count and step.worker is not None:
                    ended.add(step.worker)


def _reading_steps(one_step: Any, model: Any, count: int) -> Any:
    """`reader -> Read`: up to `count` steps, each on the reader's next batch if any."""

    def read_steps(reader: Any) -> Read:
        batches = tf.constant(0, tf.int32)
        logs = None
        for _ in range(count):
            batch = reader.get_next_as_optional()
            logs = _if_value(batch, one_step, model.get_metrics_result)
            batches += tf.cast(batch.has_value(), tf.int32)
        return Read(batches, logs)

    return read_steps


def _if_value(optional: Any, step: Any, otherwise: Any) -> Any:
    """`step(value)` if `optional` has one, else `otherwise()` (zeros if its structure differs)."""
    traced: list[Any] = []

    def run() -> Any:
        outputs = step(optional.get_value())
        traced.append(outputs)
        return outputs

    def skip() -> Any:
        # cond traces `run` first: its outputs say what this branch must return.
        outputs = traced[0]
        fallback = otherwise()
        try:
            tf.nest.assert_same_structure(outputs, fallback)
            return tf.nest.map_structure(lambda o, f: tf.cast(f, o.dtype), outputs, fallback)
        except (ValueError, TypeError):
            return tf.nest.map_structure(
                lambda o: tf.zeros([d or 0 for d in o.shape], o.dtype), outputs
            )

    return tf.cond(optional.has_value(), run, skip)
