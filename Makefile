# tfdist: every target sets itself up in .venv (idempotently), then runs.
#
#   make demo        distributed training of the example model on simulated devices
#   make test        the test suite, under Keras 3 and then tf-keras
#   make bench       benchmarks against TF's built-in strategies
#   make bazel-test  bazel test //... offline with Debian's Bazel 4
#   make docs        the documentation and API reference (Sphinx), warnings as errors

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Re-install only when setup.py changes; each stamp records the extras done.
STAMP_DIR := $(VENV)/.tfdist-stamps
# The slowest set-ups and tests, listed in every test run's log (where CI's time goes).
PYTEST_FLAGS ?= --durations=20 --durations-min=5
# Test processes (pytest-xdist; a file's tests stay in one process). Alone,
# the Keras 3 stage left a core idle in much of its time (process start-up,
# waits on peers and on timeouts that a fault test must reach): 617 s with
# two processes, 528 s with three. Beside the tf-keras stage, mypy and
# Sphinx (`make test`) the two cores are busy throughout and a third
# process only contends: the whole run took 875 s with two against 895 s
# with three (2026-11-28); with the tf-keras stage shortened (deferred_tf_keras),
# 1045 s with two against 1110 s with three. PYTEST_JOBS=0 runs serially. A test process that
# crashes (a segfault in TensorFlow) fails the run at once, naming its
# test: xdist's replacement worker under --dist loadfile can wait forever
# (pytest-dev/pytest-xdist#784).
PYTEST_JOBS ?= 2
# The tf-keras stage's tests compute more than they wait (it starts few
# clusters), so a third process there only contends: 248 s with two
# against 269 s with three (2026-11-27).
PYTEST_JOBS_TFKERAS ?= 2
xdist = $(if $(filter 0,$(1)),,-n $(1) --dist loadfile --max-worker-restart=0)
PYTEST_PARALLEL := $(call xdist,$(PYTEST_JOBS))
# Extra arguments for `bazel test`, e.g. --test_tag_filters=-slow (.ci/run).
BAZEL_TEST_ARGS ?=

.PHONY: demo test test-all test-keras3 test-tfkeras test-tfkeras-rest test-extended lint bench bazel-test docs venv clean

# Installs go through uv where it installs (the test extras in ~15 s against
# pip's ~46 s on a fresh venv, 2026-11-27), else through pip. uv, unlike pip,
# leaves packages without bytecode unless asked (--compile-bytecode: ~15 s
# once); without it every interpreter compiles what it imports, and with
# PYTHONDONTWRITEBYTECODE set (as on CI's machines) keeps none: importing
# TensorFlow, Keras, tf-keras and scikit-learn took 9.8 s of CPU against 3.7
# s, in each of the suite's many processes.
UV := $(VENV)/bin/uv

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q uv || $(PY) -m pip install -q --upgrade pip

$(STAMP_DIR)/%: setup.py | $(PY)
	extras=".[$(subst +,$(comma),$*)]"; \
	  { [ -x $(UV) ] && $(UV) pip install -q --compile-bytecode --python $(PY) -e "$$extras"; } \
	  || $(PY) -m pip install -q -e "$$extras"
	mkdir -p $(STAMP_DIR) && touch $@

comma := ,
EXTRAS_TEST := $(STAMP_DIR)/test+legacy+examples+docs
EXTRAS_DEMO := $(STAMP_DIR)/examples
EXTRAS_BENCH := $(STAMP_DIR)/bench+legacy+examples

venv: $(EXTRAS_TEST)

demo: $(EXTRAS_DEMO)
	$(PY) examples/digits.py

# Every stage runs, whatever the ones before it did; the run fails at the end
# if any stage failed, after one line per stage (tools/run_stages.sh). The
# stages run side by side (a+b+...): each test stage leaves the cores idle
# at times (waits on peers, timeouts, one file finishing last) and the
# others fill that time; mypy and Sphinx (~15 s of CPU) run beside the
# tests instead of after them. Their outputs print one after the other.
TEST_STAGES := test-keras3+test-tfkeras+lint+docs

test: $(EXTRAS_TEST)
	MAKE="$(MAKE)" tools/run_stages.sh $(TEST_STAGES)

# TF's own strategies' runs in the one-process conformance ports (the `tf`
# contender) check TensorFlow, not tfdist, and cost the most (TF's
# MirroredStrategy traces each replica apart; under load its replica threads
# wait on each other): `make test` leaves them out, every test that reads
# them skipping, saying so; TF_CONTENDER=1 runs them, as test-all does.
TF_CONTENDER ?= 0

# Every test but the extended ports (`extended` marker), with Keras 3 as tf.keras.
test-keras3: $(EXTRAS_TEST)
	TFDIST_TEST_TF_CONTENDER=$(TF_CONTENDER) $(PY) -m pytest tests -m "not extended" $(PYTEST_PARALLEL) $(PYTEST_FLAGS)

# Model-level tests again with tf-keras (TF_USE_LEGACY_KERAS=1): the numerics,
# unit and example tiers that start no cluster of processes, and the whole
# conformance tier (its multi-worker ports included) but its extended ports,
# less the numerics tests marked `deferred_tf_keras` (their paths under
# tf-keras are the conformance tier's or their file's other tests').
# test-tfkeras-rest runs the other multi-process model tests and the deferred
# ones under tf-keras;
# test-extended the extended ports (the keras-io examples), under both
# front ends; test-all runs everything. CI runs
# `test` (CONTRIBUTING.md, "CI").
# One pytest run (its workers' start-up paid once, and the conformance
# tier's clusters share the workers with the rest).
test-tfkeras: $(EXTRAS_TEST)
	TF_USE_LEGACY_KERAS=1 TFDIST_TEST_TF_CONTENDER=$(TF_CONTENDER) $(PY) -m pytest tests -m "model and (conformance or not multiprocess) and not extended and not deferred_tf_keras" $(call xdist,$(PYTEST_JOBS_TFKERAS)) $(PYTEST_FLAGS)

test-tfkeras-rest: $(EXTRAS_TEST)
	TF_USE_LEGACY_KERAS=1 $(PY) -m pytest tests -m "model and not conformance and (multiprocess or deferred_tf_keras)" $(PYTEST_PARALLEL) $(PYTEST_FLAGS)

# The second run takes the model-level ones only (`model`), as test-tfkeras does.
test-extended: $(EXTRAS_TEST)
	$(PY) -m pytest tests -m extended $(PYTEST_PARALLEL) $(PYTEST_FLAGS)
	TF_USE_LEGACY_KERAS=1 $(PY) -m pytest tests -m "extended and model" $(PYTEST_PARALLEL) $(PYTEST_FLAGS)

test-all: $(EXTRAS_TEST)
	TF_CONTENDER=1 MAKE="$(MAKE)" tools/run_stages.sh $(TEST_STAGES) test-tfkeras-rest test-extended

lint: $(EXTRAS_TEST)
	$(PY) -m mypy --ignore-missing-imports tfdist

bench: $(EXTRAS_BENCH)
	$(PY) benchmarks/allreduce.py
	TF_CPU_ALLOCATOR_USE_BFC=true $(PY) benchmarks/allreduce.py
	$(PY) benchmarks/fit.py --workload=throughput
	$(PY) benchmarks/fit.py --workload=latency
	$(PY) benchmarks/fit.py --workload=epochs
	$(PY) benchmarks/epoch_boundary.py
	$(PY) benchmarks/input_pipeline.py
	$(PY) benchmarks/multiworker.py --workload=comm_bound
	$(PY) benchmarks/multiworker.py --workload=compute_bound
	$(PY) benchmarks/multiworker.py --workload=compute_bound --keras=keras3
	$(PY) benchmarks/cross_worker_latency.py
	$(PY) benchmarks/ps.py
	$(PY) benchmarks/ps_rpcs.py --only="tfdist async, Keras 3" --only="TF ParameterServerStrategy, tf-keras"
	$(PY) benchmarks/ps_modes.py
	$(PY) benchmarks/embedding.py
	$(PY) benchmarks/placement.py
	$(PY) benchmarks/placement.py --workload=balance --global_batch_size=1024
	$(PY) benchmarks/placement.py --workload=rematerialize
	$(PY) benchmarks/mesh_route.py
	$(PY) benchmarks/mesh.py --workload=mlp --steps_per_epoch=20
	$(PY) benchmarks/mesh.py --workload=transformer --steps_per_epoch=20
	$(PY) benchmarks/mesh_memory.py --plot=benchmarks/mesh_memory.png

# The pages of docs/ and the API reference from the docstrings, offline:
# nitpicky (-n), every warning an error (-W, after reporting them all). The
# source directory is the repository root, narrowed by docs/conf.py to docs/
# and the Markdown files its pages link to, so those links are checked too.
docs: $(EXTRAS_TEST)
	$(VENV)/bin/sphinx-build -W --keep-going -n --no-color -c docs -b html . docs/_build/html
	@echo "Open docs/_build/html/docs/index.html"

# Installs bazel-bootstrap + bazel-rules-java via apt-get if missing, runs
# `bazel --batch test //...` (no server left behind) with the venv's Python, and
# ends with "N passed, M failed". BUILD is generated: python tools/build_gen.py
bazel-test: $(EXTRAS_TEST)
	tools/bazel_test.sh $(abspath $(PY)) $(BAZEL_TEST_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache docs/_build
