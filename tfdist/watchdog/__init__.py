"""Bounded waits for a job of several tasks: lost or stuck peers become tfdist errors.

TF leaves the waits of a multi-task job unbounded or unnamed: start-up
waits forever for a task that never starts, a killed peer surfaces (if at
all) as a TF error from deep inside `fit`, a stuck peer leaves every other
task waiting in a collective forever, and a process can hang at exit in the
coordination service's shutdown barrier. tfdist bounds each:

- `startup`: before TF starts, configure the coordination service's
  register, heartbeat and shutdown-barrier timeouts from `timeout_s`,
  refuse a second process with this task's address, and name the tasks
  that refuse connections when start-up fails (any strategy with several
  tasks: multi-worker, parameter servers);
- `clock`: count this process's cross-task collectives as they start and
  finish (every collective of training, and the one-time broadcast of
  initial variable values);
- `peer_watchdog`: a thread that probes peers, reports a lost one, and
  aborts a collective that waited `timeout_s`, naming the tasks that did
  not arrive at it.

The errors raised are `tfdist.errors.WorkerUnavailableError` and
`CollectiveTimeoutError`, also TF's `UnavailableError` and
`DeadlineExceededError` (`tfdist/_internal/tf_errors.py`).
"""
