"""Bad arguments to tfdist.data.shard raise tfdist errors naming the value."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from absl.testing import parameterized

import tfdist
from tfdist import errors
from tfdist.data import sharding


def _pairs(num_elements: int = 8) -> tf.data.Dataset:
    ids = np.arange(num_elements, dtype=np.int64)
    return tf.data.Dataset.from_tensor_slices((ids, ids))


def _unreadable() -> tf.data.Dataset:
    """A dataset that fails if anything reads it (unknown cardinality too)."""
    return (
        tf.data.Dataset.from_tensor_slices(["not a number"])
        .map(tf.strings.to_number)
        .filter(lambda x: x > 0)
        .map(lambda x: (x, x))
    )


class ArgumentCheckTest(tf.test.TestCase, parameterized.TestCase):
    def test_indivisible_global_batch_names_both_and_suggests_sizes(self):
        with self.assertRaisesRegex(
            errors.ConfigError,
            r"global_batch_size=10 is not divisible by "
            r"num_replicas_in_sync=4.*such as 8 or 12",
        ):
            sharding.shard(
                _pairs(),
                tf.distribute.InputContext(1, 0, 4),
                global_batch_size=10,
            )

    def test_global_batch_smaller_than_replicas_suggests_multiple(self):
        with self.assertRaisesRegex(errors.ConfigError, r"such as 4\."):
            sharding.shard(
                _pairs(),
                tf.distribute.InputContext(1, 0, 4),
                global_batch_size=3,
            )

    @parameterized.named_parameters(
        dict(testcase_name="zero", value=0, error=errors.ConfigError),
        dict(testcase_name="negative", value=-8, error=errors.ConfigError),
        dict(testcase_name="string", value="64", error=TypeError),
        dict(testcase_name="bool", value=True, error=TypeError),
    )
    def test_bad_global_batch_size_is_rejected(self, value, error):
        with self.assertRaisesRegex(error, rf"global_batch_size={value!r}"):
            sharding.shard(_pairs(), None, global_batch_size=value)

    def test_checks_run_before_reading_the_input(self):
        with self.assertRaisesRegex(errors.ConfigError, "global_batch_size=0"):
            sharding.shard(_unreadable(), None, global_batch_size=0)

    @parameterized.named_parameters(
        dict(
            testcase_name="policy",
            name="policy",
            value="rows",
            choices="'auto', 'file', 'element'",
        ),
        dict(
            testcase_name="remainder",
            name="remainder",
            value="truncate",
            choices="'pad', 'split', 'drop', 'error'",
        ),
    )
    def test_unknown_choice_lists_the_choices(self, name, value, choices):
        with self.assertRaisesRegex(
            errors.ConfigError,
            rf"{name}='{value}' is not supported. Expected one of {choices}",
        ):
            sharding.shard(_pairs(), None, global_batch_size=4, **{name: value})

    def test_enum_choices_are_accepted(self):
        sharded = sharding.shard(
            _pairs(),
            None,
            global_batch_size=4,
            policy=sharding.ShardPolicy.ELEMENT,
            remainder=sharding.Remainder.DROP,
        )
        self.assertLen(list(sharded), 2)

    def test_wrong_input_context_type_is_type_error(self):
        with self.assertRaisesRegex(TypeError, r"input_context=4"):
            sharding.shard(_pairs(), 4, global_batch_size=4)

    def test_replicas_not_divisible_by_pipelines_is_rejected(self):
        with self.assertRaisesRegex(
            errors.ConfigError,
            r"num_replicas_in_sync=3 is not divisible by num_input_pipelines=2",
        ):
            sharding.shard(
                _pairs(),
                tf.distribute.InputContext(2, 0, 3),
                global_batch_size=6,
            )

    @parameterized.named_parameters(
        dict(testcase_name="seed_range", kwargs={"seed": 2**63}),
        dict(testcase_name="epoch", kwargs={"epoch": -1}),
        dict(testcase_name="start_step", kwargs={"start_step": -2}),
        dict(testcase_name="memory", kwargs={"max_in_memory_bytes": 0}),
    )
    def test_out_of_range_value_is_named(self, kwargs):
        ((name, value),) = kwargs.items()
        with self.assertRaisesRegex(errors.ConfigError, rf"{name}={value}"):
            sharding.shard(_pairs(), None, global_batch_size=4, **kwargs)

    @parameterized.named_parameters(
        dict(testcase_name="seed", kwargs={"seed": 1.5}),
        dict(testcase_name="shuffle", kwargs={"shuffle": 1}),
        dict(
            testcase_name="reshuffle",
            kwargs={"reshuffle_each_iteration": "yes"},
        ),
        dict(
            testcase_name="normalize",
            kwargs={"normalize_padded_loss": 1},
        ),
    )
    def test_wrong_type_is_type_error(self, kwargs):
        ((name, value),) = kwargs.items()
        with self.assertRaisesRegex(TypeError, rf"{name}={value!r}"):
            sharding.shard(_pairs(), None, global_batch_size=4, **kwargs)

    def test_start_step_past_epoch_names_both(self):
        with self.assertRaisesRegex(
            errors.ConfigError, r"start_step=4 .* epoch 0, which has 2 global"
        ):
            sharding.shard(_pairs(8), None, global_batch_size=4, start_step=4)

    def test_call_inside_tf_function_is_rejected(self):
        @tf.function(autograph=False)  # AutoGraph would wrap the error.
        def build() -> tf.data.Dataset:
            return sharding.shard(_pairs(), None, global_batch_size=4)

        with self.assertRaisesRegex(errors.ConfigError, r"called eagerly"):
            build()


class InputCheckTest(tf.test.TestCase, parameterized.TestCase):
    def test_infinite_dataset_is_rejected(self):
        with self.assertRaisesRegex(errors.ConfigError, r"infinite"):
            sharding.shard(_pairs().repeat(), None, global_batch_size=4)

    def test_empty_dataset_is_rejected(self):
        with self.assertRaisesRegex(
            errors.ConfigError, r"empty \(0 elements\)"
        ):
            sharding.shard(_pairs().take(0), None, global_batch_size=4)

    def test_single_tensor_elements_with_pad_name_the_spec(self):
        with self.assertRaisesRegex(
            errors.ConfigError, r"tuples \(x, y\).*TensorSpec"
        ):
            sharding.shard(tf.data.Dataset.range(8), None, global_batch_size=4)

    def test_ragged_components_are_rejected(self):
        ragged = tf.data.Dataset.from_tensor_slices(
            (tf.ragged.constant([[1], [2, 3]]), [0, 1])
        )
        with self.assertRaisesRegex(errors.ConfigError, r"dense tensors"):
            sharding.shard(ragged, None, global_batch_size=2)

    def test_string_weight_is_rejected(self):
        dataset = tf.data.Dataset.from_tensor_slices(
            ([1, 2], [1, 2], ["a", "b"])
        )
        with self.assertRaisesRegex(errors.ConfigError, r"sample_weight"):
            sharding.shard(dataset, None, global_batch_size=2)

    def test_single_path_string_is_type_error(self):
        with self.assertRaisesRegex(TypeError, r"\[path\]"):
            sharding.shard("data.tfrecord", None, global_batch_size=4)

    def test_empty_file_list_is_rejected(self):
        with self.assertRaisesRegex(errors.ConfigError, r"dataset=\[\]"):
            sharding.shard([], None, global_batch_size=4)

    def test_non_path_in_file_list_is_type_error(self):
        with self.assertRaisesRegex(TypeError, r"received 3 of type int"):
            sharding.shard(["a.tfrecord", 3], None, global_batch_size=4)

    def test_parse_fn_with_dataset_is_rejected(self):
        with self.assertRaisesRegex(errors.ConfigError, r"file paths only"):
            sharding.shard(
                _pairs(), None, global_batch_size=4, parse_fn=lambda r: r
            )

    def test_non_callable_reader_is_type_error(self):
        with self.assertRaisesRegex(TypeError, r"reader='tfrecord'"):
            sharding.shard(
                ["a.tfrecord"], None, global_batch_size=4, reader="tfrecord"
            )


if __name__ == "__main__":
    tfdist.testing.main()
