"""Asynchronous steps: each scheduled on the next free worker, applied when it arrives.

A step function for `k` batches (Keras's `steps_per_execution`) is one
compiled function, run on one worker:

    steps(batches):                       # on worker w, one closure
        for batch in batches:             # k steps, one after another
            logs = strategy.run(model.train_step, (batch,))
                # reads the variables from the ps tasks, computes the
                # gradients on w, sends each update to the ps owning the
                # variable (applied there as it arrives: no lock, no
                # barrier; another worker's update may land in between)
        return logs                       # the last step's

Training and evaluation steps are recorded in the `step_ledger` once they
finish, so a step whose worker fails after it finished is not run again.

Keras's own `train_step` (or the user's override) runs unchanged; tf-keras
step counters are incremented as tf-keras's own functions do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tfdist._internal import keras_ps
from tfdist.parameter_server import scheduler as scheduler_lib
from tfdist.parameter_server import step_ledger
from tfdist.parameter_server import update_gate

__all__ = ["AsyncRunner"]

_STEP_METHODS = {"train": "train_step", "test": "test_step", "predict": "predict_step"}


def concat_outputs(outputs: list[Any]) -> Any:
    """Per-batch predict outputs joined along the batch axis (as Keras does)."""
    if len(outputs) == 1:
        return outputs[0]

    def join(*parts: Any) -> Any:
        if parts[0].shape.rank == 0:
            return tf.stack(parts)
        return tf.concat(parts, axis=0)

    return tf.nest.map_structure(join, *outputs)


def step_body(strategy: tf.distribute.Strategy, kind: str, model: Any) -> Callable[[Any], Any]:
    """One step of `kind` on one batch, as Keras's compiled function runs it."""
    step_fn = getattr(model, _STEP_METHODS[kind])

    def one_step(batch: Any) -> Any:
        outputs = strategy.run(step_fn, args=(batch,))
        keras_ps.increment_step_counter(model, kind, 1)
        return outputs

    return one_step


class AsyncRunner:
    """Runs Keras steps on the workers through a `StepScheduler`.

    Args:
      strategy: The parameter-server strategy (its `run` is called on the
        worker, inside the scheduled function).
      scheduler: Where the steps are queued.
      gate: The strategy's update gate (each recorded step's updates
        applied once), or None.

    Attributes:
      ledger: Where train and test steps record finishing.
    """

    def __init__(
        self,
        strategy: tf.distribute.Strategy,
        scheduler: scheduler_lib.StepScheduler,
        gate: update_gate.UpdateGate | None = None,
    ) -> None:
        self._strategy = strategy
        self._scheduler = scheduler
        self.blocks_on_steps = False  # Steps run ahead; logs are read now and then.
        self.ledger = step_ledger.StepLedger(strategy, gate)

    def compile(self, kind: str, model: Any, keras3: bool) -> Any:
        one_step = step_body(self._strategy, kind, model)

        def steps(batches: tuple[Any, ...]) -> Any:
            outputs = [one_step(batch) for batch in batches]
            if kind == "predict":
                return concat_outputs(outputs)
            return outputs[-1]

        # Keras 3 compiles its step without autograph; tf-keras with it.
        if kind == "predict":  # Updates nothing: a re-run is harmless.
            return tf.function(steps, autograph=not keras3)
        return self.ledger.function(steps, autograph=not keras3)

    def submit(
        self,
        function: Callable[[Any], Any],
        batches: tuple[Any, ...],
        steps_per_function: int,
        *,
        logs_wanted: bool = True,
    ) -> Any:
        with self._strategy.scope():
            return self._scheduler.schedule(
                function,
                (batches,),
                num_steps=len(batches),
                steps_per_function=steps_per_function,
                keep_outputs=logs_wanted,
            )

    def result(self, handle: Any) -> Any:
        return self._scheduler.result(handle)

    def finished(self) -> list[Any]:
        return self._scheduler.finished()

    def wait_all(self) -> None:
        self._scheduler.wait_all()
