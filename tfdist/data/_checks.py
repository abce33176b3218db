"""Argument checks of `tfdist.data.shard`, in tfdist's error-message form.

Each check raises `TypeError` for a wrong type and `ConfigError` for a wrong
value, naming the value received and the fix. Except where noted (element
specs), they run before `shard` touches the TF runtime.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from tfdist import errors
from tfdist import _validation as validation
from tfdist.data import _plan

# `Any` below: a nested structure (tuple/dict) of tensors or specs.
Nested = Any

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1


def check_seed(seed: object) -> int:
    """Returns `seed` if it is an int in the int64 range."""
    seed = validation.check_int("seed", seed)
    if not _INT64_MIN <= seed <= _INT64_MAX:
        raise errors.ConfigError(
            f"seed must fit in int64; received seed={seed!r}. Pass an int in "
            f"[{_INT64_MIN}, {_INT64_MAX}]."
        )
    return seed


def check_source(dataset: object) -> tf.data.Dataset | tuple[str, ...]:
    """Returns the dataset, or the file paths as a tuple of str."""
    if isinstance(dataset, tf.data.Dataset):
        return dataset
    if isinstance(dataset, (str, bytes, os.PathLike)) or not isinstance(
        dataset, Sequence
    ):
        raise TypeError(
            "dataset must be a tf.data.Dataset or a sequence of file paths; "
            f"received dataset={dataset!r} of type {type(dataset).__name__}. "
            "Wrap a single path in a list: [path]."
        )
    paths = []
    for path in dataset:
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(
                f"file paths must be str or os.PathLike; received {path!r} "
                f"of type {type(path).__name__} in dataset."
            )
        paths.append(os.fspath(path))
    if not paths:
        raise errors.ConfigError(
            "dataset is an empty list of files; received dataset=[]. Pass at "
            "least one file path (check the glob that produced the list)."
        )
    return tuple(paths)


def check_input_context(input_context: object) -> tuple[int, int, int]:
    """Returns (num_replicas_in_sync, num_input_pipelines, input_pipeline_id).

    `None` means one pipeline feeding one replica.
    """
    if input_context is None:
        return 1, 1, 0
    if not isinstance(input_context, tf.distribute.InputContext):
        raise TypeError(
            "input_context must be a tf.distribute.InputContext or None; "
            f"received input_context={input_context!r} of type "
            f"{type(input_context).__name__}. Pass the argument the strategy "
            "gives your dataset_fn."
        )
    num_replicas = input_context.num_replicas_in_sync
    num_pipelines = input_context.num_input_pipelines
    pipeline_id = input_context.input_pipeline_id
    validation.check_positive_int("num_replicas_in_sync", num_replicas)
    validation.check_positive_int("num_input_pipelines", num_pipelines)
    if num_replicas % num_pipelines:
        raise errors.ConfigError(
            f"num_replicas_in_sync={num_replicas} is not divisible by "
            f"num_input_pipelines={num_pipelines}; every input pipeline must "
            "feed the same number of replicas. Give every worker the same "
            "number of devices."
        )
    if not 0 <= pipeline_id < num_pipelines:
        raise errors.ConfigError(
            f"input_pipeline_id={pipeline_id} is out of range for "
            f"num_input_pipelines={num_pipelines}. Expected 0 <= id < "
            f"{num_pipelines}."
        )
    return num_replicas, num_pipelines, pipeline_id


def check_layout(
    input_context: object, global_batch_size: object
) -> _plan.ReplicaLayout:
    """Validates the replica layout and the global batch size."""
    num_replicas, num_pipelines, pipeline_id = check_input_context(input_context)
    batch_size = validation.check_positive_int(
        "global_batch_size", global_batch_size
    )
    validation.check_batch_divides("global_batch_size", batch_size, num_replicas)
    return _plan.ReplicaLayout(
        num_replicas_in_sync=num_replicas,
        num_input_pipelines=num_pipelines,
        input_pipeline_id=pipeline_id,
        per_replica_batch_size=batch_size // num_replicas,
    )


def check_file_options(
    files: tuple[str, ...] | None,
    parse_fn: Callable[..., Nested] | None,
    reader: Callable[[tf.Tensor], tf.data.Dataset] | None,
) -> Callable[[tf.Tensor], tf.data.Dataset]:
    """Validates parse_fn/reader; returns the reader to use."""
    options: tuple[tuple[str, object], ...] = (
        ("parse_fn", parse_fn),
        ("reader", reader),
    )
    for name, value in options:
        if value is None:
            continue
        if files is None:
            raise errors.ConfigError(
                f"{name} applies to file paths only, but a tf.data.Dataset "
                f"was passed with {name}={value!r}. Map the dataset yourself "
                "before sharding, or pass the file paths."
            )
        if not callable(value):
            raise TypeError(
                f"{name} must be callable; received {name}={value!r} of type "
                f"{type(value).__name__}."
            )
    return tf.data.TFRecordDataset if reader is None else reader


def check_enough_files(
    files: tuple[str, ...], layout: _plan.ReplicaLayout
) -> None:
    """File policy: at least one file per input pipeline."""
    if len(files) < layout.num_input_pipelines:
        raise errors.ConfigError(
            f"policy='file' needs at least one file per input pipeline; "
            f"received {len(files)} files for num_input_pipelines="
            f"{layout.num_input_pipelines}. Split the data into at least "
            f"{layout.num_input_pipelines} files, or use policy='element' "
            "(every pipeline then reads all files) or policy='auto'."
        )


def check_pad_structure(element_spec: Nested) -> None:
    """With remainder='pad', elements must be (x, y) or (x, y, weight)."""
    if not isinstance(element_spec, tuple) or len(element_spec) not in (2, 3):
        raise errors.ConfigError(
            "remainder='pad' adds a sample weight, so elements must be "
            "tuples (x, y) or (x, y, sample_weight); received elements with "
            f"spec {element_spec!r}. Map them to (x, y) (e.g. "
            "lambda x: (x, x) for an autoencoder), or use remainder='drop' or "
            "'error'."
        )
    if len(element_spec) == 3:
        for spec in tf.nest.flatten(element_spec[2]):
            if not (spec.dtype.is_floating or spec.dtype.is_integer):
                raise errors.ConfigError(
                    "sample_weight (element[2]) must be numeric; received "
                    f"spec {spec!r}. Cast it to float32."
                )


def check_start_step(start_step: int, num_steps: int, epoch: int) -> None:
    """`start_step` may be at most the first epoch's step count."""
    if start_step > num_steps:
        raise errors.ConfigError(
            f"start_step={start_step} is past the end of epoch {epoch}, "
            f"which has {num_steps} global steps. Pass a step in "
            f"[0, {num_steps}], or resume at the next epoch."
        )


def check_dense_elements(element_spec: Nested) -> None:
    """Raises ConfigError unless every component is a dense tensor."""
    for spec in tf.nest.flatten(element_spec):
        if not isinstance(spec, tf.TensorSpec):
            raise errors.ConfigError(
                f"dataset elements must be dense tensors; found a component "
                f"with spec {spec!r}. Convert it first, e.g. "
                "dataset.map(lambda x, y: (x.to_tensor(), y)) for ragged or "
                "tf.sparse.to_dense for sparse components."
            )
