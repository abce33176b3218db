"""Four keras-io examples and guides, ported: each a function of the strategy it runs under.

Each runs in its own test file (keras_io_text_cnn_test.py,
keras_io_weather_lstm_test.py, keras_io_structured_data_test.py,
keras_guide_training_and_evaluation_test.py: `OneProcessContenders`), so
that test processes share the work, and all four under synchronous
parameter-server training in keras_io_examples_ps_test.py.

Sources (keras-team/keras-io):

- `text_cnn`: examples/nlp/text_classification_from_scratch.py. Kept: a
  `TextVectorization` with the example's `custom_standardization` (lower
  case, `<br />` and punctuation stripped), adapted on the text alone and
  mapped over batches of 32 raw strings, `cache().prefetch(10)`; the model
  (an `Embedding` of `max_features` rows, two `Conv1D(k=7, strides=3,
  relu)`, `GlobalMaxPooling1D`, a ReLU `Dense`, `Dense(1, sigmoid)`),
  `compile(loss="binary_crossentropy", optimizer="adam",
  metrics=["accuracy"])`, `fit` with `validation_data`, `evaluate`, and the
  end-to-end model on raw strings (the vectorizer, then the trained model)
  compiled alike and evaluated. Changed: synthetic texts, sequences of 40
  (not 500) tokens, embedding and filter widths 32 and 16 (not 128; the
  table keeps 20000 rows: 2.56 MB, so a parameter-server strategy splits
  it), 2 epochs.
- `weather_lstm`: examples/timeseries/timeseries_weather_forecasting.py.
  Kept: 7 features normalized by the training part's mean and deviation,
  the first 71.5 % for training, the label the second feature `future`
  steps after a window of `past` steps sampled every `step`,
  `timeseries_dataset_from_array`, `LSTM(32)` and `Dense(1)`,
  `Adam(0.001)` and MSE, `EarlyStopping(monitor="val_loss", patience=5)`
  and `ModelCheckpoint(save_weights_only=True, save_best_only=True)`, then
  `predict` on a validation batch. Changed: a synthetic series of 1,200
  steps, `past`/`future` 60/12 (not 720/72), batches of 64 (not 256), 2
  epochs, the checkpoint's name ending `.weights.h5` (Keras 3 requires it;
  every contender, one device included, fails on the example's
  `model_checkpoint.h5`).
- `structured_data`:
  examples/structured_data/structured_data_classification_from_scratch.py.
  Kept: dict features (six numeric, six integer categorical, one string
  categorical); the categorical ones encoded in the `tf.data` pipeline by
  `IntegerLookup`/`StringLookup(output_mode="multi_hot")` of the column's
  vocabulary, the numeric ones by `Normalization` layers adapted on the
  training dataset inside the model; a `Classifier` layer concatenating the
  dict's values into `Dense(32, relu)`, `Dropout` and `Dense(1, sigmoid)`;
  `compile("adam", "binary_crossentropy", metrics=["accuracy"])`, batches of
  32, `fit` with `validation_data`, `predict` of one sample. Changed: 303
  synthetic rows like the Cleveland heart data (242 train, 61 validation:
  uneven last batches), 2 epochs (not 50). The example's `"binary"` mode is
  `"multi_hot"`, its name in both front ends.
- `training_and_evaluation`: guides/training_with_built_in_methods.py
  ("Training & evaluation with the built-in methods"). Kept: the functional
  model (`Dense(64)`, `Dense(64)`, `Dense(10, softmax)` named as the guide
  names them), `RMSprop(1e-3)`, `SparseCategoricalCrossentropy` and
  `SparseCategoricalAccuracy`, `fit(batch_size=64, validation_data=...)`,
  `evaluate(batch_size=128)`, `predict` of 3 examples; then the guide's
  `CategoricalTruePositives` metric (a weight added in `__init__`, updated
  from `argmax` of the predictions) and `CustomMSE` loss (with a
  regularization factor) on one-hot labels, an `ExponentialDecay` learning
  rate and `EarlyStopping`. Changed: bundled digits (640 training, 128
  validation, 256 test) instead of MNIST, 2 epochs.

All: Dropout rates 0 (each contender draws other masks, which the comparison
would measure instead of the strategies), no unseeded shuffle (the
structured-data example's `shuffle(len)` is taken out: each contender would
draw another order), `verbose=0`, results returned instead of printed. Every
port builds and compiles its models inside `strategy.scope()`, as a
distributed script does.
"""

from __future__ import annotations

import os
import re
import shutil
import string
import tempfile

import numpy as np
import tensorflow as tf

from tests.conformance import harness

keras = tf.keras
layers = keras.layers


def _keep(record: harness.Record, model: keras.Model, **values) -> None:
    """Adds `values` to `record` and sets its weights to `model`'s."""
    record.values.update({name: np.array(value) for name, value in values.items()})
    record.weights = [np.array(w) for w in model.get_weights()]


def _history(history: keras.callbacks.History, prefix: str = "") -> dict[str, np.ndarray]:
    return {prefix + name: np.array(value) for name, value in history.history.items()}


# --- text classification from scratch --------------------------------------

MAX_FEATURES, EMBEDDING_DIM, SEQUENCE_LENGTH, FILTERS = 20000, 32, 40, 16
_WORDS = [f"w{i}" for i in range(300)]


def _texts(rng: np.random.Generator, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Reviews of 30-50 words with HTML breaks and punctuation; 1 if low words dominate."""
    texts, labels = [], []
    for _ in range(count):
        ids = rng.integers(0, len(_WORDS), size=rng.integers(30, 50))
        words = [_WORDS[i] + rng.choice(["", "", ",", "!"]) for i in ids]
        words.insert(len(words) // 2, "<br />")
        texts.append(" ".join(words).capitalize())
        labels.append(int((ids < 100).sum() > len(ids) / 3))
    return np.array(texts), np.array(labels, dtype="int32")


def custom_standardization(input_data):
    lowercase = tf.strings.lower(input_data)
    stripped_html = tf.strings.regex_replace(lowercase, "<br />", " ")
    return tf.strings.regex_replace(stripped_html, f"[{re.escape(string.punctuation)}]", "")


def text_cnn(strategy: tf.distribute.Strategy, workdir: str, record: harness.Record) -> None:
    del workdir
    rng = np.random.default_rng(0)
    batches = {
        name: tf.data.Dataset.from_tensor_slices(_texts(rng, count)).batch(32)
        for name, count in (("train", 320), ("val", 64), ("test", 96))
    }
    with strategy.scope():  # tf-keras: the end-to-end model's layers must be made in it.
        vectorize_layer = layers.TextVectorization(
            standardize=custom_standardization,
            max_tokens=MAX_FEATURES,
            output_mode="int",
            output_sequence_length=SEQUENCE_LENGTH,
        )
    vectorize_layer.adapt(batches["train"].map(lambda x, y: x))

    def vectorize_text(text, label):
        text = tf.expand_dims(text, -1)
        return vectorize_layer(text), label

    train_ds, val_ds, test_ds = (
        batches[name].map(vectorize_text).cache().prefetch(buffer_size=10)
        for name in ("train", "val", "test")
    )
    with strategy.scope():
        inputs = keras.Input(shape=(None,), dtype="int64")
        x = layers.Embedding(MAX_FEATURES, EMBEDDING_DIM)(inputs)
        x = layers.Dropout(0.0)(x)
        x = layers.Conv1D(FILTERS, 7, padding="valid", activation="relu", strides=3)(x)
        x = layers.Conv1D(FILTERS, 7, padding="valid", activation="relu", strides=3)(x)
        x = layers.GlobalMaxPooling1D()(x)
        x = layers.Dense(FILTERS, activation="relu")(x)
        x = layers.Dropout(0.0)(x)
        predictions = layers.Dense(1, activation="sigmoid", name="predictions")(x)
        model = keras.Model(inputs, predictions)
        model.compile(loss="binary_crossentropy", optimizer="adam", metrics=["accuracy"])
    history = model.fit(train_ds, validation_data=val_ds, epochs=2, verbose=0)
    _keep(record, model, **_history(history), evaluate=model.evaluate(test_ds, verbose=0))
    with strategy.scope():
        raw_inputs = keras.Input(shape=(1,), dtype="string")
        end_to_end_model = keras.Model(raw_inputs, model(vectorize_layer(raw_inputs)))
        end_to_end_model.compile(loss="binary_crossentropy", optimizer="adam", metrics=["accuracy"])
    _keep(record, model, end_to_end=end_to_end_model.evaluate(batches["test"], verbose=0))


# --- timeseries weather forecasting ----------------------------------------

PAST, FUTURE, STEP = 60, 12, 6


def _weather(rng: np.random.Generator, steps: int = 1200) -> np.ndarray:
    """Seven features: daily cycles of different phases, a slow trend, noise."""
    t = np.arange(steps)[:, None]
    phases = rng.uniform(0, 2 * np.pi, size=(1, 7))
    series = 10 * np.sin(2 * np.pi * t / 144 + phases) + 0.002 * t
    return (series + rng.normal(size=series.shape)).astype("float32")


def weather_lstm(strategy: tf.distribute.Strategy, workdir: str, record: harness.Record) -> None:
    data = _weather(np.random.default_rng(1))
    train_split = int(0.715 * len(data))
    features = (data - data[:train_split].mean(axis=0)) / data[:train_split].std(axis=0)
    train_data, val_data = features[:train_split], features[train_split:]
    start = PAST + FUTURE
    sequence_length = PAST // STEP
    dataset_train = keras.utils.timeseries_dataset_from_array(
        train_data,
        features[start : start + train_split, 1:2],
        sequence_length=sequence_length,
        sampling_rate=STEP,
        batch_size=64,
    )
    x_end = len(val_data) - PAST - FUTURE
    dataset_val = keras.utils.timeseries_dataset_from_array(
        val_data[:x_end],
        features[train_split + PAST + FUTURE :, 1:2],
        sequence_length=sequence_length,
        sampling_rate=STEP,
        batch_size=64,
    )
    with strategy.scope():
        inputs = keras.layers.Input(shape=(sequence_length, 7))
        lstm_out = keras.layers.LSTM(32)(inputs)
        outputs = keras.layers.Dense(1)(lstm_out)
        model = keras.Model(inputs=inputs, outputs=outputs)
        model.compile(optimizer=keras.optimizers.Adam(learning_rate=0.001), loss="mse")
    path_checkpoint = os.path.join(workdir, "model_checkpoint.weights.h5")
    es_callback = keras.callbacks.EarlyStopping(monitor="val_loss", min_delta=0, patience=5)
    modelckpt_callback = keras.callbacks.ModelCheckpoint(
        monitor="val_loss",
        filepath=path_checkpoint,
        verbose=0,
        save_weights_only=True,
        save_best_only=True,
    )
    history = model.fit(
        dataset_train,
        epochs=2,
        validation_data=dataset_val,
        callbacks=[es_callback, modelckpt_callback],
        verbose=0,
    )
    x, _ = next(iter(dataset_val))
    _keep(
        record,
        model,
        **_history(history),
        prediction=model.predict(x, verbose=0),
        checkpoint_written=os.path.exists(path_checkpoint),
    )


# --- structured data classification from scratch ---------------------------

NUMERIC_FEATURE_NAMES = ["age", "trestbps", "chol", "thalach", "oldpeak", "slope"]
CATEGORICAL_FEATURES_WITH_VOCABULARY = {
    "sex": [0, 1],
    "cp": [0, 1, 2, 3, 4],
    "fbs": [0, 1],
    "restecg": [0, 1, 2],
    "exang": [0, 1],
    "ca": [0, 1, 2, 3],
    "thal": ["fixed", "normal", "reversible"],
}
FEATURE_NAMES = NUMERIC_FEATURE_NAMES + list(CATEGORICAL_FEATURES_WITH_VOCABULARY)


def _heart(rng: np.random.Generator, rows: int = 303) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Columns like the Cleveland heart-disease table; the target from a few of them."""
    columns = {
        "age": rng.integers(29, 78, rows),
        "trestbps": rng.integers(94, 201, rows),
        "chol": rng.integers(126, 565, rows),
        "thalach": rng.integers(71, 203, rows),
        "oldpeak": np.round(rng.uniform(0, 6.2, rows), 1),
        "slope": rng.integers(1, 4, rows),
    }
    columns = {name: value.astype("float32") for name, value in columns.items()}
    for name, vocabulary in CATEGORICAL_FEATURES_WITH_VOCABULARY.items():
        columns[name] = np.array(vocabulary)[rng.integers(0, len(vocabulary), rows)]
    score = (columns["age"] - 50) / 10 + columns["oldpeak"] - (columns["thal"] == "normal") * 2
    return columns, (score + rng.normal(size=rows) > 0).astype("int64")


def encode_categorical(features, target):
    for feature_name in features:
        if feature_name in CATEGORICAL_FEATURES_WITH_VOCABULARY:
            lookup_class = (
                layers.StringLookup
                if features[feature_name].dtype == tf.string
                else layers.IntegerLookup
            )
            index = lookup_class(
                vocabulary=CATEGORICAL_FEATURES_WITH_VOCABULARY[feature_name],
                mask_token=None,
                num_oov_indices=0,
                output_mode="multi_hot",
            )
            features[feature_name] = index(features[feature_name])
    return dict(features), target


class Classifier(keras.layers.Layer):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.dense_1 = layers.Dense(32, activation="relu")
        self.dropout = layers.Dropout(0.0)
        self.dense_2 = layers.Dense(1, activation="sigmoid")

    def call(self, inputs):
        all_features = layers.concatenate(list(inputs.values()))
        return self.dense_2(self.dropout(self.dense_1(all_features)))


def structured_data(strategy: tf.distribute.Strategy, workdir: str, record: harness.Record) -> None:
    del workdir
    columns, target = _heart(np.random.default_rng(2))

    def dataframe_to_dataset(rows: slice) -> tf.data.Dataset:
        frame = {name: value[rows] for name, value in columns.items()}
        return tf.data.Dataset.from_tensor_slices((frame, target[rows])).map(encode_categorical)

    train_ds = dataframe_to_dataset(slice(0, 242)).batch(32)
    val_ds = dataframe_to_dataset(slice(242, None)).batch(32)

    def encode_numerical_feature(feature, name, dataset):
        normalizer = layers.Normalization()
        feature_ds = dataset.map(lambda x, y: x[name]).map(lambda x: tf.expand_dims(x, -1))
        normalizer.adapt(feature_ds)
        return normalizer(feature)

    with strategy.scope():
        inputs = {}
        for name in FEATURE_NAMES:
            if name in CATEGORICAL_FEATURES_WITH_VOCABULARY:
                inputs[name] = layers.Input(
                    name=name,
                    shape=(len(CATEGORICAL_FEATURES_WITH_VOCABULARY[name]),),
                    dtype="int64" if harness.KERAS_3 else "float32",
                )
            else:
                feature_input = layers.Input(name=name, shape=(1,), dtype="float32")
                inputs[name] = encode_numerical_feature(feature_input, name, train_ds)
        model = keras.Model(inputs, Classifier()(inputs))
        model.compile("adam", "binary_crossentropy", metrics=["accuracy"])
    history = model.fit(train_ds, epochs=2, validation_data=val_ds, verbose=0)
    sample = {name: values[:1] for name, values in columns.items()}
    for name, vocabulary in CATEGORICAL_FEATURES_WITH_VOCABULARY.items():
        sample[name] = (np.array(vocabulary) == sample[name][0]).astype("int64")[None]
    _keep(record, model, **_history(history))
    prediction = model.predict({name: tf.convert_to_tensor(v) for name, v in sample.items()}, verbose=0)
    _keep(record, model, prediction=prediction)


# --- training & evaluation with the built-in methods -----------------------


class CategoricalTruePositives(keras.metrics.Metric):
    def __init__(self, name="categorical_true_positives", **kwargs):
        super().__init__(name=name, **kwargs)
        self.true_positives = self.add_weight(name="ctp", initializer="zeros")

    def update_state(self, y_true, y_pred, sample_weight=None):
        y_pred = tf.reshape(tf.argmax(y_pred, axis=1), shape=(-1, 1))
        values = tf.cast(tf.cast(y_true, "int32") == tf.cast(y_pred, "int32"), "float32")
        if sample_weight is not None:
            values = tf.multiply(values, tf.cast(sample_weight, "float32"))
        self.true_positives.assign_add(tf.reduce_sum(values))

    def result(self):
        return self.true_positives

    def reset_state(self):
        self.true_positives.assign(0.0)


class CustomMSE(keras.losses.Loss):
    def __init__(self, regularization_factor=0.1, name="custom_mse"):
        super().__init__(name=name)
        self.regularization_factor = regularization_factor

    def call(self, y_true, y_pred):
        mse = tf.reduce_mean(tf.square(y_true - y_pred), axis=-1)
        reg = tf.reduce_mean(tf.square(0.5 - y_pred), axis=-1)
        return mse + reg * self.regularization_factor


def _uncompiled_model() -> keras.Model:
    inputs = keras.Input(shape=(784,), name="digits")
    x = layers.Dense(64, activation="relu", name="dense_1")(inputs)
    x = layers.Dense(64, activation="relu", name="dense_2")(x)
    outputs = layers.Dense(10, activation="softmax", name="predictions")(x)
    return keras.Model(inputs=inputs, outputs=outputs)


def training_and_evaluation(
    strategy: tf.distribute.Strategy, workdir: str, record: harness.Record
) -> None:
    del workdir
    (x_train, y_train), (x_test, y_test) = harness.load_mnist_like(768, 256)
    x_train, x_test = (x[..., 0].reshape(-1, 784) / 255.0 for x in (x_train, x_test))
    y_train, y_test = y_train.astype("float32"), y_test.astype("float32")
    x_val, y_val = x_train[-128:], y_train[-128:]
    x_train, y_train = x_train[:-128], y_train[:-128]
    with strategy.scope():
        model = _uncompiled_model()
        model.compile(
            optimizer=keras.optimizers.RMSprop(learning_rate=1e-3),
            loss=keras.losses.SparseCategoricalCrossentropy(),
            metrics=[keras.metrics.SparseCategoricalAccuracy()],
        )
    history = model.fit(x_train, y_train, batch_size=64, epochs=2,
                        validation_data=(x_val, y_val), verbose=0)
    results = model.evaluate(x_test, y_test, batch_size=128, verbose=0)
    predictions = model.predict(x_test[:3], verbose=0)
    _keep(record, model, **_history(history), evaluate=results, predictions=predictions)
    with strategy.scope():
        custom = _uncompiled_model()
        custom.compile(
            optimizer=keras.optimizers.RMSprop(
                learning_rate=keras.optimizers.schedules.ExponentialDecay(
                    1e-3, decay_steps=5, decay_rate=0.96, staircase=True
                )
            ),
            loss=CustomMSE(),
            metrics=[CategoricalTruePositives()],
        )
    custom_history = custom.fit(
        x_train, tf.one_hot(y_train.astype("int32"), depth=10).numpy(), batch_size=64, epochs=2,
        callbacks=[keras.callbacks.EarlyStopping(monitor="loss", min_delta=1e-2, patience=2)],
        verbose=0,
    )
    _keep(record, custom, **_history(custom_history, "custom_"))
    record.weights = [np.array(w) for w in model.get_weights() + custom.get_weights()]


#: Name -> port(strategy, workdir, record): the example under `strategy`,
#: filling `record` as it goes (so a failure keeps what came before it).
EXAMPLES = {
    "text_cnn": text_cnn,
    "weather_lstm": weather_lstm,
    "structured_data": structured_data,
    "training_and_evaluation": training_and_evaluation,
}


class OneProcessContenders:
    """Mixin for a `harness.ConformanceTestCase`: `EXAMPLE` under each of `CONTENDERS`.

    Each contender runs the example once, from the harness's seed, in
    `setUpClass` (`records` by contender): one device, tfdist's
    `MirroredStrategy` and `LayerPlacementStrategy` (M = 4) over 4 logical
    CPUs, and TF's `MirroredStrategy` where a subclass adds it. tfdist's
    strategies train one device's weights and log its values.
    """

    EXAMPLE: str
    CONTENDERS: tuple[str, ...] = ("one_device", "tfdist", "tfdist_layer_placement")

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        port = EXAMPLES[cls.EXAMPLE]
        cls.records = {}
        for contender in cls.CONTENDERS:
            workdir = tempfile.mkdtemp(prefix=f"{cls.EXAMPLE}_{contender}_")
            cls.addClassCleanup(shutil.rmtree, workdir, ignore_errors=True)
            keras.utils.set_random_seed(harness.SEED)
            cls.records[contender] = harness.keeps_partial_results(
                lambda c, w, record: port(harness.make_strategy(c), w, record)
            )(contender, workdir)

    def test_tfdist_matches_one_device(self):
        self.assert_same_results(self.records["tfdist"], self.records["one_device"])

    def test_tfdist_layer_placement_matches_one_device(self):
        self.assert_same_results(
            self.records["tfdist_layer_placement"], self.records["one_device"]
        )
