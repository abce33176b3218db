"""Meshes and layouts are checked before anything is built: each mistake a LayoutError naming it."""

from __future__ import annotations

from absl.testing import absltest

from tfdist import errors
from tfdist.mesh import layouts

DEVICES = tuple(f"/device:CPU:{i}" for i in range(4))


class _KerasLikeMesh:
    """Keras's DeviceMesh, as the public attributes tfdist reads (no Keras import)."""

    def __init__(self, shape, axis_names, devices):
        self.shape, self.axis_names, self.devices = shape, axis_names, devices


class MeshSpecTest(absltest.TestCase):
    def test_dict_places_axes_over_local_devices_in_order(self):
        spec = layouts.MeshSpec.from_user({"batch": 2, "model": 2}, DEVICES)
        self.assertEqual(spec.axis_names, ("batch", "model"))
        self.assertEqual(spec.shape, (2, 2))
        self.assertEqual(spec.devices, DEVICES)
        self.assertEqual(spec.axis_size("model"), 2)

    def test_keras_mesh_brings_its_own_devices(self):
        spec = layouts.MeshSpec.from_user(
            _KerasLikeMesh((1, 2), ("batch", "model"), ["cpu:2", "cpu:3"]), DEVICES
        )
        self.assertEqual(spec.devices, ("cpu:2", "cpu:3"))

    def test_size_other_than_device_count_names_both_and_the_fix(self):
        with self.assertRaisesRegex(errors.LayoutError, r"6 positions \(3 x 2\) but 4 device.*simulate more"):
            layouts.MeshSpec.from_user({"batch": 3, "model": 2}, DEVICES)
        with self.assertRaisesRegex(errors.LayoutError, r"2 positions .* but 4 device.*fewer devices"):
            layouts.MeshSpec.from_user({"batch": 2}, DEVICES)

    def test_bad_shapes_and_names_raise(self):
        for mesh, pattern in (
            ({}, "one or more named axes"),
            ({"batch": 0, "model": 4}, "size of 1 or more"),
            ({"batch": 2.0, "model": 2}, "size of 1 or more"),
            ("2x2", "must be a keras.distribution.DeviceMesh or a dict"),
        ):
            with self.subTest(mesh=mesh), self.assertRaisesRegex(errors.LayoutError, pattern):
                layouts.MeshSpec.from_user(mesh, DEVICES)
        with self.assertRaisesRegex(errors.LayoutError, "distinct"):
            layouts.MeshSpec.from_user(_KerasLikeMesh((2, 2), ("a", "a"), list(DEVICES)), DEVICES)


class LayoutRulesTest(absltest.TestCase):
    def setUp(self):
        super().setUp()
        self.mesh = layouts.MeshSpec.from_user({"batch": 2, "model": 2}, DEVICES)

    def test_whole_path_match_gives_its_axes_and_others_stay_whole(self):
        rules = layouts.LayoutRules.from_user({".*dense/kernel": (None, "model")}, self.mesh)
        self.assertEqual(rules.axes_for("sequential/dense/kernel", (8, 16)), (None, "model"))
        # fullmatch, as Keras's LayoutMap: "dense/kernel" alone does not match a longer path.
        self.assertEqual(rules.axes_for("sequential/dense/kernel_2", (8, 16)), (None, None))
        self.assertEqual(rules.axes_for("adam/iteration", ()), ())

    def test_axis_the_mesh_lacks_names_the_axes_it_has(self):
        with self.assertRaisesRegex(errors.LayoutError, r"axis 'tensor'.*\['batch', 'model'\]"):
            layouts.LayoutRules.from_user({"k": (None, "tensor")}, self.mesh)

    def test_one_axis_for_two_dimensions_raises(self):
        with self.assertRaisesRegex(errors.LayoutError, "two dimensions over one mesh axis"):
            layouts.LayoutRules.from_user({"k": ("model", "model")}, self.mesh)

    def test_bad_pattern_raises(self):
        with self.assertRaisesRegex(errors.LayoutError, "not a regular expression"):
            layouts.LayoutRules.from_user({"dense[": ("model",)}, self.mesh)

    def test_dimension_the_axis_does_not_divide_names_variable_shape_and_sizes_that_work(self):
        mesh = layouts.MeshSpec.from_user({"batch": 2, "model": 4}, DEVICES * 2)
        rules = layouts.LayoutRules.from_user({".*kernel": (None, "model")}, mesh)
        with self.assertRaisesRegex(
            errors.LayoutError,
            r"'dense/kernel' of shape \(8, 6\) cannot split dimension 1 \(6\) over mesh axis "
            r"'model' of size 4.*\(batch=2\)",
        ):
            rules.axes_for("dense/kernel", (8, 6))

    def test_rank_mismatch_and_two_matching_patterns_raise(self):
        rules = layouts.LayoutRules.from_user({".*kernel": (None, "model"), "dense.*": ("model",)}, self.mesh)
        with self.assertRaisesRegex(errors.LayoutError, "has 2 entries but variable 'x/kernel'"):
            rules.axes_for("x/kernel", (8,))
        with self.assertRaisesRegex(errors.LayoutError, "matches 2 layout_map keys"):
            rules.axes_for("dense/kernel", (8, 16))


class AutomaticLayoutsTest(absltest.TestCase):
    def _rules(self, mesh=None):
        mesh = layouts.MeshSpec.from_user(mesh or {"batch": 1, "model": 4}, DEVICES)
        return layouts.AutomaticLayouts(mesh, "batch")

    def test_dense_layers_pair_column_then_row_and_a_column_bias_follows(self):
        rules = self._rules()
        chosen = [
            rules.axes_for(path, shape) for path, shape in (
                ("m/up/kernel", (8, 16)), ("m/up/bias", (16,)),
                ("m/down/kernel", (16, 8)), ("m/down/bias", (8,)),
                ("m/head/kernel", (8, 3)), ("m/head/bias", (3,)),
            )
        ]
        self.assertEqual(chosen, [(None, "model"), ("model",), ("model", None), (None,),
                                  (None, None), (None,)])
        self.assertIn("column-parallel", rules.explain("m/up/kernel"))
        self.assertIn("row-parallel", rules.explain("m/down/kernel"))
        self.assertIn("3 outputs do not divide model=4", rules.explain("m/head/kernel"))

    def test_a_kernel_not_fed_by_the_column_layer_starts_a_new_pair(self):
        rules = self._rules()
        rules.axes_for("m/a/kernel", (8, 16))
        self.assertEqual(rules.axes_for("m/b/kernel", (12, 8)), (None, "model"))

    def test_attention_splits_heads_embeddings_split_rows_and_norms_stay_whole(self):
        rules = self._rules()
        self.assertEqual(rules.axes_for("t/token/embeddings", (32, 16)), ("model", None))
        self.assertEqual(rules.axes_for("t/position/embeddings", (6, 16)), (None, None))
        self.assertIn("6 rows do not divide model=4", rules.explain("t/position/embeddings"))
        self.assertEqual(rules.axes_for("t/attention/query/kernel", (16, 4, 4)), (None, "model", None))
        self.assertEqual(rules.axes_for("t/attention/query/bias", (4, 4)), ("model", None))
        self.assertEqual(rules.axes_for("t/attention/attention_output/kernel", (4, 4, 16)), ("model", None, None))
        self.assertEqual(rules.axes_for("t/attention/attention_output/bias", (16,)), (None,))
        self.assertEqual(rules.axes_for("t/norm/gamma", (16,)), (None,))
        self.assertIn("embedding: split by rows", rules.explain("t/token/embeddings"))

    def test_heads_the_axis_does_not_divide_stay_whole_and_say_why(self):
        rules = self._rules()
        self.assertEqual(rules.axes_for("t/attention/key/kernel", (16, 2, 8)), (None, None, None))
        self.assertIn("2 heads do not divide model=4", rules.explain("t/attention/key/kernel"))

    def test_convolution_kernels_stay_whole_and_the_next_dense_starts_a_pair(self):
        # TF's DTensor convolves only whole filters (MeshErrorsTest).
        rules = self._rules()
        self.assertEqual(rules.axes_for("c/conv/kernel", (3, 3, 1, 8)), (None, None, None, None))
        self.assertEqual(rules.axes_for("c/conv/bias", (8,)), (None,))
        self.assertIn("whole filters", rules.explain("c/conv/kernel"))
        self.assertEqual(rules.axes_for("c/dense/kernel", (8, 16)), (None, "model"))

    def test_a_mesh_with_only_the_batch_axis_splits_nothing(self):
        rules = self._rules({"batch": 4})
        self.assertEqual(rules.axes_for("m/up/kernel", (8, 16)), (None, None))


if __name__ == "__main__":
    absltest.main()
