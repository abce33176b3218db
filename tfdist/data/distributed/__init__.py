"""How tfdist strategies feed their replicas: one input pipeline per worker.

Every tfdist strategy distributes a dataset the same way (`distribute`):

- each worker runs **one** copy of the user's pipeline (a random shuffle,
  a generator, augmentation: whatever it is, one copy cannot disagree with
  itself), and every global batch it yields is cut into one slice per
  replica (`split`), in the order Keras concatenates `predict` outputs;
- the slices travel as a `PerReplica` value (a tfdist subclass that also
  knows the global batch's rows, `tfdist/_internal/input_values.py`), so
  custom loops see exactly the user's element structure, read by a plain
  host iterator (`dataset`), destroyed off the training thread when
  dropped (`iterator_reaper`: Keras drops one per epoch, and destroying it
  can wait for tf.data's autotuning thread);
- across workers, every worker reads the same batches when its pipeline
  is deterministic (`determinism`), and otherwise the chief runs the one
  pipeline and serves each worker its slices through TF's tf.data service
  (`data_service`);
- Keras's built-in train step gets per-row loss weights that make an
  uneven global batch train exactly like one device (`train_weights`);
  evaluation, prediction and custom loops get the plain slices.

Nothing here is public API: strategies use it through
`tfdist/data/distributed/strategy_input.py`.
"""
