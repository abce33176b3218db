"""Where LayerPlacementStrategy's ops really run, read from the executed graphs.

TF's run metadata (enabled before anything is traced) holds the partition
graphs that ran: one per device, each node with its device. Layers get
distinctive names, so every node of a layer's call, and every gradient op
the tape made for it ("gradient_tape/<its call scope>/..."), can be told
apart. The stages skip /cpu:0 (the host and TF's default device), so an op
that fell back to the default would show.

The same graphs show that the schedule can overlap: with the send and
receive pairs joining the partitions into one dataflow graph, no forward
op of the first stage (either microbatch's) depends on an op of a later
stage, so TF's executor can run the second microbatch's first stage while
the later stages work on the first (GPipe's pipelining; whether that gains
time depends on free cores, see benchmarks/placement.py).
"""

from __future__ import annotations

import collections
import re

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.eager import context  # Run metadata: no public API.

import tfdist
from tfdist._internal import keras_layers

pytestmark = pytest.mark.model
keras = tf.keras

LAYER_DEVICES = {
    "alpha": "/device:CPU:1",
    "bravo": "/device:CPU:2",
    "charlie": "/device:CPU:3",
    "delta": "/device:CPU:3",
}
#: Compute ops of a Dense(relu) layer, forward and backward (Grappler fuses
#: the forward MatMul, BiasAdd and Relu into one _FusedMatMul).
COMPUTE_OPS = ("MatMul", "_FusedMatMul", "BiasAdd", "Relu", "ReluGrad", "BiasAddGrad")
#: oneDNN's rewrite of an op on CPUs it optimises for (e.g. AVX-512):
#: _MklMatMul, _MklNativeFusedMatMul.
_ONEDNN_PREFIX = re.compile(r"^_Mkl(Native)?(?=[A-Z_])")


def _is_compute_op(op: str) -> bool:
    """Whether `op` is one of COMPUTE_OPS, as written or as oneDNN rewrote it."""
    match = _ONEDNN_PREFIX.match(op)
    if match is None:
        return op in COMPUTE_OPS
    base = op[match.end() :]
    return base in COMPUTE_OPS or f"_{base}" in COMPUTE_OPS
_LAYER_COMPONENT = re.compile(r"^(%s)(_\d+)?$" % "|".join(LAYER_DEVICES))


def _layer_of(node_name: str) -> str | None:
    for component in node_name.split("/"):
        match = _LAYER_COMPONENT.match(component)
        if match:
            return match.group(1)
    return None


def _short(device: str) -> str:
    return "/device:" + device.rsplit("/device:", 1)[-1]


class OpPlacementTest(tf.test.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        context.context().enable_run_metadata()
        context.context().export_run_metadata()  # Drops anything earlier.
        strategy = tfdist.LayerPlacementStrategy(
            placement=dict(LAYER_DEVICES), num_microbatches=2
        )
        with strategy.scope():
            keras.utils.set_random_seed(0)
            model = keras.Sequential(
                [keras.Input((8,))]
                + [keras.layers.Dense(32, activation="relu", name=n) for n in ("alpha", "bravo", "charlie")]
                + [keras.layers.Dense(3, name="delta")]
            )
            model.compile(
                optimizer=keras.optimizers.Adam(0.01),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            )
        rng = np.random.default_rng(0)
        model.fit(
            rng.normal(size=(64, 8)).astype("float32"), rng.integers(0, 3, 64),
            batch_size=32, epochs=1, verbose=0,
        )
        metadata = context.context().export_run_metadata()
        context.context().disable_run_metadata()
        cls.partition_graphs = list(metadata.partition_graphs)
        cls.nodes = [
            (node.name, node.op, _short(node.device))
            for graph in metadata.partition_graphs
            for node in graph.node
        ]
        # Per update of a variable inside the step: the op producing the
        # value, in the same partition (one device) unless received.
        cls.update_sources = []
        for graph in metadata.partition_graphs:
            by_name = {node.name: node for node in graph.node}
            for node in graph.node:
                if node.op in ("AssignSubVariableOp", "AssignAddVariableOp", "AssignVariableOp") and "/" in node.name:
                    source = by_name.get(node.input[1].split(":")[0].lstrip("^"))
                    cls.update_sources.append((node.name, _short(node.device), source.op if source else None))
        cls.model = model

    def test_forward_and_backward_compute_ops_run_on_their_layers_device(self):
        seen = {layer: {"forward": 0, "backward": 0} for layer in LAYER_DEVICES}
        misplaced = []
        for name, op, device in self.nodes:
            layer = _layer_of(name)
            if layer is None or not _is_compute_op(op):
                continue
            seen[layer]["backward" if "gradient_tape" in name else "forward"] += 1
            if device != LAYER_DEVICES[layer]:
                misplaced.append((name, op, device))
        self.assertEmpty(misplaced)
        for layer, counts in seen.items():
            with self.subTest(layer=layer):
                self.assertGreater(counts["forward"], 0)
                self.assertGreater(counts["backward"], 0)

    def test_no_matmul_runs_on_the_host_device(self):
        host = [(n, op) for n, op, d in self.nodes if "MatMul" in op and d == "/device:CPU:0"]
        self.assertEmpty(host)

    def test_variables_and_optimizer_slots_live_on_their_layers_device(self):
        for layer in self.model.layers:
            for variable in keras_layers.resource_variables(layer):
                self.assertEqual(_short(variable.device), LAYER_DEVICES[layer.name], variable.name)
        optimizer_variables = self.model.optimizer.variables
        if callable(optimizer_variables):  # tf-keras
            optimizer_variables = optimizer_variables()
        slots = 0
        for variable in optimizer_variables:
            name = getattr(variable, "path", variable.name)
            layer = next((n for n in LAYER_DEVICES if re.search(rf"(^|[/_]){n}[/_]", name)), None)
            if layer is None:
                continue  # The step counter and learning rate.
            slots += 1
            self.assertEqual(_short(keras_layers.storage_variable(variable).device), LAYER_DEVICES[layer], name)
        self.assertEqual(slots, 2 * 2 * len(LAYER_DEVICES))  # m and v, kernel and bias.

    def test_update_arithmetic_runs_where_each_variable_is(self):
        # A value computed on another device would arrive through a _Recv.
        self.assertNotEmpty(self.update_sources)
        received = [u for u in self.update_sources if u[2] == "_Recv"]
        self.assertEmpty(received)

    def test_first_stage_forward_depends_on_no_later_stage(self):
        nodes, parents = _dataflow(self.partition_graphs)
        # Serialized microbatches would make the second microbatch's
        # forward on stage "alpha" wait for the first one's later stages.
        forward = [
            key for key, (name, op, _) in nodes.items()
            if _layer_of(name) == "alpha" and "gradient_tape" not in name and _is_compute_op(op)
        ]
        self.assertGreaterEqual(len(forward), 2)  # One per microbatch at least.

        def of_later_stages(keys):
            return sorted(nodes[k][0] for k in keys if _layer_of(nodes[k][0]) in ("bravo", "charlie", "delta"))

        for key in forward:
            with self.subTest(op=nodes[key][0]):
                self.assertEmpty(of_later_stages(_ancestors([key], parents)))
        # Control: the updates on alpha's device (only alpha's variables
        # live there) need the gradients that flow back through the later
        # stages.
        updates = [
            key for key, (_, op, device) in nodes.items()
            if op.startswith(("Assign", "ResourceApply")) and device == LAYER_DEVICES["alpha"]
        ]
        self.assertNotEmpty(updates)
        self.assertNotEmpty(of_later_stages(_ancestors(updates, parents)))


def _dataflow(graphs):
    """`({node key: (name, op, device)}, {node key: parent keys})` over all partitions."""
    nodes, parents = {}, collections.defaultdict(set)
    sends, receives = {}, collections.defaultdict(list)
    for index, graph in enumerate(graphs):
        for node in graph.node:
            key = (index, node.name)
            nodes[key] = (node.name, node.op, _short(node.device))
            parents[key].update((index, i.lstrip("^").split(":")[0]) for i in node.input)
            if node.op == "_Send":
                sends[node.attr["tensor_name"].s] = key
            elif node.op == "_Recv":
                receives[node.attr["tensor_name"].s].append(key)
    for tensor_name, send in sends.items():
        for receive in receives[tensor_name]:
            parents[receive].add(send)
    return nodes, parents


def _ancestors(keys, parents):
    seen, stack = set(), list(keys)
    while stack:
        for parent in parents[stack.pop()]:
            if parent not in seen:
                seen.add(parent)
                stack.append(parent)
    return seen


if __name__ == "__main__":
    tfdist.testing.main()
