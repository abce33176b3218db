"""Parameter-server training: `tfdist.ParameterServerStrategy` and its machinery.

Modules, one job each:

- `strategy`: the strategy class (imported by `tfdist.ParameterServerStrategy`);
- `roles`: what each TF_CONFIG task does (the chief trains; workers and ps
  tasks serve), start-up bounded.
- `serving_notice`: a ps task's SIGTERM posted on its host, where the
  chief's `Elastic` finds it with a remote op.
- `scheduler`: `StepScheduler`, steps queued on free workers with every
  wait of the chief bounded.
- `async_runner`: asynchronous steps (each applied when it arrives).
- `sync_runner`: synchronous steps (each batch split over the workers,
  gradients summed, applied once).
- `keras_loop`: Keras's `fit`/`evaluate`/`predict` on the cluster.
- `service_input`: workers reading their batches from a tf.data service
  (`input_service=`) instead of receiving them from the chief.
- `step_ledger`: which scheduled steps finished, so that a failed worker's
  finished step is not run again.
- `update_gate`: each update of a step applied once, so that a step cut
  short and run again applies only what had not landed.
- `partitioning`: how variables are split over the ps tasks (by bytes by
  default).
"""

from __future__ import annotations

__all__: list[str] = []
