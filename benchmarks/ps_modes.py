"""Parameter-server modes: time to a target accuracy on digits (async, bounded staleness, sync).

    python benchmarks/ps_modes.py [--target=0.95] [--max_epochs=40] [--mode_rounds=2]

Each run is its own process (`tfdist.testing.run_local_cluster`, one task)
holding an in-process cluster of 2 workers and 2 ps, training
examples/digits.py's model (MLP 128-64, Adam 3e-3, batch 64) on its data
through `model.fit` under `tfdist.ParameterServerStrategy` in one mode, and
one device (no strategy) as the reference. After each epoch the clock
stops, the model is evaluated on the test split, and the run ends once its
accuracy reaches the target: the time reported is training time only
(tracing included), summed over the epochs it took. TF's strategies offer
no bounded-staleness or synchronous mode behind `fit` to compare with.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Sequence

from absl import app
from absl import flags

from tfdist.testing import run_local_cluster

_TARGET = flags.DEFINE_float("target", 0.95, "Test accuracy to reach.", lower_bound=0.0)
_MAX_EPOCHS = flags.DEFINE_integer("max_epochs", 40, "Give up after this many.", lower_bound=1)
_MODE_ROUNDS = flags.DEFINE_integer("mode_rounds", 2, "Runs per configuration.", lower_bound=1)

BATCH_SIZE = 64
#: name -> (mode, max_staleness); mode None: one device, no strategy.
CONFIGURATIONS = {
    "one device": (None, None),
    "async (unbounded)": ("async", None),
    "async, max_staleness=4": ("async", 4),
    "async, max_staleness=0": ("async", 0),
    "sync": ("sync", None),
}
_EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def measure(mode: str | None, max_staleness: int | None, target: float,
            max_epochs: int) -> tuple[float | None, int, float]:
    """Runs in the child: (training seconds to target or None, epochs, final accuracy)."""
    import tensorflow as tf

    import tfdist

    sys.path.insert(0, _EXAMPLES)
    import digits  # examples/digits.py: its data and model.

    keras = tf.keras
    (x_train, y_train), (x_test, y_test) = digits.load_data(None)
    if mode is None:
        strategy = tf.distribute.get_strategy()
    else:
        config = tfdist.testing.start_local_ps_cluster(num_workers=2, num_ps=2)
        strategy = tfdist.ParameterServerStrategy(config, mode=mode, max_staleness=max_staleness)
    with strategy.scope():
        model = digits.build_model(x_train.shape[1], 10, 3e-3)

    class UntilTarget(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.seconds, self.accuracy, self.reached = 0.0, 0.0, None

        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.seconds += time.perf_counter() - self.start
            _, self.accuracy = self.model.evaluate(x_test, y_test, batch_size=256, verbose=0)
            if self.accuracy >= target and self.reached is None:
                self.reached = self.seconds
                self.model.stop_training = True

    clock = UntilTarget()
    history = model.fit(x_train, y_train, batch_size=BATCH_SIZE, epochs=max_epochs, verbose=0,
                        callbacks=[clock])
    return clock.reached, len(history.history["loss"]), float(clock.accuracy)


def main(argv: Sequence[str]) -> None:
    del argv
    results: dict[str, list[tuple[float | None, int, float]]] = {}
    for round_index in range(_MODE_ROUNDS.value):
        for name, (mode, staleness) in CONFIGURATIONS.items():
            (result,) = run_local_cluster(
                measure, num_workers=1,
                args=(mode, staleness, _TARGET.value, _MAX_EPOCHS.value), timeout_s=900,
            )
            results.setdefault(name, []).append(result)
            seconds, epochs, accuracy = result
            shown = "not reached" if seconds is None else f"{seconds:.1f} s"
            print(f"round {round_index + 1}: {name}: {shown} in {epochs} epoch(s), "
                  f"accuracy {accuracy:.4f}", flush=True)
    print(f"\n| configuration | seconds to {_TARGET.value:.2f} (median) | epochs (median) | runs |")
    print("|---|---|---|---|")
    for name, runs in results.items():
        reached = [s for s, _, _ in runs if s is not None]
        seconds = f"{statistics.median(reached):.1f}" if len(reached) == len(runs) else "not reached"
        epochs = statistics.median(e for _, e, _ in runs)
        shown = ", ".join("-" if s is None else f"{s:.1f} s / {e}" for s, e, _ in runs)
        print(f"| {name} | {seconds} | {epochs:g} | {shown} |")


if __name__ == "__main__":
    app.run(main)
