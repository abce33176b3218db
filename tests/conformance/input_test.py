"""Tutorial "Distributed Input", ported (one device, TF's strategy, tfdist).

Source: tensorflow/docs site/en/tutorials/distribute/input.ipynb (TF 2.21).
Each code cell that distributes input is a scenario of its own, run by
every contender from the same seed:

- `next_of_iter`: `next(iter(dist_dataset))` of a dataset batched by 16;
- `auto_shard_data`: the dataset with `AutoShardPolicy.DATA` set in its
  options (the tutorial only builds it; here it is distributed and read
  once, to see that the option changes nothing on one worker);
- `datasets_from_function`: `distribute_datasets_from_function` with the
  tutorial's `dataset_fn` (`InputContext.get_per_replica_batch_size`,
  `shard`, `batch`, `prefetch`), read once (the tutorial only builds it);
- `for_loop`: `for x in dist_dataset` with `strategy.run` of a
  `tf.function` step;
- `iter_next_epochs`: a new `iter` per epoch and 5 `next` calls each;
- `get_next_as_optional`: a `tf.function` taking the distributed iterator
  and breaking out of `tf.range` when the `Optional` is empty;
- `element_spec_signature`: the step's `input_signature` is
  `dist_dataset.element_spec`;
- `preprocessing_layer`: a `StringLookup` created under the scope applied
  in a `dataset_fn`;
- `predict_with_index`: `enumerate` to put outputs back in input order;
- `values_from_function`: `experimental_distribute_values_from_function`;
- `from_generator`: `Dataset.from_generator` of random vectors.

Changed: the tutorial's constant elements `([1.], [1.])` are `([i], [i])`
for element i, so every output names the example it came from (the
structure, shapes and dtypes are the tutorial's); the strategies are the
contenders' on 4 logical CPUs (the tutorial makes 2); 3 epochs instead of
10 and 5 (every epoch reads the same elements); `print`/`tf.print`
results are returned instead (`tf.print` into a file, read back). Left out:
the first cell (no strategy) and the `Model.fit` preprocessing prose (no
code).
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
import tensorflow as tf
from absl.testing import parameterized

import tfdist
from tests.conformance import harness

pytestmark = pytest.mark.model


def numbered_pairs(num_elements):
    """The tutorial's `from_tensors(([1.], [1.])).repeat(n)`, element i as `([i], [i])`."""
    return tf.data.Dataset.range(num_elements).map(
        lambda i: ([tf.cast(i, tf.float32)], [tf.cast(i, tf.float32)]))


def per_pass_counts(ids_per_pass, num_elements):
    """How often each element id was seen, per pass."""
    return [np.bincount(np.asarray(ids, np.int64).ravel(), minlength=num_elements)
            for ids in ids_per_pass]


def next_of_iter(contender, workdir):
    global_batch_size = 16
    mirrored_strategy = harness.make_strategy(contender)

    dataset = numbered_pairs(100).batch(global_batch_size)
    # Distribute input using the `experimental_distribute_dataset`.
    dist_dataset = mirrored_strategy.experimental_distribute_dataset(dataset)
    # 1 global batch of data fed to the model in 1 step.
    first = harness.local_rows(mirrored_strategy, next(iter(dist_dataset)))
    return harness.Record(values={"features": first[0], "labels": first[1]})


def auto_shard_data(contender, workdir):
    dataset = numbered_pairs(64).batch(16)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    dataset = dataset.with_options(options)

    strategy = harness.make_strategy(contender)
    rows = [harness.local_rows(strategy, x)[0] for x in strategy.experimental_distribute_dataset(dataset)]
    return harness.Record(
        train_counts=per_pass_counts([np.concatenate(rows)], 64),
        values={"features": np.concatenate(rows)})


def datasets_from_function(contender, workdir):
    global_batch_size = 16
    mirrored_strategy = harness.make_strategy(contender)

    def dataset_fn(input_context):
        batch_size = input_context.get_per_replica_batch_size(global_batch_size)
        dataset = numbered_pairs(64).batch(16)
        dataset = dataset.shard(
            input_context.num_input_pipelines, input_context.input_pipeline_id)
        dataset = dataset.batch(batch_size)
        dataset = dataset.prefetch(2)  # This prefetches 2 batches per device.
        return dataset

    dist_dataset = mirrored_strategy.distribute_datasets_from_function(dataset_fn)

    features = np.concatenate(
        [harness.local_rows(mirrored_strategy, x)[0].ravel() for x in dist_dataset])
    return harness.Record(
        train_counts=per_pass_counts([features], 64), values={"features": features})


def iterators_cell(contender):
    """The "Distributed iterators" cell: its strategy, dataset and step."""
    global_batch_size = 16
    mirrored_strategy = harness.make_strategy(contender)

    dataset = numbered_pairs(100).batch(global_batch_size)
    dist_dataset = mirrored_strategy.experimental_distribute_dataset(dataset)

    @tf.function
    def train_step(inputs):
        features, labels = inputs
        return labels - 0.3 * features

    return mirrored_strategy, dist_dataset, train_step


def for_loop(contender, workdir):
    mirrored_strategy, dist_dataset, train_step = iterators_cell(contender)
    seen, losses = [], []
    for x in dist_dataset:
        # train_step trains the model using the dataset elements
        loss = mirrored_strategy.run(train_step, args=(x,))
        seen.append(harness.local_rows(mirrored_strategy, x)[0])
        losses.append(harness.local_rows(mirrored_strategy, loss))
    return harness.Record(
        train_counts=per_pass_counts([np.concatenate(seen)], 100),
        values={"losses": np.concatenate(losses)})


def iter_next_epochs(contender, workdir):
    # The next cell of the tutorial, on the same dataset and step.
    mirrored_strategy, dist_dataset, train_step = iterators_cell(contender)
    num_epochs = 3
    steps_per_epoch = 5
    losses = []
    for epoch in range(num_epochs):
        dist_iterator = iter(dist_dataset)
        losses.append([])
        for step in range(steps_per_epoch):
            # train_step trains the model using the dataset elements
            loss = mirrored_strategy.run(train_step, args=(next(dist_iterator),))
            losses[-1].append(harness.local_rows(mirrored_strategy, loss))
    per_epoch = [np.concatenate(epoch) for epoch in losses]
    return harness.Record(
        train_counts=per_pass_counts([np.round(l / 0.7) for l in per_epoch], 100),
        values={"losses": np.stack(per_epoch)})


def get_next_as_optional(contender, workdir):
    printed = os.path.join(workdir, "printed.txt")
    # You can break the loop with `get_next_as_optional` by checking if the `Optional` contains a value
    global_batch_size = 4
    steps_per_loop = 5
    strategy = harness.make_strategy(contender)

    dataset = tf.data.Dataset.range(9).batch(global_batch_size)
    distributed_iterator = iter(strategy.experimental_distribute_dataset(dataset))

    @tf.function
    def train_fn(distributed_iterator):
        for _ in tf.range(steps_per_loop):
            optional_data = distributed_iterator.get_next_as_optional()
            if not optional_data.has_value():
                break
            per_replica_results = strategy.run(lambda x: x, args=(optional_data.get_value(),))
            tf.print(strategy.experimental_local_results(per_replica_results),
                     output_stream=f"file://{printed}")
    train_fn(distributed_iterator)

    with open(printed) as f:
        lines = f.read().splitlines()
    numbers = [[int(n) for n in re.findall(r"-?\d+", line)] for line in lines]
    flat = np.array([n for line in numbers for n in line], np.int64)
    return harness.Record(
        train_counts=per_pass_counts([flat], 9),
        values={"printed": flat, "steps": len(lines)})


def element_spec_signature(contender, workdir):
    global_batch_size = 16
    epochs = 3
    steps_per_epoch = 5
    mirrored_strategy = harness.make_strategy(contender)

    dataset = numbered_pairs(100).batch(global_batch_size)
    dist_dataset = mirrored_strategy.experimental_distribute_dataset(dataset)

    @tf.function(input_signature=[dist_dataset.element_spec])
    def train_step(per_replica_inputs):
        def step_fn(inputs):
            return 2 * inputs

        return mirrored_strategy.run(step_fn, args=(per_replica_inputs,))

    outputs = []
    for _ in range(epochs):
        iterator = iter(dist_dataset)
        outputs.append([])
        for _ in range(steps_per_epoch):
            output = train_step(next(iterator))
            # `2 * inputs` of the (features, labels) tuple is the tuple twice.
            outputs[-1].append(harness.local_rows(mirrored_strategy, output)[0])
    per_epoch = [np.concatenate(epoch) for epoch in outputs]
    return harness.Record(
        train_counts=per_pass_counts(per_epoch, 100),
        values={"outputs": np.stack(per_epoch)})


def preprocessing_layer(contender, workdir):
    strategy = harness.make_strategy(contender)
    vocab = ["a", "b", "c", "d", "f"]

    with strategy.scope():
        # Create the layer(s) under scope.
        layer = tf.keras.layers.StringLookup(vocabulary=vocab)

    def dataset_fn(input_context):
        # a tf.data.Dataset
        dataset = tf.data.Dataset.from_tensor_slices(["a", "c", "e"]).repeat()

        # Custom your batching, sharding, prefetching, etc.
        global_batch_size = 4
        batch_size = input_context.get_per_replica_batch_size(global_batch_size)
        dataset = dataset.batch(batch_size)
        dataset = dataset.shard(
            input_context.num_input_pipelines,
            input_context.input_pipeline_id)

        # Apply the preprocessing layer(s) to the tf.data.Dataset
        def preprocess_with_kpl(input):
            return layer(input)

        processed_ds = dataset.map(preprocess_with_kpl)
        return processed_ds

    distributed_dataset = strategy.distribute_datasets_from_function(dataset_fn)

    # Print out a few example batches.
    distributed_dataset_iterator = iter(distributed_dataset)
    batches = []
    for _ in range(3):
        batches.append(harness.local_rows(strategy, next(distributed_dataset_iterator)))
    return harness.Record(values={"batches": np.stack(batches)})


def predict_with_index(contender, workdir):
    mirrored_strategy = harness.make_strategy(contender)
    dataset_size = 24
    batch_size = 6
    dataset = tf.data.Dataset.range(dataset_size).enumerate().batch(batch_size)
    dist_dataset = mirrored_strategy.experimental_distribute_dataset(dataset)

    def predict(index, inputs):
        outputs = 2 * inputs
        return index, outputs

    result = {}
    seen = []
    for index, inputs in dist_dataset:
        output_index, outputs = mirrored_strategy.run(predict, args=(index, inputs))
        indices = list(mirrored_strategy.experimental_local_results(output_index))
        rindices = []
        for a in indices:
            rindices.extend(a.numpy())
        outputs = list(mirrored_strategy.experimental_local_results(outputs))
        routputs = []
        for a in outputs:
            routputs.extend(a.numpy())
        for i, value in zip(rindices, routputs):
            result[i] = value
        seen.extend(rindices)

    return harness.Record(
        train_counts=per_pass_counts([seen], dataset_size),
        values={"indices": sorted(result), "outputs": [result[i] for i in sorted(result)]})


def values_from_function(contender, workdir):
    mirrored_strategy = harness.make_strategy(contender)

    def value_fn(ctx):
        return tf.constant(ctx.replica_id_in_sync_group)

    distributed_values = mirrored_strategy.experimental_distribute_values_from_function(value_fn)
    results = []
    for _ in range(4):
        result = mirrored_strategy.run(lambda x: x, args=(distributed_values,))
        results.append(harness.local_rows(mirrored_strategy, result))
    return harness.Record(values={"results": np.stack(results)})


def from_generator(contender, workdir):
    mirrored_strategy = harness.make_strategy(contender)
    def input_gen():
        while True:
            yield np.random.rand(4)

    # use Dataset.from_generator
    dataset = tf.data.Dataset.from_generator(
        input_gen, output_types=(tf.float32), output_shapes=tf.TensorShape([4]))
    dist_dataset = mirrored_strategy.experimental_distribute_dataset(dataset)
    iterator = iter(dist_dataset)
    results = []
    for _ in range(4):
        result = mirrored_strategy.run(lambda x: x, args=(next(iterator),))
        results.append(harness.local_rows(mirrored_strategy, result))
    return harness.Record(values={"results": np.stack(results)})


SCENARIOS = {
    fn.__name__: fn
    for fn in (next_of_iter, auto_shard_data, datasets_from_function, for_loop,
               iter_next_epochs, get_next_as_optional, element_spec_signature,
               preprocessing_layer, predict_with_index, values_from_function,
               from_generator)
}
#: Scenarios whose elements carry ids: (name, elements, passes).
COUNTED = (
    ("auto_shard_data", 64, 1),
    ("datasets_from_function", 64, 1),
    ("for_loop", 100, 1),
    ("get_next_as_optional", 9, 1),
    ("predict_with_index", 24, 1),
)
#: Scenarios reading the first 80 of 100 elements on each pass: (name, passes).
FIRST_80 = (("iter_next_epochs", 3), ("element_spec_signature", 3))
#: Scenarios one device can be compared with (per replica values aside).
COMPARABLE = tuple(name for name in SCENARIOS if name != "values_from_function")


class InputTutorialTest(harness.ConformanceTestCase, parameterized.TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.records = {name: cls.run_in_tempdir(fn) for name, fn in SCENARIOS.items()}

    @parameterized.named_parameters((name, name, n, p) for name, n, p in COUNTED)
    def test_tfdist_reads_every_element_once(self, scenario, elements, passes):
        self.assert_each_example_once_per_epoch(
            self.records[scenario]["tfdist"], elements, passes)

    @parameterized.named_parameters((name, name, p) for name, p in FIRST_80)
    def test_tfdist_reads_the_first_80_elements_once_per_epoch(self, scenario, passes):
        record = self.records[scenario]["tfdist"]
        self.assert_ran(record)
        expected = harness.expected_counts(100, slice(0, 80))
        self.assertLen(record.train_counts, passes)
        for counts in record.train_counts:
            np.testing.assert_array_equal(counts, expected)

    @parameterized.named_parameters((name, name) for name in COMPARABLE)
    def test_tfdist_matches_one_device(self, scenario):
        self.assert_same_results(
            self.records[scenario]["tfdist"], self.records[scenario]["one_device"])

    @parameterized.named_parameters((name, name) for name in COMPARABLE)
    @harness.needs_tf_contender
    def test_tf_strategy_matches_one_device(self, scenario):
        self.assert_same_results(
            self.records[scenario]["tf"], self.records[scenario]["one_device"])

    @parameterized.named_parameters(("tf", "tf"), ("tfdist", "tfdist"))
    def test_values_from_function_gives_each_replica_its_id(self, contender):
        harness.skip_unless_run(self, contender)
        record = self.records["values_from_function"][contender]
        self.assert_ran(record)
        self.assertAllEqual(
            record.values["results"], [list(range(harness.NUM_REPLICAS))] * 4)


if __name__ == "__main__":
    tfdist.testing.main()
