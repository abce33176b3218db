"""PreemptionNotice: SIGTERM becomes a flag, and the previous handler comes back."""

from __future__ import annotations

import os
import signal
import threading

import tensorflow as tf

from tfdist.elastic import notice as notice_lib


class PreemptionNoticeTest(tf.test.TestCase):
    def setUp(self):
        super().setUp()
        self.previous = signal.getsignal(signal.SIGTERM)
        self.seen = []
        signal.signal(signal.SIGTERM, lambda number, frame: self.seen.append(number))
        self.addCleanup(signal.signal, signal.SIGTERM, self.previous)

    def test_sigterm_sets_the_flag_instead_of_ending_the_process(self):
        notice = notice_lib.PreemptionNotice()
        notice.install()
        self.assertFalse(notice.requested)
        os.kill(os.getpid(), signal.SIGTERM)
        self.assertTrue(notice.requested)
        self.assertIsNotNone(notice.received_at)
        self.assertEqual(self.seen, [])  # Recorded as a notice only.

    def test_uninstall_puts_back_the_previous_handler(self):
        notice = notice_lib.PreemptionNotice()
        notice.install()
        notice.uninstall()
        os.kill(os.getpid(), signal.SIGTERM)
        self.assertFalse(notice.requested)
        self.assertEqual(self.seen, [signal.SIGTERM])

    def test_when_training_is_over_sigterm_goes_to_the_previous_handler(self):
        # A fit that raised never ends its callbacks: the handler must not
        # swallow the SIGTERM that is meant to end the process.
        notice = notice_lib.PreemptionNotice(is_active=lambda frame: frame.f_code.co_name == "never")
        notice.install()
        os.kill(os.getpid(), signal.SIGTERM)
        self.assertFalse(notice.requested)
        self.assertEqual(self.seen, [signal.SIGTERM])
        self.assertEqual(signal.getsignal(signal.SIGTERM).__name__, "<lambda>")  # Put back.

    def test_while_training_is_active_sigterm_is_a_notice(self):
        notice = notice_lib.PreemptionNotice(
            is_active=lambda frame: frame is not None and frame.f_code.co_name.startswith("test_")
        )
        notice.install()
        os.kill(os.getpid(), signal.SIGTERM)
        self.assertTrue(notice.requested)
        self.assertEqual(self.seen, [])

    def test_outside_the_main_thread_nothing_is_installed_and_request_still_works(self):
        notice = notice_lib.PreemptionNotice()
        thread = threading.Thread(target=notice.install)
        thread.start()
        thread.join()
        self.assertIsNot(signal.getsignal(signal.SIGTERM), self.previous)  # Ours from setUp.
        self.assertEqual(signal.getsignal(signal.SIGTERM).__name__, "<lambda>")
        notice.request()
        self.assertTrue(notice.requested)


if __name__ == "__main__":
    tf.test.main()
