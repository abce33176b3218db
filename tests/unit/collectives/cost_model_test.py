"""The alpha-beta cost model: formulas, choices and calibration."""

from __future__ import annotations

import math
import os
from unittest import mock


from absl.testing import parameterized
import tensorflow as tf

import tfdist
from tfdist import errors
from tfdist.collectives import calibration_cache
from tfdist.collectives import cost_model

# The textbook setting: every algorithm has the same link constants.
EQUAL_LINKS = {
    name: cost_model.AlphaBeta(alpha_s=1e-4, beta_s_per_byte=1e-9)
    for name in ("ring", "tree", "reduce_to_one")
}


class FormulaTest(parameterized.TestCase):

    @parameterized.named_parameters(
        {"testcase_name": "ring_4", "algorithm": "ring", "n": 4,
         "steps": 6, "factor": 1.5},
        {"testcase_name": "tree_4", "algorithm": "tree", "n": 4,
         "steps": 4, "factor": 4.0},
        {"testcase_name": "tree_3", "algorithm": "tree", "n": 3,
         "steps": 4, "factor": 4.0},
        {"testcase_name": "reduce_to_one_4", "algorithm": "reduce_to_one", "n": 4,
         "steps": 2, "factor": 6.0},
    )
    def test_steps_and_byte_factor_follow_the_documented_formulas(
        self, algorithm, n, steps, factor
    ):
        self.assertEqual(cost_model.step_count(algorithm, n), steps)
        self.assertAlmostEqual(cost_model.byte_factor(algorithm, n), factor)

    def test_reduce_only_halves_tree_and_reduce_to_one_but_not_ring(self):
        for name in ("tree", "reduce_to_one"):
            self.assertEqual(
                2 * cost_model.step_count(name, 8, reduce_only=True),
                cost_model.step_count(name, 8),
            )
        self.assertEqual(
            cost_model.byte_factor("ring", 8, reduce_only=True),
            cost_model.byte_factor("ring", 8),
        )

    def test_predicted_time_is_alpha_steps_plus_beta_bytes(self):
        constants = cost_model.AlphaBeta(alpha_s=2.0, beta_s_per_byte=0.5)
        self.assertAlmostEqual(
            cost_model.predicted_time_s("ring", 4, 8, constants),
            6 * 2.0 + 1.5 * 8 * 0.5,
        )


class ChooseTest(parameterized.TestCase):

    def test_large_messages_choose_ring_with_equal_links(self):
        model = cost_model.CostModel(EQUAL_LINKS)
        self.assertEqual(model.choose(num_devices=8, num_bytes=64 << 20), "ring")

    def test_tiny_messages_choose_fewest_steps_with_equal_links(self):
        model = cost_model.CostModel(EQUAL_LINKS)
        self.assertEqual(model.choose(num_devices=8, num_bytes=4), "reduce_to_one")

    def test_crossover_size_matches_the_formulas(self):
        model = cost_model.CostModel(
            {k: v for k, v in EQUAL_LINKS.items() if k != "reduce_to_one"}
        )
        n, alpha, beta = 8, 1e-4, 1e-9
        # ring == tree where 14a + 1.75 S b == 6 (a + S b)  =>  S = 8a / 4.25b
        crossover = 8 * alpha / (4.25 * beta)
        self.assertEqual(
            model.choose(num_devices=n, num_bytes=int(crossover * 0.9)), "tree"
        )
        self.assertEqual(
            model.choose(num_devices=n, num_bytes=int(crossover * 1.1)), "ring"
        )

    def test_unknown_algorithm_constants_raise_config_error(self):
        with self.assertRaisesRegex(errors.ConfigError, "butterfly"):
            cost_model.CostModel({"butterfly": EQUAL_LINKS["ring"]})

    def test_negative_alpha_raises_config_error(self):
        with self.assertRaisesRegex(errors.ConfigError, "alpha_s=-1"):
            cost_model.AlphaBeta(alpha_s=-1, beta_s_per_byte=0)

    def test_auto_all_reduce_uses_the_given_model_per_bucket(self):
        prefer_tree = dict(EQUAL_LINKS)
        prefer_tree["ring"] = cost_model.AlphaBeta(1.0, 1.0)
        prefer_tree["reduce_to_one"] = cost_model.AlphaBeta(1.0, 1.0)
        ops = tfdist.AutoAllReduce(cost_model=cost_model.CostModel(prefer_tree))
        self.assertEqual(ops.choose_algorithm(["/cpu:0", "/cpu:1"], 1 << 20), "tree")


class PackingTest(parameterized.TestCase):

    def test_free_packing_always_pays(self):
        model = cost_model.CostModel(EQUAL_LINKS)
        self.assertTrue(
            model.should_pack(num_devices=4, member_bytes=[4 << 20, 1 << 20, 40])
        )

    def test_packing_that_costs_more_than_the_saved_latency_does_not_pay(self):
        # Saving 2 collectives saves 2 * 2 * alpha (reduce_to_one, 2 steps)
        # = 0.4 ms; copying 5 MiB at 1 ns/byte costs ~5 ms.
        model = cost_model.CostModel(
            EQUAL_LINKS, pack=cost_model.AlphaBeta(alpha_s=0.0, beta_s_per_byte=1e-9)
        )
        self.assertFalse(
            model.should_pack(num_devices=4, member_bytes=[4 << 20, 1 << 20, 40])
        )

    def test_packing_small_tensors_pays_when_latency_dominates(self):
        model = cost_model.CostModel(
            EQUAL_LINKS, pack=cost_model.AlphaBeta(alpha_s=0.0, beta_s_per_byte=1e-9)
        )
        self.assertTrue(
            model.should_pack(num_devices=4, member_bytes=[64, 128, 40])
        )

    def test_pack_must_be_alpha_beta(self):
        with self.assertRaisesRegex(TypeError, "pack=0.5"):
            cost_model.CostModel(EQUAL_LINKS, pack=0.5)


class CalibrationTest(tf.test.TestCase):

    def test_calibration_measures_finite_non_negative_constants_once(self):
        devices = ["/device:CPU:0", "/device:CPU:1"]
        model = cost_model.CostModel()
        first = model.constants_for(devices, 8 << 20)  # The 4-16 MiB range.
        self.assertEqual(set(first), {"ring", "tree", "reduce_to_one"})
        for constants in first.values():
            self.assertTrue(math.isfinite(constants.alpha_s))
            self.assertGreaterEqual(constants.alpha_s, 0.0)
            self.assertGreaterEqual(constants.beta_s_per_byte, 0.0)
        # Cached: a second call reuses the measurement instead of re-timing.
        self.assertEqual(model.constants_for(devices, 8 << 20), first)
        # Packing (a concat per device) is measured too. (Whether some time
        # per byte shows depends on the machine's load while it is timed:
        # the fit is checked on known timings below.)
        pack = model.pack_constants_for(devices, 16 << 20)
        self.assertGreaterEqual(pack.alpha_s, 0.0)
        self.assertGreaterEqual(pack.beta_s_per_byte, 0.0)

    def _timed_model(self, seconds):
        """A CostModel whose calibration times `seconds(algorithm, size)` instead of running anything."""

        def timed(devices, *, sizes):
            return {
                size: {name: seconds(name, size) for name in ("ring", "tree", "reduce_to_one", "pack")}
                for size in sizes
            }

        self.enter_context(mock.patch.object(cost_model, "calibrate", timed))
        return cost_model.CostModel()

    def _constants_from_timings(self, seconds):
        """Constants fitted to `seconds(algorithm, size)` in the 4-16 MiB range, on 2 devices."""
        devices = ["/device:CPU:0", "/device:CPU:1"]
        model = self._timed_model(seconds)
        return model.constants_for(devices, 8 << 20), model.pack_constants_for(devices, 8 << 20)

    def test_constants_solve_each_algorithms_formula_from_two_sizes(self):
        alpha, beta = 2e-4, 3e-10

        def seconds(name, size):
            if name == "pack":
                return alpha + size * beta
            return (cost_model.step_count(name, 2) * alpha
                    + cost_model.byte_factor(name, 2) * size * beta)

        constants, pack = self._constants_from_timings(seconds)
        for name, found in {**constants, "pack": pack}.items():
            with self.subTest(name):
                self.assertAllClose([found.alpha_s, found.beta_s_per_byte], [alpha, beta], rtol=1e-9)

    def test_a_larger_message_timed_faster_gives_no_time_per_byte(self):
        # What load on the machine can do to two timings: never a negative constant.
        constants, _ = self._constants_from_timings(lambda name, size: 1e-2 if size < 8 << 20 else 5e-3)
        for name, found in constants.items():
            with self.subTest(name):
                self.assertEqual(found.beta_s_per_byte, 0.0)
                self.assertAllClose(found.alpha_s, 1e-2 / cost_model.step_count(name, 2))

    def test_calibrated_constants_depend_on_the_message_size_range(self):
        devices = ["/device:CPU:0", "/device:CPU:1"]
        # Time per byte grows past 4 MiB (out of cache), as on real machines.
        model = self._timed_model(
            lambda name, size: 1e-4 + size * (1e-10 if size <= 4 << 20 else 4e-10))
        small = model.constants_for(devices, 1 << 10)
        large = model.constants_for(devices, 1 << 30)
        self.assertEqual(
            small, model.constants_for(devices, cost_model.CALIBRATION_SIZES_BYTES[1])
        )
        self.assertNotEqual(small, large)


    def test_only_the_size_ranges_used_are_measured(self):
        devices = ["/device:CPU:0", "/device:CPU:1"]
        measured = []
        original = cost_model.calibrate

        def counting(devices, *, sizes):
            measured.extend(sizes)
            return original(devices, sizes=sizes)

        with mock.patch.object(cost_model, "calibrate", counting):
            cost_model.CostModel().choose(num_devices=2, num_bytes=512 << 10, devices=devices)
        self.assertEqual(sorted(measured), list(cost_model.CALIBRATION_SIZES_BYTES[:2]))


class CalibrationCacheTest(tf.test.TestCase):
    """Timings measured once per machine, read back by later processes."""

    DEVICES = ["/device:CPU:0", "/device:CPU:1"]

    def _cache(self) -> calibration_cache.CalibrationCache:
        return calibration_cache.CalibrationCache(self.create_tempdir().full_path)

    def test_a_new_model_reads_stored_timings_instead_of_measuring(self):
        cache = self._cache()
        first = cost_model.CostModel(cache=cache).constants_for(self.DEVICES, 1 << 10)

        def refuse(*args, **kwargs):
            raise AssertionError("measured again despite the cache")

        with mock.patch.object(cost_model, "calibrate", refuse):
            second = cost_model.CostModel(cache=cache).constants_for(self.DEVICES, 1 << 10)
        self.assertEqual(second, first)

    def test_corrupt_file_is_measured_again(self):
        cache = self._cache()
        path = cache.path(self.DEVICES, ["CPU", "CPU"])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write("{not json")
        self.assertEqual(cache.load(path), {})
        constants = cost_model.CostModel(cache=cache).constants_for(self.DEVICES, 1 << 10)
        self.assertEqual(set(constants), {"ring", "tree", "reduce_to_one"})
        self.assertNotEqual(cache.load(path), {})

    def test_other_devices_get_another_file(self):
        cache = self._cache()
        self.assertNotEqual(
            cache.path(self.DEVICES, ["CPU", "CPU"]),
            cache.path(self.DEVICES + ["/device:CPU:2"], ["CPU"] * 3),
        )


if __name__ == "__main__":
    tfdist.testing.main()
