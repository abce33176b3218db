"""Tests for tfdist.placement: the pure-Python stage planner, on fake devices.

Properties (hypothesis): every layer is placed exactly once, stages are
contiguous and in order, the bottleneck equals the brute-force optimum over
all contiguous partitions, and among optimal partitions the plan moves the
fewest activation bytes. `ImportWithoutTensorFlowTest` proves the package
imports with TensorFlow unimportable.
"""

from __future__ import annotations

import itertools
import math
import pathlib
import subprocess
import sys
import textwrap

import hypothesis
from absl.testing import absltest
from absl.testing import parameterized
from hypothesis import strategies as st

from tfdist import errors
from tfdist import placement

_SETTINGS = hypothesis.settings(max_examples=150, deadline=None, database=None)
DEVICES = tuple(f"/device:CPU:{i}" for i in range(6))


def _graph(costs, edges=()):
    return placement.LayerGraph(
        tuple(placement.LayerProfile(f"l{i}", params=c, param_bytes=4 * c) for i, c in enumerate(costs)),
        tuple(placement.ActivationEdge(p, q, b) for p, q, b in edges),
    )


def _partitions(n, k):
    """Every split of range(n) into k non-empty contiguous runs, as start lists."""
    for cuts in itertools.combinations(range(1, n), k - 1):
        yield [0, *cuts]


def _bottleneck(costs, starts):
    bounds = list(starts) + [len(costs)]
    return max(sum(costs[a:b]) for a, b in zip(bounds, bounds[1:]))


def _crossing(graph, starts):
    cuts = graph.cut_bytes()
    return sum(cuts[s - 1] for s in starts[1:])


@st.composite
def _graphs(draw):
    n = draw(st.integers(1, 8))
    costs = draw(st.lists(st.integers(0, 20), min_size=n, max_size=n))
    edges = []
    for q in range(1, n):
        edges.append((q - 1, q, draw(st.integers(0, 50))))  # the main chain
        if q >= 2 and draw(st.booleans()):  # a skip connection
            edges.append((draw(st.integers(0, q - 2)), q, draw(st.integers(0, 50))))
    return costs, _graph(costs, edges)


class PlanStagesPropertyTest(parameterized.TestCase):

    @hypothesis.settings(_SETTINGS)
    @hypothesis.given(_graphs(), st.integers(1, 6))
    def test_every_layer_placed_once_in_contiguous_ordered_stages(self, drawn, num_devices):
        costs, graph = drawn
        plan = placement.plan_stages(graph, DEVICES[:num_devices])
        indices = [i for stage in plan.stages for i in stage.layer_indices]
        self.assertEqual(indices, list(range(len(costs))))
        for stage in plan.stages:
            self.assertNotEmpty(stage.layer_indices)
        self.assertEqual([s.index for s in plan.stages], list(range(plan.num_stages)))
        self.assertEqual(plan.num_stages, min(len(costs), num_devices))
        self.assertEqual(plan.devices + plan.idle_devices, DEVICES[:num_devices])

    @hypothesis.settings(_SETTINGS)
    @hypothesis.given(_graphs(), st.integers(1, 6))
    def test_bottleneck_and_crossing_bytes_are_brute_force_optimal(self, drawn, num_devices):
        costs, graph = drawn
        plan = placement.plan_stages(graph, DEVICES[:num_devices])
        k = min(len(costs), num_devices)
        candidates = list(_partitions(len(costs), k))
        best = min(_bottleneck(costs, p) for p in candidates)
        self.assertEqual(plan.bottleneck, best)
        fewest = min(_crossing(graph, p) for p in candidates if _bottleneck(costs, p) == best)
        starts = [stage.layer_indices[0] for stage in plan.stages]
        self.assertEqual(_crossing(graph, starts), fewest)
        self.assertEqual(
            [s.output_bytes for s in plan.stages[:-1]],
            [graph.cut_bytes()[s - 1] for s in starts[1:]],
        )


class PlanStagesTest(parameterized.TestCase):

    def test_unbalanced_stack_puts_heavy_layer_alone(self):
        plan = placement.plan_stages(_graph([1, 1, 1, 9, 1, 1]), DEVICES[:2])
        self.assertEqual([s.layers for s in plan.stages], [("l0", "l1", "l2"), ("l3", "l4", "l5")])
        self.assertEqual(plan.bottleneck, 11)

    def test_ties_broken_by_fewest_activation_bytes(self):
        # [2 | 2 2] and [2 2 | 2] both... bottleneck 4: cuts after l0 or l1.
        graph = _graph([2, 2, 2], [(0, 1, 100), (1, 2, 10)])
        plan = placement.plan_stages(graph, DEVICES[:2])
        self.assertEqual(plan.stages[0].layers, ("l0", "l1"))
        self.assertEqual(plan.stages[0].output_bytes, 10)

    def test_skip_connection_bytes_count_on_every_cut_they_cross(self):
        graph = _graph([1, 1, 1, 1], [(0, 1, 1), (1, 2, 1), (2, 3, 1), (0, 3, 7)])
        self.assertEqual(graph.cut_bytes(), (8, 8, 8))

    def test_more_devices_than_layers_leaves_the_rest_idle(self):
        plan = placement.plan_stages(_graph([3, 5]), DEVICES[:4])
        self.assertEqual(plan.num_stages, 2)
        self.assertEqual(plan.idle_devices, DEVICES[2:4])

    @parameterized.named_parameters(
        ("params", "params", ("a",)),
        ("flops", "flops", ("a", "b", "c")),
        ("measured", "measured", ("a", "b", "c")),
    )
    def test_balances_by_the_requested_cost(self, balance_by, first_stage):
        # Weights sit in "a"; compute and time in "d".
        layers = [placement.LayerProfile("a", params=1000, flops=1.0, measured_s=0.001)]
        layers += [placement.LayerProfile(n, params=1, flops=1.0, measured_s=0.001) for n in "bc"]
        layers += [placement.LayerProfile("d", params=1, flops=1e3, measured_s=1.0)]
        plan = placement.plan_stages(placement.LayerGraph(tuple(layers)), DEVICES[:2], balance_by=balance_by)
        self.assertEqual(plan.stages[0].layers, first_stage)

    def test_large_model_plans_quickly_enough_to_run_at_first_step(self):
        graph = _graph([(i * 37) % 101 for i in range(2000)], [(i, i + 1, i % 7) for i in range(1999)])
        plan = placement.plan_stages(graph, DEVICES[:6])
        self.assertEqual(plan.num_stages, 6)
        self.assertLessEqual(plan.bottleneck, math.ceil(sum((i * 37) % 101 for i in range(2000)) / 6) + 101)

    def test_unknown_balance_by_raises_config_error(self):
        with self.assertRaisesRegex(errors.ConfigError, r"balance_by='time'.*'params', 'flops', 'measured'"):
            placement.plan_stages(_graph([1]), DEVICES[:1], balance_by="time")

    def test_measured_without_times_raises_placement_error(self):
        with self.assertRaisesRegex(errors.PlacementError, r"\['l0'\] were not timed"):
            placement.plan_stages(_graph([1]), DEVICES[:1], balance_by="measured")

    def test_empty_graph_raises_placement_error(self):
        with self.assertRaisesRegex(errors.PlacementError, "no layers to place"):
            placement.LayerGraph(())


class PlanFromAssignmentTest(parameterized.TestCase):

    def test_unnamed_layers_follow_the_layer_before(self):
        plan = placement.plan_from_assignment(_graph([1] * 5), {"l1": "/d:0", "l3": "/d:1"})
        self.assertEqual([s.layers for s in plan.stages], [("l0", "l1", "l2"), ("l3", "l4")])
        self.assertEqual(plan.devices, ("/d:0", "/d:1"))

    def test_returning_to_a_device_makes_another_stage_there(self):
        plan = placement.plan_from_assignment(_graph([1] * 3), {"l0": "/d:0", "l1": "/d:1", "l2": "/d:0"})
        self.assertEqual(plan.devices, ("/d:0", "/d:1", "/d:0"))

    def test_unknown_layer_name_raises_naming_it_and_the_real_ones(self):
        with self.assertRaisesRegex(errors.PlacementError, r"\['dense_9'\].*\['l0', 'l1'\]"):
            placement.plan_from_assignment(_graph([1, 1]), {"dense_9": "/d:0"})

    def test_more_devices_than_layers_with_a_map_raises(self):
        with self.assertRaisesRegex(errors.PlacementError, r"3 stages but the model has only 2 layers.*at most 2"):
            placement.plan_from_assignment(_graph([1, 1]), {"l0": "/d:0", "l1": "/d:1"},
                                           devices=["/d:0", "/d:1", "/d:2"])

    def test_device_outside_devices_raises(self):
        with self.assertRaisesRegex(errors.PlacementError, r"\['/d:7'\], which are not among"):
            placement.plan_from_assignment(_graph([1, 1]), {"l0": "/d:7"}, devices=["/d:0"])

    def test_listed_device_without_layer_raises(self):
        with self.assertRaisesRegex(errors.PlacementError, r"devices \['/d:1'\] get no layer"):
            placement.plan_from_assignment(_graph([1, 1, 1]), {"l0": "/d:0"}, devices=["/d:0", "/d:1"])

    def test_empty_map_raises(self):
        with self.assertRaisesRegex(errors.PlacementError, r"placement=\{\} names no layer"):
            placement.plan_from_assignment(_graph([1]), {})

    def test_ambiguous_layer_name_raises(self):
        graph = placement.LayerGraph((placement.LayerProfile("d"), placement.LayerProfile("d")))
        with self.assertRaisesRegex(errors.PlacementError, r"several top-level layers with that name"):
            placement.plan_from_assignment(graph, {"d": "/d:0"})


class PipelineMathAndReportTest(absltest.TestCase):

    def test_ideal_speedup_and_bubble_are_gpipes(self):
        self.assertAlmostEqual(placement.ideal_speedup(2, 4), 1.6)
        self.assertAlmostEqual(placement.ideal_speedup(4, 8), 32 / 11)
        self.assertAlmostEqual(placement.bubble_fraction(4, 8), 3 / 11)
        self.assertEqual(placement.ideal_speedup(1, 8), 1.0)

    def test_report_lists_every_layer_with_its_device_and_stage_numbers(self):
        plan = placement.plan_stages(_graph([1, 1, 3], [(0, 1, 2048), (1, 2, 2048)]), DEVICES[:3])
        report = placement.PlacementReport("net", plan, 4, 8, (0.001, 0.001, 0.002), ("l2",))
        text = str(report)
        self.assertIn("3 stage(s)", text)
        self.assertIn("bubble 33%", text)
        self.assertIn("for 8 row(s)", text)
        self.assertRegex(text, r"l2 +/device:CPU:2 +stage 2 +\(rematerialized\)")
        self.assertIn("2.0 KiB", text)
        self.assertAlmostEqual(report.measured_balance, (0.004 / 3) / 0.002)


class ImportWithoutTensorFlowTest(absltest.TestCase):

    def test_placement_imports_and_plans_with_tensorflow_blocked(self):
        package_dir = pathlib.Path(placement.__file__).parents[1]  # tfdist/
        script = textwrap.dedent(
            f"""
            import sys, types
            sys.modules["tensorflow"] = None  # Any import of it now fails.
            for name, folder in [("tfdist", ""), ("tfdist._internal", "_internal")]:
                package = types.ModuleType(name)
                package.__path__ = [{str(package_dir)!r} + "/" + folder]
                sys.modules[name] = package
            from tfdist import placement
            graph = placement.LayerGraph((placement.LayerProfile("a", params=1),))
            print(placement.plan_stages(graph, ["/cpu:0"]).devices)
            """
        )
        result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("('/cpu:0',)", result.stdout)


if __name__ == "__main__":
    absltest.main()
