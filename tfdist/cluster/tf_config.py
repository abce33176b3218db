"""Parses TF_CONFIG into a validated, immutable `ClusterConfig`.

`parse_tf_config()` is the only place in tfdist that reads the `TF_CONFIG`
environment variable; everything else receives the `ClusterConfig` it
returns. It accepts the same documents as TensorFlow's
`TFConfigClusterResolver`, checked strictly:

    {"cluster": {"chief": ["host0:2222"], "worker": ["host1:2222"],
                 "ps": ["host2:2222"]},
     "task": {"type": "worker", "index": 0},
     "rpc_layer": "grpc"}

- No TF_CONFIG, an empty or all-whitespace one, or an object with neither
  `"cluster"` nor `"task"` is a single process: `ClusterConfig.local()`.
- `"cluster"` and `"task"` come together; `"rpc_layer"` defaults to
  `"grpc"`.
- Other top-level keys, and other keys of `"task"`, are ignored, as
  TensorFlow ignores them: orchestrators add their own (`"environment"`,
  Vertex AI's `"job"` and `"task.trial"`). A key that is a near miss of a
  known one (`"Cluster"`, `"rpclayer"`) is reported instead, so a typo
  cannot silently turn a cluster into a single process.
- Indices are JSON integers; strings, floats and booleans are rejected.
  JSON must be standard: `NaN`, `Infinity` and repeated keys are rejected.

Whatever the input, the only exception raised for a bad document is
`ClusterConfigError`, whose `field` names the offending TF_CONFIG path.
Input is bounded: text longer than `MAX_TF_CONFIG_CHARS` and nesting deeper
than Python's recursion limit are rejected rather than parsed.

This module imports nothing from TensorFlow.
"""

from __future__ import annotations

import difflib
import json
import os
import typing
from collections.abc import Mapping
from collections.abc import Sequence

from tfdist import errors
from tfdist.cluster import _format
from tfdist.cluster import spec

__all__ = ["MAX_TF_CONFIG_CHARS", "TF_CONFIG_ENV_VAR", "parse_tf_config"]

#: The environment variable TensorFlow and tfdist read the cluster from.
TF_CONFIG_ENV_VAR = "TF_CONFIG"

#: Longest TF_CONFIG text accepted: 8 times Linux's 128 KiB limit on one
#: environment string, room for clusters of thousands of tasks.
MAX_TF_CONFIG_CHARS = 1 << 20

_EXAMPLE = (
    '{"cluster": {"worker": ["127.0.0.1:2222"]}, '
    '"task": {"type": "worker", "index": 0}}'
)
_TOP_LEVEL_KEYS = ("cluster", "task", "rpc_layer")
_TASK_KEYS = ("type", "index")
# Keys longer than this are never typos of a known key; skips difflib on them.
_MAX_TYPO_KEY_CHARS = 32
_TYPO_CUTOFF = 0.8

_R = _format.short_repr


def parse_tf_config(
    value: str | Mapping[str, object] | None = None,
) -> spec.ClusterConfig:
    """Parses and validates TF_CONFIG.

    Args:
      value: TF_CONFIG as JSON text, or as an already-decoded mapping (values
        are JSON types: dict, list, str, int, float, bool, None). `None`
        reads the `TF_CONFIG` environment variable.

    Returns:
      The frozen config. An unset, empty or all-whitespace TF_CONFIG, or a
      document with neither "cluster" nor "task", gives
      `ClusterConfig.local()` (with the document's "rpc_layer", if any).

    Raises:
      TypeError: If `value` is not a str, a mapping or None.
      ClusterConfigError: If TF_CONFIG is not a JSON object, or any part of it
        is malformed or inconsistent; `err.field` is the dotted path of the
        offending value, such as `"task.index"` or `"cluster.worker[1]"`.

    Example:
      >>> config = parse_tf_config(
      ...     '{"cluster": {"worker": ["h0:2222", "h1:2222"]},'
      ...     ' "task": {"type": "worker", "index": 1}}'
      ... )
      >>> config.task.name, config.is_chief
      ('worker:1', False)
    """
    if value is None:
        value = os.environ.get(TF_CONFIG_ENV_VAR, "")
    if isinstance(value, str):
        if not value.strip():
            return spec.ClusterConfig.local()
        document: object = _load_json(value)
    elif isinstance(value, Mapping):
        document = value
    else:
        raise TypeError(
            "parse_tf_config() takes TF_CONFIG as a str, a mapping or None; "
            f"received value={_R(value)} of type {type(value).__name__}. "
            "Decode bytes to str first."
        )
    return _config_from_document(document)


def _load_json(text: str) -> object:
    """Decodes `text`; every decoding failure becomes ClusterConfigError."""
    if len(text) > MAX_TF_CONFIG_CHARS:
        raise errors.ClusterConfigError(
            f"TF_CONFIG is {len(text)} characters long, starting "
            f"{_R(text[:40])}; expected at most {MAX_TF_CONFIG_CHARS}. Check "
            "that TF_CONFIG holds only the cluster, task and rpc_layer."
        )
    try:
        return json.loads(
            text,
            object_pairs_hook=_object_without_repeated_keys,
            parse_constant=_reject_constant,
        )
    except errors.ClusterConfigError:
        raise
    except json.JSONDecodeError as e:
        raise errors.ClusterConfigError(
            f"TF_CONFIG is not valid JSON ({e.msg} at position {e.pos}): "
            f"{_R(text[:80])}. Expected e.g. {_EXAMPLE}."
        ) from e
    except RecursionError as e:
        raise errors.ClusterConfigError(
            f"TF_CONFIG nests JSON too deeply to decode: {_R(text[:80])}. "
            f"Expected a shallow object, e.g. {_EXAMPLE}."
        ) from e
    except ValueError as e:  # Integers too long for Python's int parsing.
        raise errors.ClusterConfigError(
            f"TF_CONFIG holds a value JSON cannot decode ({e}): "
            f"{_R(text[:80])}. Expected e.g. {_EXAMPLE}."
        ) from e


def _object_without_repeated_keys(
    pairs: list[tuple[str, object]],
) -> dict[str, object]:
    result: dict[str, object] = {}
    for key, item in pairs:
        if key in result:
            raise errors.ClusterConfigError(
                f"TF_CONFIG repeats the key {_R(key)} in one JSON object; "
                "expected each key once, since JSON decoders keep only one "
                "of the values. Remove the duplicate."
            )
        result[key] = item
    return result


def _reject_constant(constant: str) -> object:
    raise errors.ClusterConfigError(
        f"TF_CONFIG contains {constant}, which is not standard JSON; "
        f"expected numbers, strings, lists and objects, e.g. {_EXAMPLE}. "
        f"Replace {constant} with a number or a string."
    )


def _check_keys(
    document: Mapping[object, object], *, where: str, known: Sequence[str]
) -> None:
    """Rejects non-str keys and near misses of `known` keys in `document`."""
    for key in document:
        if not isinstance(key, str):
            raise errors.ClusterConfigError(
                f"{where} has key {_R(key)} of type {type(key).__name__}; "
                "expected JSON object keys, which are strings. Use str keys.",
                field=where if where != "TF_CONFIG" else None,
            )
        if key in known or len(key) > _MAX_TYPO_KEY_CHARS:
            continue
        folded = key.lower().replace("-", "_").replace(" ", "_")
        matches = [
            k for k in known if k == folded
        ] or difflib.get_close_matches(folded, known, n=1, cutoff=_TYPO_CUTOFF)
        if matches:
            path = (
                matches[0] if where == "TF_CONFIG" else f"{where}.{matches[0]}"
            )
            raise errors.ClusterConfigError(
                f"{where} has key {key!r}, which tfdist would ignore; "
                f"expected {matches[0]!r}. Rename the key to {matches[0]!r}.",
                field=path,
            )


def _config_from_document(document: object) -> spec.ClusterConfig:
    if not isinstance(document, Mapping):
        raise errors.ClusterConfigError(
            f"TF_CONFIG must be a JSON object; received a JSON "
            f"{_json_type(document)}: {_R(document)}. Expected e.g. "
            f"{_EXAMPLE}."
        )
    _check_keys(document, where="TF_CONFIG", known=_TOP_LEVEL_KEYS)
    rpc_layer = document.get("rpc_layer", spec.DEFAULT_RPC_LAYER)
    if not isinstance(rpc_layer, str):
        raise errors.ClusterConfigError(
            f"rpc_layer={_R(rpc_layer)} is a JSON {_json_type(rpc_layer)}; "
            f"expected a string such as {spec.DEFAULT_RPC_LAYER!r}. Quote "
            "it, or omit rpc_layer.",
            field="rpc_layer",
        )
    if "cluster" not in document and "task" not in document:
        return spec.ClusterConfig.local(rpc_layer=rpc_layer)
    if "cluster" not in document:
        raise errors.ClusterConfigError(
            f"TF_CONFIG has task={_R(document['task'])} but no cluster; "
            f"expected both, e.g. {_EXAMPLE}. Add the cluster, or remove "
            "the task to run a single process.",
            field="cluster",
        )
    cluster = spec.ClusterSpec(_jobs_from_document(document["cluster"]))
    if "task" not in document:
        raise errors.ClusterConfigError(
            f"TF_CONFIG has cluster={_R(document['cluster'])} but no task; "
            f"expected both, e.g. {_EXAMPLE}. Add the task this process "
            "runs.",
            field="task",
        )
    task = _task_from_document(document["task"])
    return spec.ClusterConfig(cluster=cluster, task=task, rpc_layer=rpc_layer)


def _jobs_from_document(raw: object) -> dict[str, list[str]]:
    """Checks the JSON types of TF_CONFIG's "cluster" value."""
    if not isinstance(raw, Mapping):
        raise errors.ClusterConfigError(
            f"cluster={_R(raw)} is a JSON {_json_type(raw)}; expected an "
            'object of job name to address list, as in {"worker": '
            '["127.0.0.1:2222"]}. Write the cluster as a JSON object.',
            field="cluster",
        )
    jobs: dict[str, list[str]] = {}
    for name, addresses in raw.items():
        if not isinstance(name, str):
            raise errors.ClusterConfigError(
                f"cluster has job name {_R(name)} of type "
                f"{type(name).__name__}; expected one of 'chief', 'worker', "
                "'ps', 'evaluator'. Use str job names.",
                field="cluster",
            )
        field = f"cluster.{name}"
        if not isinstance(addresses, (list, tuple)):
            raise errors.ClusterConfigError(
                f"{field}={_R(addresses)} is a JSON {_json_type(addresses)}; "
                "expected a list of 'host:port' strings, as in "
                '["127.0.0.1:2222"]. Write the job as a JSON list.',
                field=field,
            )
        for index, address in enumerate(addresses):
            if not isinstance(address, str):
                raise errors.ClusterConfigError(
                    f"{field}[{index}]={_R(address)} is a JSON "
                    f"{_json_type(address)}; expected a 'host:port' string "
                    "such as '127.0.0.1:2222'. Quote the address.",
                    field=f"{field}[{index}]",
                )
        jobs[name] = list(addresses)
    return jobs


def _task_from_document(raw: object) -> spec.TaskSpec:
    """Checks the JSON types of TF_CONFIG's "task" value."""
    if not isinstance(raw, Mapping):
        raise errors.ClusterConfigError(
            f"task={_R(raw)} is a JSON {_json_type(raw)}; expected an object "
            'such as {"type": "worker", "index": 0}. Write the task as a '
            "JSON object.",
            field="task",
        )
    _check_keys(raw, where="task", known=_TASK_KEYS)
    for key in _TASK_KEYS:
        if key not in raw:
            raise errors.ClusterConfigError(
                f"task={_R(raw)} has no {key!r}; expected both 'type' and "
                '\'index\', as in {"type": "worker", "index": 0}. Add '
                f"task.{key}.",
                field=f"task.{key}",
            )
    task_type = raw["type"]
    if not isinstance(task_type, str):
        raise errors.ClusterConfigError(
            f"task.type={_R(task_type)} is a JSON {_json_type(task_type)}; "
            "expected one of the strings 'chief', 'worker', 'ps', "
            "'evaluator'. Quote the task type.",
            field="task.type",
        )
    index = raw["index"]
    if isinstance(index, bool) or not isinstance(index, int):
        raise errors.ClusterConfigError(
            f"task.index={_R(index)} is a JSON {_json_type(index)}; expected "
            "an integer >= 0, the task's position in its job. Write it as a "
            'number without quotes or decimals, as in "index": 0.',
            field="task.index",
        )
    # TaskSpec rejects any str that is not a TaskType.
    return spec.TaskSpec(typing.cast(spec.TaskType, task_type), index)


def _json_type(value: object) -> str:
    """Names `value`'s JSON type (Python's type name if it has none)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "non-integer number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "array"
    if isinstance(value, Mapping):
        return "object"
    return f"value of Python type {type(value).__name__}"
