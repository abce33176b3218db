"""The staleness window of tfdist's parameter-server scheduler (pure arithmetic).

The bound it must keep: a function overlaps at most 2(w - 1) others of
at most s steps each, so 2(w - 1)s <= k (scheduler module docstring).
The measured side runs in tests/integration/parameter_server_staleness_test.py.
"""

from __future__ import annotations

from absl.testing import absltest
from absl.testing import parameterized

from tfdist.parameter_server import scheduler


class StalenessWindowTest(parameterized.TestCase):

    def test_unbounded_uses_the_whole_window(self):
        self.assertEqual(scheduler.staleness_window(None, 4, 6), 6)

    @parameterized.named_parameters(
        ("zero_runs_one_at_a_time", 0, 1, 1),
        ("one_still_one_at_a_time", 1, 1, 1),
        ("two_allows_a_neighbour", 2, 1, 2),
        ("five", 5, 1, 3),
        ("steps_per_execution_shrinks_it", 4, 2, 2),
        ("steps_per_execution_larger_than_k", 3, 4, 1),
    )
    def test_window_for_staleness(self, k, steps, expected):
        self.assertEqual(scheduler.staleness_window(k, steps, 100), expected)

    def test_window_never_exceeds_max_in_flight(self):
        self.assertEqual(scheduler.staleness_window(1000, 1, 4), 4)

    def test_every_window_keeps_the_bound(self):
        for k in range(0, 30):
            for steps in range(1, 6):
                w = scheduler.staleness_window(k, steps, 1000)
                self.assertLessEqual(2 * (w - 1) * steps, k, (k, steps, w))
                # And it is the largest window that does.
                self.assertGreater(2 * w * steps, k, (k, steps, w))


if __name__ == "__main__":
    absltest.main()
