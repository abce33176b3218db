"""Preemption and resumption at a step: `Elastic`, a Keras callback.

    model.fit(dataset, epochs=10, callbacks=[tfdist.elastic.Elastic(backup_dir)])

SIGTERM to any task (a Kubernetes or spot preemption, or `tfdist-launch`
forwarding its own) makes every task of the job stop at the same step
boundary, commit the model, its optimizer and the position, and exit with
status 143 (`tfdist.errors.PREEMPTED_EXIT_CODE`); the next run resumes at
that step, with the examples of the epoch not yet trained, exactly once.

Modules, one job each:

- `notice`: SIGTERM turned into a flag read at step boundaries.
- `agreement`: the step at which every task stops (TF's coordination
  service; no collective per step).
- `training_state`: the committed state (atomic commits, chief-written),
  and the states a lost peer's survivors write.
- `last_step`: each step's state kept in memory under tfdist's
  `MultiWorkerMirroredStrategy` (at most `last_step.COST_SHARE` of the
  time), for the survivors of a lost peer to save.
- `callback`: `Elastic`, the Keras callback that ties them to `fit`.

Where the input resumes is `tfdist.data.distributed.resume`.
"""

from tfdist.elastic.callback import Elastic

__all__ = ["Elastic"]
