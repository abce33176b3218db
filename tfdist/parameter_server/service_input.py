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

    each iterator Keras makes (a pass)    -> a new service job: the
                                             pipeline runs afresh
    train_function(iterator):             # Keras's loop on the chief
        schedule read_steps(the job's readers) on a free worker
    read_steps(reader):                   # on that worker, k = steps_per_execution
        k times: batch = reader.get_next_as_optional()
                 logs = cond(batch has a value, train_step(batch), logs so far)
        return (batches read, logs)
    epoch barrier:                        # before Keras reads the metrics
        settle the ending loop's passes (ReadingSteps.settle)

Why settle: a worker's reader fetches batches ahead of its steps (several,
whatever `max_outstanding_requests` says), so near the end of a job
another worker's read can find nothing while batches remain in the first
reader's buffer: that step trained on nothing. (Seen: of 4 batches and 2
steps, the second step's read was empty; without settling, 8 and 72 of
200 examples were skipped in a 2-epoch fit.) At the barrier the chief
counts what the pass's steps read and schedules one-batch steps until
they trained on as many batches as they asked for; for a pass whose steps
asked for all of a finite dataset's batches, until every worker's reader
is past the end of the job (a reader past the end stays there; a worker
that refuses connections is not waited for).

What holds:

- Without faults, a pass read to its end trains on every element of the
  dataset once (Keras runs as many steps as its cardinality says, which
  must be known; or it is infinite with `steps_per_epoch`: one job spans
  `fit`). Keras's own dataset from numpy arrays has a cardinality
  `tf.data` cannot count, but Keras counts its batches and stops there;
  settling then trains as many batches as Keras ran steps: every example
  once per epoch under Keras 3; under tf-keras, whose one dataset holds
  all epochs (one job), `epochs` times over the fit, an epoch possibly
  taking the next one's first batches. A pass Keras stops early
  (`steps_per_epoch` or `validation_steps` below the cardinality: the
  next epoch goes on with it, as on one device; `stop_training`) trains
  on as many batches as Keras ran steps, none twice. With a user's service of several tf.data
  workers ("distributed_epoch"), each may end its part on a short batch:
  more batches than the cardinality, trained at the barrier.
- A worker that dies loses the batches it had fetched (the step it ran,
  whose updates may have partly landed, and those it read ahead): each
  element is trained on at most once. TF runs that step again elsewhere,
  on the next batch of the job; these steps are not recorded
  (`step_ledger`) and their updates not gated (`update_gate`), because a
  re-run trains on other data. The chief-read default is exactly-once.
- Asynchronous mode only: synchronous mode splits each batch the chief
  reads over all workers.
- A seeded shuffle repeats its order every epoch (each job rebuilds the
  pipeline from its graph; on one device the same seed reshuffles every
  epoch); an unseeded shuffle reshuffles.

`"chief"` runs the pipeline in "parallel_epochs" mode on its one tf.data
worker, in the chief's process (any pipeline, Python functions included).
A user's service runs it in "distributed_epoch" mode: the source's splits
go to its tf.data workers, other processes, so TF needs a splittable
source (files, `range`, `from_tensor_slices`) and no Python
(`from_generator`, `py_function`).

Contract: called from the thread running Keras's loop, as the scheduler's
methods are.
"""

from __future__ import annotations

import collections
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
from tfdist.watchdog import startup

__all__ = [
    "CHIEF",
    "InputService",
    "Read",
    "ReadingSteps",
    "ServiceDataset",
    "ServiceIterator",
    "check",
]

#: `input_service` value: a dispatcher and one tf.data worker in the chief.
CHIEF = "chief"
_SCHEME = "grpc://"
#: Requests a worker's reader keeps outstanding (what it holds is lost if
#: it dies; TF's client still buffers a few elements more, see above).
_READ_AHEAD = 1
#: First and longest pause, seconds, after a settling round that made no progress.
_SETTLE_PAUSE_S = 0.01
_SETTLE_PAUSE_MAX_S = 0.5
#: Finished steps of a pass whose reads are counted only at the barrier.
_UNSETTLED_MAX = 256


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
      logs: The last step's logs (after a missed read, those of the step
        before it in the function, else the metrics so far).
    """

    batches: Any
    logs: Any


class ServiceIterator:
    """One pass over a `ServiceDataset`: one service job, read by the workers.

    The job and the workers' readers are made at the first step; a peek
    with `next()` (Keras builds a model from one batch) reads on the chief
    instead, from a pipeline of its own. Keras keeps a pass across epochs
    when `steps_per_epoch` is less than the dataset's batches (as on one
    device, the next epoch goes on where the last one stopped).

    Attributes:
      requested: Batches the steps scheduled on this pass asked for.
      trained: Batches its settled steps read and trained on.
      unsettled: Steps scheduled since the last `ReadingSteps.settle`.
      drained: Whether the pass was read to its end and closed.
    """

    def __init__(self, owner: ServiceDataset) -> None:
        self._owner = owner
        self._readers: Any = None
        self._chief_iterator: Any = None
        self.requested = 0
        self.trained = 0
        self.unsettled: collections.deque[scheduler_lib.Step] = collections.deque()
        self.drained = False

    @property
    def exhausted(self) -> bool:
        """Whether steps asked for every batch of a dataset of known, finite cardinality.

        The job is then at its end, but for what readers fetched ahead. A
        pass of Keras's arrays (cardinality unknown to `tf.data`) is never
        exhausted: Keras stops at its own count, and settling trains as
        many batches as it ran steps.
        """
        cardinality = self._owner.cardinality
        return cardinality >= 0 and self.requested >= cardinality

    def readers(self) -> Any:
        """Each worker's reader of this pass's job (a per-worker iterator)."""
        if self.drained:
            raise StopIteration
        if self._readers is None:
            self._readers = self._owner.start_job()
        return self._readers

    def close(self) -> None:
        """Drops the readers (the job ends on the service when they are freed)."""
        self._readers = None
        self.drained = True

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
      counted_by_keras: Whether Keras counts the dataset's batches itself
        (`keras_ps.data_batches`; Keras's own dataset from arrays, whose
        cardinality `tf.data` does not know): Keras then stops at its
        count. Not where a pass ends: tf-keras's goes on over all epochs.

    Raises:
      ConfigError: If neither `tf.data` nor Keras counts its batches.
    """

    def __init__(
        self,
        dataset: tf.data.Dataset,
        service: InputService,
        coordinator: tf.distribute.experimental.coordinator.ClusterCoordinator,
        method: str,
        counted_by_keras: bool = False,
    ) -> None:
        cardinality = int(dataset.cardinality())
        if cardinality == tf.data.UNKNOWN_CARDINALITY and not counted_by_keras:
            raise errors.ConfigError(
                f"{method} with input_service needs a dataset whose number of "
                "batches is known (Keras runs that many steps while the workers "
                "read); received a dataset of unknown cardinality (e.g. after "
                "filter, or from a generator). Add "
                ".apply(tf.data.experimental.assert_cardinality(num_batches)), "
                "or .repeat() and steps_per_epoch, or drop input_service (the "
                "chief then reads any dataset)."
            )
        self._cardinality = cardinality
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
        """Batches of the dataset as `tf.data` counts them (unknown for Keras's arrays)."""
        return self._cardinality

    def reduce(self, initial_state: Any, reduce_func: Any) -> Any:
        return self.dataset.reduce(initial_state, reduce_func)


class ReadingSteps:
    """Compiles, schedules and settles steps that read their batches on the workers.

    Args:
      strategy: The strategy (steps traced and scheduled in its scope).
      scheduler: Where steps are queued (shared with the chief-read steps).
      config: The cluster (its workers; probed for lost ones while settling).
    """

    def __init__(
        self,
        strategy: tf.distribute.Strategy,
        scheduler: scheduler_lib.StepScheduler,
        config: ClusterConfig,
    ) -> None:
        assert config.cluster is not None
        self._strategy = strategy
        self._scheduler = scheduler
        self._config = config
        self._num_workers = len(config.cluster.addresses("worker"))

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
        """Schedules `compiled` (from `compile`, `count` reads) on `iterator`'s readers; its `Step`.

        The step's result is a `Read`. Raises StopIteration if the pass
        was drained.
        """
        step = self._schedule(compiled, iterator.readers(), count)
        iterator.requested += count
        iterator.unsettled.append(step)
        while len(iterator.unsettled) > _UNSETTLED_MAX and iterator.unsettled[0].done.is_set():
            iterator.trained += self._batches_read(iterator.unsettled.popleft())
        return step

    def _batches_read(self, step: scheduler_lib.Step) -> int:
        """What a finished reading step trained on (its output is on the chief already)."""
        return int(self._scheduler.result(step).batches)

    def _schedule(self, compiled: Any, readers: Any, count: int) -> scheduler_lib.Step:
        with self._strategy.scope():
            return self._scheduler.schedule(
                compiled, (readers,), num_steps=count, steps_per_function=count
            )

    def settle(self, iterator: ServiceIterator, one_batch: Any) -> None:
        """Makes a pass's steps have trained on as many batches as they asked for.

        Called at the epoch barrier, after every scheduled step finished.
        A worker's reader fetches ahead, so another worker's read can find
        nothing while batches remain (the job handed them all out): that
        step trained on nothing. This schedules `one_batch` (a function of
        `compile` with one read) until the pass's steps trained on as many
        batches as they asked for; for a pass whose steps asked for all of
        a finite dataset's batches, until each worker's reader is past the
        end, then closes it (every batch once). A worker that refuses
        connections is not waited for (what its reader held is lost with
        it). Bounded by `timeout_s` (`CollectiveTimeoutError`).
        """
        if iterator.drained:
            return
        while iterator.unsettled:
            iterator.trained += self._batches_read(iterator.unsettled.popleft())
        to_the_end = iterator.exhausted
        ended: set[int] = set()
        deadline = time.monotonic() + self._scheduler.timeout_s
        pause_s = _SETTLE_PAUSE_S
        while (to_the_end or iterator.trained < iterator.requested) and (
            ended | self._lost_workers(ended) < set(range(self._num_workers))
        ):
            if time.monotonic() > deadline:
                raise errors.CollectiveTimeoutError(
                    f"the workers did not read the rest of the epoch's tf.data "
                    f"service job within timeout_s={self._scheduler.timeout_s:g} s "
                    f"(workers past the end: {sorted(ended)} of "
                    f"{self._num_workers}). Check the workers' and the service's "
                    "logs, or raise timeout_s.",
                )
            wanted = self._num_workers if to_the_end else iterator.requested - iterator.trained
            steps = [
                self._schedule(one_batch, iterator.readers(), 1)
                for _ in range(min(wanted, self._num_workers))
            ]
            progress = False
            for step in steps:
                read = self._batches_read(step)
                iterator.trained += read
                worker = step.worker
                if read:
                    progress = True
                elif worker is not None and worker not in ended:
                    ended.add(worker)
                    progress = True
            if not progress:  # Rounds taken by ended workers: let the others in.
                time.sleep(pause_s)
                pause_s = min(2 * pause_s, _SETTLE_PAUSE_MAX_S)
        if to_the_end:
            iterator.close()

    def _lost_workers(self, ended: set[int]) -> set[int]:
        """Indices of the workers not yet `ended` that refuse connections."""
        if len(ended) == self._num_workers:
            return set()
        lost = startup.unreachable_peers(self._config, jobs=("worker",))
        return {int(name.split(" ")[0].split(":")[1]) for name in lost}


def _reading_steps(one_step: Any, model: Any, count: int) -> Any:
    """`reader -> Read`: up to `count` steps, each on the reader's next batch if any."""

    def read_steps(reader: Any) -> Read:
        batches = tf.constant(0, tf.int32)
        logs = None
        for _ in range(count):
            batch = reader.get_next_as_optional()
            # A missed read keeps the logs of the step before it in this
            # function, else the metrics so far (the chief ignores the logs
            # of a function that read nothing).
            previous = logs
            logs = _if_value(
                batch, one_step, model.get_metrics_result if previous is None else lambda: previous
            )
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
