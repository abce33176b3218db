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


if __name__ == "__main__":
    absltest.main()
