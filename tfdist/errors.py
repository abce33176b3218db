"""The exceptions tfdist raises on purpose.

Every error tfdist raises deliberately is a `TfdistError`. Messages follow one
form: what is wrong, the value received (`name=<repr>`), what was expected,
and how to fix it.

Hierarchy::

    TfdistError(Exception)
     +-- ConfigError(TfdistError, ValueError)        bad user-supplied setting
     |    +-- ClusterConfigError                     bad TF_CONFIG / ClusterSpec
     |    +-- DeviceConfigError                      bad device list / count
     |    +-- LauncherError                          bad launcher arguments
     |    +-- PlacementError                         a layer placement that
     |                                               cannot apply to the model
     |    +-- LayoutError                            a device mesh or a layout
     |                                               that does not fit
     +-- CollectiveError(TfdistError, RuntimeError)  a collective failed
     |    +-- WorkerUnavailableError                 a peer task is lost
     |    +-- CollectiveTimeoutError                 a wait ran past timeout_s
     +-- TooFewWorkersError(TfdistError, RuntimeError)  an elastic job fell
                                                     below its minimum
    TrainingPreempted(SystemExit)                    training stopped on a
                                                     preemption notice, its
                                                     state saved (exit 143)

This module imports nothing from TensorFlow, so it is safe to import
anywhere, including in processes that never start the TF runtime.
"""

from __future__ import annotations

__all__ = [
    "ClusterConfigError",
    "CollectiveError",
    "CollectiveTimeoutError",
    "ConfigError",
    "DeviceConfigError",
    "LauncherError",
    "LayoutError",
    "PlacementError",
    "TfdistError",
    "TooFewWorkersError",
    "TrainingPreempted",
    "WorkerUnavailableError",
]

#: The exit status of a task that stopped on a preemption notice after
#: saving its state (`TrainingPreempted`): 128 + SIGTERM, as a shell shows a
#: process ended by SIGTERM, and in the range Kubeflow's `ExitCode` restart
#: policy retries.
PREEMPTED_EXIT_CODE = 143


class TfdistError(Exception):
    """Base class for every error tfdist raises on purpose.

    Instances pickle with their attributes (e.g. `task`, `field`), so an
    error raised in a child process arrives whole in its parent.
    """

    # TF's autograph re-raises an error from a function it converts (e.g.
    # tf-keras's train step) as its own StagingError unless the error has
    # this attribute; tfdist's messages already say what is wrong.
    ag_pass_through = True

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), self.args, self.__dict__ or None)


class ConfigError(TfdistError, ValueError):
    """A user-supplied setting is invalid; the message says how to fix it."""


class ClusterConfigError(ConfigError):
    """TF_CONFIG or a cluster spec is malformed or inconsistent.

    Attributes:
      field: Dotted path of the offending field in TF_CONFIG, for example
        `"task.index"` or `"cluster.worker[1]"`, or `None` when the whole
        document is at fault.
    """

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class DeviceConfigError(ConfigError):
    """A device list or logical-device count is invalid or cannot be applied."""


class LauncherError(ConfigError):
    """The local launcher was given arguments it cannot run."""


class PlacementError(ConfigError):
    """A layer placement cannot be applied to the model it meets.

    Raised when a strategy plans a model (at its first step, or when asked):
    a placement map naming layers the model lacks, more stages than layers,
    a step that cannot be split into microbatches.
    """


class LayoutError(ConfigError):
    """A device mesh or a variable's layout does not fit what it meets.

    Raised by `tfdist.MeshStrategy` before training: a mesh whose size is not
    the number of its devices, a layout or `batch_dim_name` naming an axis
    the mesh lacks, a sharded dimension its mesh axis does not divide.
    """


class CollectiveError(TfdistError, RuntimeError):
    """A collective or cross-worker wait failed at run time.

    Attributes:
      task: The peer task involved, as `"worker:1"`, or `None` if unknown.
    """

    def __init__(self, message: str, *, task: str | None = None) -> None:
        super().__init__(message)
        self.task = task


class WorkerUnavailableError(CollectiveError):
    """A peer task became unreachable; `task` names it."""


class CollectiveTimeoutError(CollectiveError):
    """A cross-worker wait did not complete within its `timeout_s`."""


class TooFewWorkersError(TfdistError, RuntimeError):
    """An elastic job (`tfdist-launch --workers MIN:MAX`) has fewer workers left than MIN.

    Carried by the launcher's `JobResult.error` (its job ended `FAILED`) and
    printed by `tfdist-launch` as its last line.

    Attributes:
      task: The lost task that left the job short, as `"worker:2"`, or
        `None` when a slots file granted too few.
    """

    def __init__(self, message: str, *, task: str | None = None) -> None:
        super().__init__(message)
        self.task = task


class TrainingPreempted(SystemExit):
    """Training stopped at a step boundary on a preemption notice, its state saved.

    Raised by `tfdist.elastic.Elastic` from inside `fit` once every task has
    committed its state. It is a `SystemExit` (not a `TfdistError`): left
    uncaught, the process exits quietly with status `PREEMPTED_EXIT_CODE`
    (143), which `tfdist-launch` reads as "preempted, resumable", and a
    broad `except Exception` in user code does not swallow it.

    Attributes:
      epoch: The epoch training stopped in (0-based).
      step: Steps of that epoch done and saved.
    """

    def __init__(self, message: str, *, epoch: int = 0, step: int = 0) -> None:
        super().__init__(PREEMPTED_EXIT_CODE)
        self.message = message
        self.epoch = epoch
        self.step = step

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.message,), {"epoch": self.epoch, "step": self.step})
