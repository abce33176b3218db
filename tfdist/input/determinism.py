"""Would two workers running this pipeline get the same batches?

Every worker of a multi-worker job runs the user's script, so each builds
the same `tf.data` pipeline. Reading it on every worker and keeping each
worker's slices of every batch (TF's `AutoShardPolicy.DATA`) is exact only
if every copy yields the same batches in the same order. A copy differs
when the pipeline draws randomness that is not seeded, runs Python, or
lets parallel work reorder elements. `nondeterministic_ops` lists such ops
from the pipeline's serialized graph (its dataset ops and every function
they call):

- unseeded shuffles and random datasets (`shuffle` without a seed and no
  global seed: seed and seed2 both 0, so TF draws fresh seeds per copy);
- unseeded stateful random ops in pipeline functions (`tf.random.shuffle`,
  `tf.random.uniform`, ... with seed and seed2 0, e.g. Keras's shuffling of
  numpy inputs) and `tf.random.Generator` ops (state that may differ);
- Python: `Dataset.from_generator`, `tf.py_function`, `tf.numpy_function`;
- parallel ops or options with `deterministic=False`;
- a `tf.data` service read (the service decides who gets what).

Seeded randomness counts as deterministic: TF derives the same seeds on
every worker when every worker builds the pipeline the same way (the same
script, the same global seed).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import tensorflow as tf

from tfdist._internal import tf_data

__all__ = ["nondeterministic_ops"]

#: Dataset ops whose seed and seed2 are inputs: op -> (seed index, seed2 index).
_SEEDED_DATASETS = {
    "ShuffleDataset": (2, 3),
    "ShuffleDatasetV3": (2, 3),
    "ShuffleAndRepeatDataset": (2, 3),
    "ShuffleAndRepeatDatasetV2": (2, 3),
    "RandomDataset": (0, 1),
    "ExperimentalRandomDataset": (0, 1),
    "RandomDatasetV2": (0, 1),
    "GlobalShuffleDataset": (1, 2),
}

#: Dataset ops seeded only by a seed-generator resource: always random.
_GENERATOR_SEEDED_DATASETS = frozenset({"ShuffleDatasetV2"})

#: Stateful random ops whose seed and seed2 are attributes (0, 0: unseeded).
_SEED_ATTR_OPS = frozenset(
    {
        "Multinomial",
        "ParameterizedTruncatedNormal",
        "RandomCrop",
        "RandomGamma",
        "RandomPoisson",
        "RandomPoissonV2",
        "RandomShuffle",
        "RandomStandardNormal",
        "RandomUniform",
        "RandomUniformInt",
        "TruncatedNormal",
    }
)

#: Ops whose results depend on state outside the graph, or on Python.
_ALWAYS_NONDETERMINISTIC = frozenset(
    {
        "EagerPyFunc",
        "GeneratorDataset",
        "PyFunc",
        "PyFuncStateless",
        "RngReadAndSkip",
        "RngSkip",
        "StatefulRandomBinomial",
        "StatefulStandardNormal",
        "StatefulStandardNormalV2",
        "StatefulTruncatedNormal",
        "StatefulUniform",
        "StatefulUniformFullInt",
        "StatefulUniformInt",
        "DataServiceDataset",
        "DataServiceDatasetV2",
        "DataServiceDatasetV3",
        "DataServiceDatasetV4",
    }
)

#: Ops that may reorder elements: the attribute that says whether they do.
_ORDER_ATTRS = {
    "ParallelMapDatasetV2": "deterministic",
    "ParallelInterleaveDatasetV3": "deterministic",
    "ParallelInterleaveDatasetV4": "deterministic",
    "ParallelBatchDataset": "deterministic",
    "ParallelFilterDataset": "deterministic",
}


def nondeterministic_ops(dataset: tf.data.Dataset) -> tuple[str, ...]:
    """The ops that can make copies of `dataset` yield different batches.

    Serializes the pipeline's graph once (constants included: for data held
    in the graph, a copy of it).

    Returns:
      A sorted tuple of short descriptions (op type and why, e.g.
      "ShuffleDatasetV3 (unseeded)"), empty if every copy yields the same
      batches.
    """
    graph = tf_data.pipeline_graph(dataset)
    found = set(_scan(graph.node))
    for function in graph.library.function:
        found.update(_scan(function.node_def))
    return tuple(sorted(found))


def _scan(nodes: Sequence[Any]) -> Iterable[str]:  # NodeDef protos.
    constants = {node.name: node for node in nodes if node.op == "Const"}
    for node in nodes:
        op = node.op
        if op in _ALWAYS_NONDETERMINISTIC:
            yield f"{op} (runs Python or reads state outside the pipeline)"
        elif op in _GENERATOR_SEEDED_DATASETS:
            yield f"{op} (seeded by a generator)"
        elif op in _SEEDED_DATASETS:
            seed, seed2 = (
                _constant_int(constants, node.input[i]) for i in _SEEDED_DATASETS[op]
            )
            if seed in (0, None) and seed2 in (0, None):
                yield f"{op} (unseeded)"
        elif op in _SEED_ATTR_OPS:
            if node.attr["seed"].i == 0 and node.attr["seed2"].i == 0:
                yield f"{op} (unseeded)"
        elif op in _ORDER_ATTRS:
            if node.attr[_ORDER_ATTRS[op]].s == b"false":
                yield f"{op} (deterministic=False)"
        elif op == "LegacyParallelInterleaveDatasetV2" and node.attr["sloppy"].b:
            yield f"{op} (sloppy=True)"
        elif op == "OptionsDataset" and _options_allow_reordering(node):
            yield "Options(deterministic=False)"


def _constant_int(constants: dict[str, Any], input_name: str) -> int | None:
    """The int value of a Const input, or None if not a constant."""
    node = constants.get(input_name.split(":")[0].lstrip("^"))
    if node is None:
        return None
    tensor = node.attr["value"].tensor
    values = list(tensor.int64_val) or list(tensor.int_val)
    return int(values[0]) if values else 0


def _options_allow_reordering(node: Any) -> bool:
    return tf_data.options_allow_reordering(node.attr["serialized_options"].s)
