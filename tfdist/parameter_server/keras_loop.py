"""Keras's `fit`, `evaluate` and `predict` on a parameter-server cluster.

Keras (3 and tf-keras) runs its loop on the chief and calls, per step (or
per `steps_per_execution` steps), `train_function(iterator)`. For a model
built under `tfdist.ParameterServerStrategy`, the strategy replaces those
functions (`tfdist._internal.keras_ps`) with a `KerasLoop`'s:

    train_function(iterator):            # on the chief, Keras's loop
        batches = up to k next(iterator)  # the chief reads the user's dataset
        if none: raise StopIteration      # a finite dataset ends the epoch
        runner.submit(train steps on batches)   # async: on a free worker
        return logs of the latest finished step (the first one waits)
    get_metrics_result():                 # Keras, after the epoch's steps
        runner.wait_all()                 # the epoch barrier
        Keras's metrics (variables on the ps, updated by every worker)

Input: the chief iterates the dataset `fit` was given, exactly as on one
device, and passes each batch to the step it schedules (the batch travels
with the step to the worker). So a finite dataset needs no `repeat()` or
`steps_per_epoch` (TF's `repeat()` + `steps_per_epoch` style works too),
any pipeline works unchanged (an unseeded shuffle, a generator), and every
batch is trained on exactly once per epoch; a step whose worker fails is
run again by another worker *with the same batch* (TF's coordinator
re-queues it with its arguments).

Logs: per-step logs (the progress bar) are those of the latest finished
step among those whose logs were asked for, one every `_LOGS_INTERVAL_S`
(the outputs of the others stay on their worker: copying every step's
to the chief cost a transfer per output tensor and the GIL); they lag the
steps scheduled by up to `max_in_flight`. After an epoch Keras reads the
metrics themselves, after the barrier:
every worker's updates counted (metric variables live on the ps and their
updates are atomic, see `keras_ps.make_counters_exact`).

`predict` returns rows in input order (each call waits for its batches).
"""

from __future__ import annotations

import collections
import queue
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import tensorflow as tf

from tfdist._internal import keras_ps
from tfdist.data.distributed import resume
from tfdist.parameter_server import input_packing
from tfdist.parameter_server import service_input
from tfdist.parameter_server import step_ledger

__all__ = ["ChiefDataset", "ChiefIterator", "KerasLoop", "StepRunner", "wait_for_steps"]

#: Least time between two steps whose logs are fetched (for the progress
#: bar; each fetch is a copy from a worker). Other steps' outputs are
#: dropped on their worker.
_LOGS_INTERVAL_S = 0.25
#: Batches the chief reads ahead of Keras's loop.
_READ_AHEAD = 4
#: Longest single wait of the read-ahead thread on a full queue, seconds.
_POLL_S = 0.1

# `Any` below: Keras models, nested batches and logs are untyped upstream.


class StepRunner(Protocol):
    """Runs compiled multi-batch steps somewhere (workers, or the whole cluster)."""

    #: Whether `submit` returns only once its training steps are done (sync
    #: mode): the loop then reads every step's logs, as one device's loop.
    blocks_on_steps: bool

    def compile(self, kind: str, model: Any, keras3: bool) -> Any:
        """The function running `kind` steps of `model` on a tuple of batches.

        Traced by the loop through its `get_concrete_function(specs)`.
        """

    def submit(
        self,
        function: Callable[[Any], Any],
        batches: tuple[Any, ...],
        steps_per_function: int,
        *,
        logs_wanted: bool = True,
    ) -> Any:
        """Starts `function(batches)`; returns a handle for `result`.

        `steps_per_function`: the most batches any function of this loop
        takes (Keras's `steps_per_execution`). `logs_wanted=False`: the
        outputs need not reach the chief (`result` may return None).
        """

    def result(self, handle: Any) -> Any:
        """Waits for a handle; its outputs (eager tensors on the chief)."""

    def finished(self) -> list[Any]:
        """Handles finished since the last call (oldest first)."""

    def wait_all(self) -> None:
        """Waits for every submitted handle."""


class ChiefIterator:
    """An iterator over the user's dataset on the chief, for tfdist's step functions.

    The pass opens at the first `next`: Keras makes iterators it never reads
    (tf-keras one before its first epoch, Keras 3 one at each epoch end),
    which then read nothing. From there a thread reads ahead (at most
    `_READ_AHEAD` batches) so that Keras's loop thread only takes batches
    from a queue: reading a `tf.data` iterator costs the loop about a
    millisecond per batch in TF's eager machinery. Order and content are
    the dataset's; an error of the pipeline is raised where that batch
    would have been.

    Args:
      open_pass: Returns the pass's iterator; called once, at the first `next`.
      synchronous: See the attribute.

    Attributes:
      synchronous: Whether each step must finish before the function
        returns (tf-keras's `*_on_batch`: their logs are that batch's).
    """

    def __init__(self, open_pass: Callable[[], Any], *, synchronous: bool) -> None:
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue(_READ_AHEAD)
        self._stop = threading.Event()
        self._open_pass: Callable[[], Any] | None = open_pass
        self._ended = False
        self.synchronous = synchronous

    def _start(self, open_pass: Callable[[], Any]) -> None:
        iterator = open_pass()
        threading.Thread(
            target=self._read, args=(iterator,), name="tfdist-chief-input", daemon=True
        ).start()

    def _read(self, iterator: Any) -> None:
        while not self._stop.is_set():
            try:
                item: tuple[str, Any] = ("batch", next(iterator))
            except (StopIteration, tf.errors.OutOfRangeError):
                item = ("end", None)
            except BaseException as e:  # noqa: BLE001 - raised in the loop's thread.
                item = ("error", e)
            while not self._stop.is_set():
                try:
                    self._queue.put(item, timeout=_POLL_S)
                    break
                except queue.Full:
                    continue
            if item[0] != "batch":
                return

    def close(self) -> None:
        """Stops reading ahead."""
        self._stop.set()

    def __del__(self) -> None:
        self._stop.set()

    def __iter__(self) -> ChiefIterator:
        return self

    def __next__(self) -> Any:
        if self._ended:
            raise StopIteration
        if self._open_pass is not None:
            open_pass, self._open_pass = self._open_pass, None
            self._start(open_pass)
        kind, value = self._queue.get()
        if kind == "batch":
            return value
        self._ended = True
        if kind == "error":
            raise value
        raise StopIteration

    def get_next(self) -> Any:
        return next(self)


class ChiefDataset(tf.distribute.DistributedDataset):
    """The "distributed" dataset Keras gets: the user's batches, read on the chief.

    Each iteration is a new pass over `dataset` (a reshuffling pipeline
    reshuffles), yielding its elements as they are; tfdist's step functions
    send each batch to the step that trains on it. A pass started while a
    `resume.ResumePoint` is armed (`tfdist.elastic` resuming at step k)
    takes it, and the first pass read from then on skips its first k
    batches (an endless dataset: every step trained since the job began);
    later passes are whole.
    """

    def __init__(self, dataset: tf.data.Dataset, *, synchronous: bool = False) -> None:
        self._dataset = dataset
        self._synchronous = synchronous
        self._skip = 0  # Elements the next pass to be read skips.

    def __iter__(self) -> ChiefIterator:
        point = resume.take()
        if point is not None:
            self._skip = point.steps_to_skip(self.cardinality)
        resume.started(None)  # Passes are not numbered: the dataset's own.
        return ChiefIterator(self._open_pass, synchronous=self._synchronous)

    def _open_pass(self) -> Any:
        skip, self._skip = self._skip, 0
        return iter(self._dataset.skip(skip) if skip else self._dataset)

    @property
    def element_spec(self) -> Any:
        return self._dataset.element_spec

    @property
    def cardinality(self) -> int:
        return int(self._dataset.cardinality())

    def reduce(self, initial_state: Any, reduce_func: Callable[[Any, Any], Any]) -> Any:
        return self._dataset.reduce(initial_state, reduce_func)


def _pull(iterator: Any, count: int) -> tuple[Any, ...]:
    """Up to `count` next elements; StopIteration if there are none."""
    batches = []
    for _ in range(count):
        try:
            batches.append(next(iterator))
        except (StopIteration, tf.errors.OutOfRangeError):
            break
    if not batches:
        raise StopIteration
    return tuple(batches)


def _signature(batches: tuple[Any, ...]) -> tuple[Any, Any]:
    """(cache key, input specs) with the batch dimension unknown: one trace per structure."""

    def spec(value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, tf.Tensor) and value.shape.rank:
            return tf.TensorSpec([None, *value.shape[1:]], value.dtype)
        return tf.type_spec_from_value(value)

    specs = tf.nest.map_structure(spec, batches)
    return repr(specs), specs


class KerasLoop:
    """tfdist's train, test and predict functions for one Keras model.

    Built by the strategy the first time the model's loop distributes a
    dataset; installed on that model instance only.

    Args:
      strategy: The strategy the model was built under (steps are traced
        in its scope).
      model: A Keras 3 or tf-keras model built under the strategy.
      runner: Where the steps run (`StepRunner`).
      exact_counters: Called with the model's variables before each trace
        (Keras 3's non-atomic counters; see `keras_ps.make_counters_exact`).
      reading: Runs the steps of datasets the workers read from a tf.data
        service (`service_input`), if the strategy has one.
    """

    def __init__(
        self,
        strategy: tf.distribute.Strategy,
        model: Any,
        runner: StepRunner,
        *,
        exact_counters: Callable[[Sequence[Any]], None],
        reading: service_input.ReadingSteps | None = None,
    ) -> None:
        self._strategy = strategy
        self._model = model
        self._runner = runner
        self._reading = reading
        # Passes the workers read from the service, by kind, and the kind
        # of the latest steps (whose loop the next barrier ends).
        self._passes: dict[str, weakref.WeakSet[service_input.ServiceIterator]] = (
            collections.defaultdict(weakref.WeakSet)
        )
        self._latest_kind: str | None = None
        self._keras3 = keras_ps.is_keras3_model(model)
        self._exact_counters = exact_counters
        self._compiled: dict[tuple[str, str], Callable[..., Any]] = {}
        self._functions: dict[str, Callable[[Any], Any]] = {}
        self._logs: dict[str, Any] | None = None
        # The latest step whose logs are wanted (fetched once it finishes),
        # and when it was submitted.
        self._logs_due: Any = None
        self._logs_asked_s = 0.0
        keras_ps.install_functions(
            model,
            self,
            train=lambda iterator: self._run_steps("train", iterator),
            test=lambda iterator: self._run_steps("test", iterator),
            predict=self._predict,
            metrics_barrier=self.wait_all,
        )

    def wait_all(self) -> None:
        """Waits for every step in flight (the epoch barrier).

        Then, for the loop that is ending (the kind of the latest steps),
        settles its passes over a tf.data service: their steps train on as
        many batches as they asked for, and a pass asked for all of its
        batches trains on every one (`service_input.ReadingSteps.settle`).
        """
        self._runner.wait_all()
        kind = self._latest_kind
        if self._reading is not None and kind is not None:
            for iterator in list(self._passes[kind]):
                if not iterator.drained:
                    self._reading.settle(iterator, self._reading_function(kind, iterator, 1))
        self._logs = self._logs_due = None

    def wait_for_steps(self) -> None:
        """Waits for every step in flight, and only that (no pass is settled)."""
        self._runner.wait_all()

    def _variables(self) -> list[Any]:
        model = self._model
        found = list(model.variables) + list(getattr(model, "metrics_variables", ()))
        optimizer = getattr(model, "optimizer", None)
        if optimizer is not None:
            found += list(getattr(optimizer, "variables", ()))
        return found

    def _before_trace(self) -> None:
        if self._keras3:  # tf-keras's counters are atomic (and an unbuilt
            # model's `variables` raise there: the trace builds it).
            self._exact_counters(self._variables())

    def _function(self, kind: str, batches: tuple[Any, ...]) -> Callable[..., Any]:
        key, specs = _signature(batches)
        # Recorded steps take small batches packed with their ticket; a
        # large call goes unpacked (a trace of its own).
        pack = input_packing.small_enough(batches)
        key = f"{key} packed={pack}"
        compiled = self._compiled.get((kind, key))
        if compiled is None:
            self._before_trace()
            if kind not in self._functions:
                self._functions[kind] = self._runner.compile(kind, self._model, self._keras3)
            function: Any = self._functions[kind]
            with self._strategy.scope():
                if isinstance(function, step_ledger.RecordedFunction):
                    compiled = function.get_concrete_function(specs, pack=pack)
                else:
                    compiled = function.get_concrete_function(specs)
            self._compiled[(kind, key)] = compiled
        return compiled

    def _reading_function(
        self, kind: str, iterator: service_input.ServiceIterator, count: int
    ) -> Callable[..., Any]:
        assert self._reading is not None
        spec = self._reading.reader_spec(iterator.readers())
        key = (f"read-{kind}", f"{count}:{spec!r}")
        compiled = self._compiled.get(key)
        if compiled is None:
            self._before_trace()
            function = self._reading.compile(kind, self._model, count, keras3=self._keras3)
            with self._strategy.scope():
                compiled = function.get_concrete_function(spec)
            self._compiled[key] = compiled
        return compiled

    def _run_steps(self, kind: str, iterator: Any) -> Any:
        count = keras_ps.steps_per_execution(self._model)
        self._latest_kind = kind
        now = time.monotonic()
        # One step's logs asked for at a time (a newer one asked for before
        # the last finished would never be the one finishing).
        wanted = self._logs is None or (
            self._logs_due is None and now - self._logs_asked_s >= _LOGS_INTERVAL_S
        )
        if isinstance(iterator, service_input.ServiceIterator):
            assert self._reading is not None
            if iterator.exhausted:  # As a dataset's iterator at its end.
                raise StopIteration
            synchronous = False
            # Its result (what it read) always comes back, logs included.
            handle = self._reading.submit(
                iterator, self._reading_function(kind, iterator, count), count
            )
            self._passes[kind].add(iterator)
        else:
            synchronous = (
                not isinstance(iterator, ChiefIterator)
                or iterator.synchronous
                or (kind == "train" and self._runner.blocks_on_steps)
            )
            wanted = wanted or synchronous
            batches = _pull(iterator, count)
            handle = self._runner.submit(
                self._function(kind, batches), batches, count, logs_wanted=wanted
            )
        if wanted:
            self._logs_due, self._logs_asked_s = handle, now
        if synchronous or self._logs is None:
            self._logs = self._logs_of(handle)
            self._runner.finished()
            self._logs_due = None
        else:
            self._take_finished()
        return self._logs

    def _take_finished(self) -> None:
        """Clears the runner's finished steps; takes the logs of the one asked for, if among them."""
        finished = self._runner.finished()
        if self._logs_due is not None and any(h is self._logs_due for h in finished):
            self._logs = self._logs_of(self._logs_due)
            self._logs_due = None

    def _logs_of(self, handle: Any) -> Any:
        """A finished step's logs; for a step not run again (None), the latest logs known."""
        logs = self._runner.result(handle)
        if isinstance(logs, service_input.Read):  # Read from a service.
            # Nothing read: no step ran, the logs are not a step's.
            logs = logs.logs if int(logs.batches) > 0 or self._logs is None else self._logs
        if logs is not None:
            return logs
        if self._logs is not None:
            return self._logs
        return self._model.get_metrics_result()  # After the barrier it installs.

    def _predict(self, data: Any) -> Any:
        count = keras_ps.steps_per_execution(self._model)
        if isinstance(data, ChiefIterator):  # tf-keras: the iterator.
            batches = _pull(data, count)
        else:  # Keras 3: a list of batches it pulled itself.
            batches = tuple(data)
        handle = self._runner.submit(
            self._function("predict", batches), batches, max(count, len(batches))
        )
        outputs = self._runner.result(handle)
        self._take_finished()
        return outputs


def wait_for_steps(model: Any) -> None:
    """Blocks until every step of `model` scheduled so far has finished; nothing if none can be.

    For a model whose loops tfdist's parameter-server strategy runs: its
    weights then hold every step Keras has counted (`tfdist.elastic` commits
    after it). Bounded as the epoch barrier (each step by `timeout_s`);
    raises what a failed step raised. Any other model: returns at once.
    """
    loop = keras_ps.installed_owner(model)
    if isinstance(loop, KerasLoop):
        loop.wait_for_steps()
