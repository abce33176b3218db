"""ClusterAgreement: every task stops at the same step, wherever the notice lands.

The tasks run in lockstep here as a synchronous job's do (no task completes
step t + 1 before every task has finished step t), on a dict standing in for
TF's coordination service; the real service is used in
tests/integration/elastic_test.py.
"""

from __future__ import annotations

from unittest import mock

import tensorflow as tf
from absl.testing import parameterized

import tfdist

from tfdist.elastic import agreement as agreement_lib


class _Store:
    """The coordination service's key-value calls, on a dict.

    A read that waits less than the service's round trip (`_REPORT_S`)
    misses every key set in the current step (`step`): the worst case of a
    short wait on a loaded machine.
    """

    def __init__(self):
        self.values = {}
        self.set_at = {}
        self.step = 0
        self.short_reads = 0

    def set_key(self, key, value):
        if key in self.values:
            raise tf.errors.AlreadyExistsError(None, None, f"{key} exists")
        self.values[key] = value
        self.set_at[key] = self.step

    def get_key(self, key, *, timeout_s):
        if timeout_s < agreement_lib._REPORT_S:
            self.short_reads += 1
            if self.set_at.get(key) == self.step:
                return None
        return self.values.get(key)


def _run(tasks, notices, *, watch_delays, steps=40, store=None):
    """Steps every task in lockstep; returns the step each stopped after.

    notices: task -> the step after which it receives SIGTERM.
    watch_delays: task -> how many steps its watcher lags behind the key.
    """
    store = _Store() if store is None else store
    with mock.patch.object(agreement_lib, "coordination", store):
        agreements = {t: agreement_lib.ClusterAgreement(t, tasks) for t in tasks}
        announced_at = None
        stopped = {}
        for step in range(1, steps + 1):
            store.step = step
            for task in tasks:  # Each finishes its step `step`, in turn.
                if task in stopped:
                    continue
                if announced_at is not None and step - announced_at >= watch_delays[task]:
                    agreements[task].check_for_notice()
                requested = step >= notices.get(task, steps + 1)
                if agreements[task].should_stop(step, requested):
                    stopped[task] = step
                if announced_at is None and agreement_lib._STOP_KEY.format(fit=0) in store.values:
                    announced_at = step
            if stopped:
                # A task that stopped leaves the others unable to finish
                # the next step: all must have stopped at this one.
                return stopped
    return stopped


class ClusterAgreementTest(tf.test.TestCase, parameterized.TestCase):
    TASKS = ("worker:0", "worker:1", "worker:2")

    @parameterized.named_parameters(
        dict(testcase_name="one_task_notified", notices={"worker:2": 5}, delays=(0, 0, 0)),
        dict(testcase_name="slow_watchers", notices={"worker:0": 5}, delays=(0, 3, 7)),
        dict(testcase_name="every_task_notified_apart", notices={"worker:0": 9, "worker:1": 5, "worker:2": 12}, delays=(2, 2, 2)),
        dict(testcase_name="first_task_notified_last_watches_at_once", notices={"worker:1": 3}, delays=(4, 0, 0)),
    )
    def test_every_task_stops_after_the_same_step(self, notices, delays):
        stopped = _run(self.TASKS, notices, watch_delays=dict(zip(self.TASKS, delays)))
        self.assertLen(stopped, len(self.TASKS))
        self.assertLen(set(stopped.values()), 1, stopped)
        self.assertGreaterEqual(min(stopped.values()), min(notices.values()))

    def test_reads_at_the_step_end_of_a_tasks_own_report_wait_briefly(self):
        # There a long wait would stall every task: a peer that has not seen
        # the notice publishes only after the next step, which waits for
        # this task. The store's short reads miss every report of their own
        # step, and the tasks still stop together (the test above).
        store = _Store()
        waits = []

        def get_key(key, *, timeout_s):
            waits.append(timeout_s)
            return _Store.get_key(store, key, timeout_s=timeout_s)

        store.get_key = get_key
        with mock.patch.object(agreement_lib, "coordination", store):
            agreement = agreement_lib.ClusterAgreement("worker:0", self.TASKS)
            store.step = 5
            self.assertFalse(agreement.should_stop(5, True))  # Publishes 5.
            self.assertEqual(waits, [agreement_lib._FIRST_REPORT_S])  # worker:1's, missing.
            store.set_key(agreement_lib._AT_KEY.format(fit=0, task="worker:1"), "6")
            store.set_key(agreement_lib._AT_KEY.format(fit=0, task="worker:2"), "6")
            store.step = 6
            self.assertFalse(agreement.should_stop(6, True))  # S = 7.
            self.assertEqual(waits[1:], [agreement_lib._REPORT_S] * 2)
            self.assertTrue(agreement.should_stop(7, True))

    def test_a_later_fit_does_not_see_an_earlier_fits_notice(self):
        store = _Store()
        with mock.patch.object(agreement_lib, "coordination", store):
            first = agreement_lib.ClusterAgreement("worker:0", self.TASKS, fit_index=0)
            first.should_stop(3, True)  # Announced and published in fit 0.
            second = agreement_lib.ClusterAgreement("worker:0", self.TASKS, fit_index=1)
            self.assertFalse(second.check_for_notice())
            self.assertFalse(second.should_stop(3, False))

    def test_tasks_that_restored_different_states_raise_config_error(self):
        store = _Store()
        with mock.patch.object(agreement_lib, "coordination", store):
            chief = agreement_lib.ClusterAgreement("worker:0", self.TASKS)
            other = agreement_lib.ClusterAgreement("worker:1", self.TASKS)
            chief.check_same_state("state-7", is_writer=True, timeout_s=1)
            other.check_same_state("state-7", is_writer=False, timeout_s=1)
            with self.assertRaisesRegex(
                tfdist.errors.ConfigError, r"worker:2 found the training state 'none'.*the chief 'state-7'"
            ):
                agreement_lib.ClusterAgreement("worker:2", self.TASKS).check_same_state(
                    "", is_writer=False, timeout_s=1
                )

    def test_a_chief_that_says_nothing_ends_in_a_timeout_error(self):
        with mock.patch.object(agreement_lib, "coordination", _Store()):
            with self.assertRaisesRegex(tfdist.errors.CollectiveTimeoutError, "waited 2 s for the chief"):
                agreement_lib.ClusterAgreement("worker:1", self.TASKS).check_same_state(
                    "", is_writer=False, timeout_s=2
                )

    def test_without_a_notice_no_task_stops(self):
        self.assertEqual(_run(self.TASKS, {}, watch_delays=dict.fromkeys(self.TASKS, 0)), {})

    def test_a_task_that_never_sees_the_notice_keeps_the_others_training(self):
        # Its report is missing, so no stop step is fixed and nobody stops
        # alone (which would leave the others in a collective forever).
        tasks = ("worker:0", "worker:1")
        stopped = _run(tasks, {"worker:0": 2}, watch_delays={"worker:0": 0, "worker:1": 10**6})
        self.assertEqual(stopped, {})


class LocalAgreementTest(tf.test.TestCase):
    def test_stops_at_the_first_step_end_after_the_notice(self):
        agreement = agreement_lib.LocalAgreement()
        self.assertFalse(agreement.should_stop(3, False))
        self.assertTrue(agreement.should_stop(4, True))


if __name__ == "__main__":
    tf.test.main()
