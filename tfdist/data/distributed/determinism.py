"""Would two workers running this pipeline get the same batches? And if not, can they?

Every worker of a multi-worker job runs the user's script, so each builds
the same `tf.data` pipeline. Reading it on every worker and keeping each
worker's slices of every batch (TF's `AutoShardPolicy.DATA`), or sharding
it by worker in a `dataset_fn`, is exact only if every copy yields the same
examples in the same order. `find_nondeterminism` lists what makes copies
differ, from the pipeline's serialized graph (its dataset ops and every
function they call):

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

The commonest case can be fixed without running the pipeline elsewhere:
`seed_shuffles` gives every unseeded shuffle of the pipeline itself (not
inside a function) a seed that all workers agree on, as TF's V1 shuffle
ops that own their seed generator; such a copy reshuffles every epoch the
same way on every worker. (TF's V2/V3 shuffles point at a seed-generator
resource of the process that built them, so a copy with only new seeds
would still disagree.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

import tensorflow as tf

from tfdist._internal import tf_data

__all__ = ["Finding", "find_nondeterminism", "seed_shuffles", "upstream_of"]

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

#: Unseeded ops `seed_shuffles` fixes: op -> (V1 op owning its seed generator,
#: index of the seed-generator input to drop).
_REPLACEMENTS = {
    "ShuffleDatasetV3": ("ShuffleDataset", 4),
    "ShuffleDataset": ("ShuffleDataset", None),
    "ShuffleAndRepeatDatasetV2": ("ShuffleAndRepeatDataset", 5),
    "ShuffleAndRepeatDataset": ("ShuffleAndRepeatDataset", None),
}

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
_ALWAYS_NONDETERMINISTIC = {
    "EagerPyFunc": "runs Python",
    "GeneratorDataset": "runs Python",
    "PyFunc": "runs Python",
    "PyFuncStateless": "runs Python",
    "RngReadAndSkip": "reads a tf.random.Generator",
    "RngSkip": "reads a tf.random.Generator",
    "StatefulRandomBinomial": "reads a tf.random.Generator",
    "StatefulStandardNormal": "reads a tf.random.Generator",
    "StatefulStandardNormalV2": "reads a tf.random.Generator",
    "StatefulTruncatedNormal": "reads a tf.random.Generator",
    "StatefulUniform": "reads a tf.random.Generator",
    "StatefulUniformFullInt": "reads a tf.random.Generator",
    "StatefulUniformInt": "reads a tf.random.Generator",
    "ShuffleDatasetV2": "seeded by a generator",
    "DataServiceDataset": "reads the tf.data service",
    "DataServiceDatasetV2": "reads the tf.data service",
    "DataServiceDatasetV3": "reads the tf.data service",
    "DataServiceDatasetV4": "reads the tf.data service",
}

#: Ops that may reorder elements: the attribute that says whether they do.
_ORDER_ATTRS = {
    "ParallelMapDatasetV2": "deterministic",
    "ParallelInterleaveDatasetV3": "deterministic",
    "ParallelInterleaveDatasetV4": "deterministic",
    "ParallelBatchDataset": "deterministic",
    "ParallelFilterDataset": "deterministic",
}


@dataclasses.dataclass(frozen=True)
class Finding:
    """One op that can make copies of a pipeline differ.

    Attributes:
      op: The op type, e.g. "ShuffleDatasetV3".
      reason: Why, e.g. "unseeded".
      node: The node's name.
      function: The library function the node is in, or None for the
        pipeline's own graph.
    """

    op: str
    reason: str
    node: str
    function: str | None

    @property
    def fixable(self) -> bool:
        """Whether `seed_shuffles` makes copies agree on it."""
        return self.function is None and self.reason == "unseeded" and self.op in _REPLACEMENTS

    def __str__(self) -> str:
        return f"{self.op} ({self.reason})"


def find_nondeterminism(graph: Any) -> tuple[Finding, ...]:
    """What can make copies of the pipeline `graph` yield different batches.

    Args:
      graph: The pipeline's `GraphDef` (`tf_data.pipeline_graph`).

    Returns:
      The findings, in graph order; empty if every copy yields the same
      batches.
    """
    found = list(_scan(graph.node, None))
    for function in graph.library.function:
        found.extend(_scan(function.node_def, function.signature.name))
    return tuple(found)


def upstream_of(graph: Any, op_types: Sequence[str]) -> tuple[set[str], set[str]]:
    """(nodes, functions) that feed any node of `op_types` in `graph`'s pipeline.

    Follows the pipeline's own dataset chain from each such node toward its
    sources, and every library function those nodes (or functions they
    call) use.
    """
    nodes = {node.name: node for node in graph.node}
    functions = {f.signature.name: f for f in graph.library.function}
    frontier = [n for n in graph.node if n.op in op_types]
    seen_nodes: set[str] = set()
    seen_functions: set[str] = set()
    while frontier:
        node = frontier.pop()
        for name in _called_functions(node):
            if name in functions and name not in seen_functions:
                seen_functions.add(name)
                frontier.extend(functions[name].node_def)
        for input_name in node.input:
            name = input_name.split(":")[0].lstrip("^")
            if name in nodes and name not in seen_nodes:
                seen_nodes.add(name)
                frontier.append(nodes[name])
    return seen_nodes, seen_functions


def seed_shuffles(
    dataset: tf.data.Dataset, graph: Any, seed: int
) -> tf.data.Dataset:
    """A copy of `dataset` whose fixable unseeded shuffles use seeds from `seed`.

    Every copy made with the same `seed` (on any worker) shuffles each
    epoch the same way; the first iteration of the copy is epoch 0. The
    shuffles' seed generators belong to the copy's ops: iterating the copy
    (or one pipeline built on it) again reshuffles, but a pipeline that TF
    rebuilds on it for every iterator (as `distribute_datasets_from_function`
    does) starts from epoch 0's order each time. Resources the pipeline
    uses (tables, variables) stay this process's.

    Args:
      dataset: The pipeline.
      graph: Its `GraphDef` (`tf_data.pipeline_graph(dataset)`).
      seed: A seed every worker passes alike; op i gets seeds derived
        from (seed, i).
    """
    rewritten = tf.compat.v1.GraphDef()
    rewritten.CopyFrom(graph)
    fixable = {f.node for f in find_nondeterminism(graph) if f.fixable}
    for index, node in enumerate(n for n in rewritten.node if n.name in fixable):
        replacement, seed_generator_input = _REPLACEMENTS[node.op]
        node.op = replacement
        if seed_generator_input is not None:
            del node.input[seed_generator_input]
        seed_index, seed2_index = _SEEDED_DATASETS[replacement]
        for position, value in (
            (seed_index, _derived_seed(seed, 2 * index)),
            (seed2_index, _derived_seed(seed, 2 * index + 1)),
        ):
            constant = rewritten.node.add()
            constant.name = f"{node.name}/tfdist_seed_{position}"
            constant.op = "Const"
            constant.attr["dtype"].type = tf.int64.as_datatype_enum
            constant.attr["value"].tensor.CopyFrom(
                tf.make_tensor_proto(value, dtype=tf.int64)
            )
            node.input[position] = constant.name
    return tf_data.dataset_from_graph(rewritten, dataset.element_spec)


def _derived_seed(seed: int, index: int) -> int:
    """A nonzero int64 seed for op slot `index` (0 would mean "unseeded")."""
    mixed = (seed * 0x9E3779B97F4A7C15 + index * 0xBF58476D1CE4E5B9) % (1 << 62)
    return mixed or 1


def _called_functions(node: Any) -> Iterable[str]:
    for value in node.attr.values():
        if value.HasField("func"):
            yield value.func.name
        for func in value.list.func:
            yield func.name


def _scan(nodes: Sequence[Any], function: str | None) -> Iterable[Finding]:  # NodeDef protos.
    constants = {node.name: node for node in nodes if node.op == "Const"}
    for node in nodes:
        op = node.op
        reason: str | None = None
        if op in _ALWAYS_NONDETERMINISTIC:
            reason = _ALWAYS_NONDETERMINISTIC[op]
        elif op in _SEEDED_DATASETS:
            seed, seed2 = (
                _constant_int(constants, node.input[i]) for i in _SEEDED_DATASETS[op]
            )
            if seed in (0, None) and seed2 in (0, None):
                reason = "unseeded"
        elif op in _SEED_ATTR_OPS:
            if node.attr["seed"].i == 0 and node.attr["seed2"].i == 0:
                reason = "unseeded"
        elif op in _ORDER_ATTRS:
            if node.attr[_ORDER_ATTRS[op]].s == b"false":
                reason = "deterministic=False"
        elif op == "LegacyParallelInterleaveDatasetV2" and node.attr["sloppy"].b:
            reason = "sloppy=True"
        elif op == "OptionsDataset" and tf_data.options_allow_reordering(
            node.attr["serialized_options"].s
        ):
            reason = "Options(deterministic=False)"
        if reason is not None:
            yield Finding(op, reason, node.name, function)


def _constant_int(constants: dict[str, Any], input_name: str) -> int | None:
    """The int value of a Const input, or None if not a constant."""
    node = constants.get(input_name.split(":")[0].lstrip("^"))
    if node is None:
        return None
    tensor = node.attr["value"].tensor
    values = list(tensor.int64_val) or list(tensor.int_val)
    return int(values[0]) if values else 0
