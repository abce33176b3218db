"""Another object's attributes or class changed for a block, or in place (`_internal/attributes`)."""

from __future__ import annotations

from absl.testing import absltest

from tfdist._internal import attributes


class Optimizer:
    def apply(self):
        return "class"


class InstanceAttributesTest(absltest.TestCase):

    def test_a_method_is_shadowed_on_one_instance_for_the_block_only(self):
        one, other = Optimizer(), Optimizer()
        with attributes.instance_attributes(one, {"apply": lambda: "instance"}):
            self.assertEqual((one.apply(), other.apply()), ("instance", "class"))
        self.assertEqual(one.apply(), "class")
        self.assertNotIn("apply", vars(one))

    def test_an_instance_value_there_before_is_back_after(self):
        one = Optimizer()
        one.apply = lambda: "own"
        with attributes.instance_attributes(one, {"apply": lambda: "instance"}):
            self.assertEqual(one.apply(), "instance")
        self.assertEqual(one.apply(), "own")

    def test_restored_when_the_block_raises(self):
        one = Optimizer()
        with self.assertRaises(ValueError):
            with attributes.instance_attributes(one, {"apply": lambda: "instance"}):
                raise ValueError("in the block")
        self.assertEqual(one.apply(), "class")


class SwapClassTest(absltest.TestCase):

    def test_the_instance_becomes_one_of_the_subclass(self):
        class Gated(Optimizer):
            def apply(self):
                return "gated"

        one = Optimizer()
        attributes.swap_class(one, Gated)
        self.assertEqual((type(one), one.apply()), (Gated, "gated"))


class SetInstanceAttributesTest(absltest.TestCase):

    def test_one_instance_changes_for_good_and_the_class_does_not(self):
        one, other = Optimizer(), Optimizer()
        attributes.set_instance_attributes(one, {"apply": lambda: "instance"})
        self.assertEqual((one.apply(), other.apply(), Optimizer.apply(one)), ("instance", "class", "class"))


class SharedPatchTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.patch = attributes.SharedPatch(
            lambda: [(Optimizer, "apply", lambda original: lambda self: "patched " + original(self))]
        )
        self.original = vars(Optimizer)["apply"]

    def test_installed_inside_and_exactly_the_original_back_after(self):
        with self.patch.active():
            self.assertEqual(Optimizer().apply(), "patched class")
        self.assertIs(vars(Optimizer)["apply"], self.original)
        self.assertFalse(self.patch.installed)

    def test_nested_holders_wrap_once_and_the_last_one_out_restores(self):
        with self.patch.active():
            with self.patch.active():
                self.assertEqual(Optimizer().apply(), "patched class")
            self.assertEqual(Optimizer().apply(), "patched class")
        self.assertIs(vars(Optimizer)["apply"], self.original)

    def test_a_holder_that_raises_still_restores(self):
        with self.assertRaises(ValueError):
            with self.patch.active():
                raise ValueError("in the block")
        self.assertIs(vars(Optimizer)["apply"], self.original)


if __name__ == "__main__":
    absltest.main()
