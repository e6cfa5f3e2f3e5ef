"""Exercise bank "tpu_initialization" (lesson 01: TPU initialization and distribution strategies)."""

from __future__ import annotations

import math
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from ...exercises import Exercise, ExerciseBank, Incorrect, call_learner, describe, error, require_callable, require_int

# ----------------------------------------------------------------------------------------------
# Bank "tpu_initialization" (lesson: TPU initialization and distribution strategies)
# ----------------------------------------------------------------------------------------------

NUM_CLASSES = 10  # CIFAR-10: the labels are the integers 0-9


def _check_replicas_on_v5e(answer: Any) -> str:
    n = require_int(answer, "an int (a number of replicas)")
    if n == 8:
        raise Incorrect(
            "8 is what the retired v2-8 runtime reported (4 chips × 2 TensorCores = 8 replicas); "
            "v5e-1 is one chip with one TensorCore, and TPUStrategy makes one replica per TensorCore."
        )
    if n != 1:
        raise Incorrect(
            f"{n} is not it: v5e-1 has a single chip with a single TensorCore, and TPUStrategy makes one "
            "replica per TensorCore. (If your current runtime reports a different number: "
            "the question is about v5e-1.)"
        )
    return (
        "v5e-1 is one chip with one TensorCore, so `strategy.num_replicas_in_sync == 1`. "
        "Code that reads it instead of assuming 8 runs unchanged on any TPU, GPU or CPU."
    )


class _FakeExtended:
    """``strategy.extended`` of the fake strategy: one worker device per replica, like a real strategy."""

    def __init__(self, n: int):
        self.worker_devices = tuple(f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(n))

    def __getattr__(self, item: str):
        raise AttributeError(
            f"the test strategy's `extended` only has `worker_devices` (you asked for `{item}`); "
            "`strategy.num_replicas_in_sync` is all the global batch size needs"
        )


class _FakeStrategy:
    """Stands in for a strategy with ``n`` replicas when checking ``global_batch_size``."""

    def __init__(self, n: int):
        self.num_replicas_in_sync = n
        self.extended = _FakeExtended(n)

    def __getattr__(self, item: str):
        raise AttributeError(
            f"the test strategy only has `num_replicas_in_sync` (you asked for `{item}`); "
            "the global batch size needs nothing else"
        )

    def __repr__(self) -> str:
        return f"<strategy with {self.num_replicas_in_sync} replicas>"


# (per-replica batch, replicas): the first case is the one quoted in messages.
_BATCH_CASES = ((64, 4), (128, 8), (64, 1), (128, 1), (128, 4), (64, 8))


def _check_global_batch_size(answer: Any) -> str:
    fn = require_callable(answer, "global_batch_size(per_replica_batch, strategy)", arity=2)
    got = {}
    for per, n in _BATCH_CASES:
        got[per, n] = call_learner(
            fn,
            per,
            _FakeStrategy(n),
            shown_as=f"global_batch_size({per}, <strategy with {n} replicas>)",
            on_error="Check that you read `strategy.num_replicas_in_sync` (an attribute, not a method call).",
        )
    import numbers

    def is_number(v):  # a plain number that arithmetic below cannot overflow on
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            return False
        if isinstance(v, numbers.Integral):
            return int(v).bit_length() <= 63
        return isinstance(v, float) and math.isfinite(v)

    def show(v):  # small ints and floats as themselves, anything else described (never repr: it may fail)
        if is_number(v) and isinstance(v, int):
            return int.__repr__(v)
        if is_number(v) and isinstance(v, float):
            return float.__repr__(v)
        return describe(v)

    wrong = [(per, n, v) for (per, n), v in got.items() if not (is_number(v) and v == per * n)]
    per0, n0, value0 = wrong[0] if wrong else (0, 0, None)
    quote = f"for {n0} replicas and per-replica batch {per0} you returned {show(value0)}, expected {per0 * n0}"

    values = got.values()
    if wrong and all(is_number(v) for v in values):
        if all(v == per for (per, n), v in got.items()):
            raise Incorrect(
                f"your function ignores the number of replicas: {quote}. Each replica gets its own "
                "per-replica batch, so multiply by the `strategy` argument's `num_replicas_in_sync`."
            )
        if all(v == per * 8 for (per, n), v in got.items()):
            raise Incorrect(
                f"your function assumes 8 replicas (the retired v2-8): {quote}. "
                "Use `strategy.num_replicas_in_sync`; on Colab's v5e-1 it is 1."
            )
        if all(v in (per // n, per / n) for (per, n), v in got.items()):
            raise Incorrect(
                f"you divided: {quote}. Each replica processes a full per-replica batch, "
                "so per-replica × replicas = global."
            )
        factors = {v / per for (per, n), v in got.items()}
        if len(factors) == 1:
            raise Incorrect(
                f"your function always multiplies by {factors.pop():g}: {quote}. Use the `strategy` "
                "argument's `num_replicas_in_sync`, not a fixed number or the notebook's own `strategy`."
            )
    for (per, n), value in got.items():
        if require_int(value, "an int (the global batch size)") != per * n:
            raise Incorrect(
                f"for {n} replicas and per-replica batch {per} you returned {show(value)}, "
                f"expected {per * n}. Global batch = per-replica batch × `strategy.num_replicas_in_sync`."
            )
    return (
        "global batch = per-replica batch × `strategy.num_replicas_in_sync`. "
        "This global size is what you pass to `dataset.batch()` before `experimental_distribute_dataset`."
    )


def _check_build_in_scope(answer: Any, strategy: Any) -> str:
    if not (hasattr(strategy, "scope") and hasattr(strategy, "extended")):
        raise error(
            f"`strategy=` must be the tf.distribute strategy from the setup cell, got {describe(strategy)}. "
            "Call it as `ex.build_in_scope.check(make_model, strategy=strategy)`."
        )

    if isinstance(answer, keras.Model):
        raise Incorrect(
            "you passed a model, not the function: pass `make_model` itself, "
            "check calls `make_model(strategy)` so it can see where the model is built."
        )
    fn = require_callable(answer, "make_model(strategy)", arity=1)
    if not tf.distribute.has_strategy() and strategy is tf.distribute.get_strategy():
        # The default strategy owns every variable, so "built outside the scope" could not be seen with it:
        # check with a real one-device strategy instead (the learner's code must use the one it is given).
        strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    model = call_learner(
        fn,
        strategy,
        shown_as="make_model(strategy)",
        on_error="Check the model definition and that `compile()` gets an optimizer and a loss.",
    )
    if not isinstance(model, keras.Model):
        raise Incorrect(
            f"Expected `make_model` to return a keras.Model, got {describe(model)}; `return model` at the end."
        )
    weights = list(model.weights)
    if not weights:
        raise Incorrect(
            "your model has no weights yet, so nothing was created in the scope; give it an input shape "
            "(start with `keras.Input(shape=(32, 32, 3))`) so its weights are created inside "
            "`strategy.scope()`."
        )
    optimizer = getattr(model, "optimizer", None)  # Keras 3: no attribute at all before compile()
    if optimizer is None:
        raise Incorrect(
            "the model is not compiled: call `model.compile(optimizer='adam', loss=...)` "
            "inside the `with strategy.scope():` block, before returning the model."
        )
    if getattr(model, "loss", None) is None:
        raise Incorrect(
            "the model was compiled without a loss, so `fit` cannot train it: pass one to `compile()`, e.g. "
            "`loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)`."
        )
    _check_shapes(model)
    _check_loss(model)
    outside = [w for w in weights if not strategy.extended.variable_created_in_scope(getattr(w, "value", w))]
    if outside:
        raise Incorrect(
            f"the model was built outside `strategy.scope()`: {len(outside)} of {len(weights)} weights "
            f"(e.g. `{outside[0].path}`) do not belong to this strategy: with one replica the model silently "
            "ignores the strategy, with several `fit` fails. Create the model inside `with strategy.scope():`, "
            "using the `strategy` passed to `make_model`."
        )
    if not _optimizer_in_scope(optimizer, strategy):
        raise Incorrect(
            "the optimizer was created outside the scope (an optimizer object made before the `with` block, "
            "or `compile()` called after it); once it creates its state (Adam's moments, momentum) `fit` fails "
            "with 'Mixing different tf.distribute.Strategy objects'. Create it inside the scope, or pass a "
            "string like `optimizer='adam'` to `compile()` "
            "inside the scope."
        )
    return (
        "every weight and the optimizer were created inside `strategy.scope()`, "
        "so `fit` can mirror the variables and update them on every replica."
    )


def _check_shapes(model: Any) -> None:
    """The model must take 32×32×3 images and give one output per class (at least two)."""
    try:
        inputs = list(model.inputs)  # Sequential/functional models; a subclassed model has no `inputs`
        input_shape = tuple(inputs[0].shape) if len(inputs) == 1 else None
    except Exception:  # noqa: BLE001
        input_shape = None
    fits = (
        input_shape is not None
        and len(input_shape) == 4
        and all(d is None or d == want for d, want in zip(input_shape[1:], (32, 32, 3)))
    )  # `keras.Input(shape=(None, None, 3))` takes 32×32×3 images too
    if input_shape is not None and not fits:
        raise Incorrect(
            f"your model takes inputs of shape {_shape_text(input_shape[1:])}, but the course's images are "
            "32×32×3: start the model with `keras.Input(shape=(32, 32, 3))`."
        )
    try:  # symbolic: no computation, nothing placed on a device
        output = model.compute_output_spec(keras.KerasTensor((2, 32, 32, 3)))
        output_shape = tuple(output.shape)
    except Exception:  # noqa: BLE001 - cannot tell symbolically: fit would tell them
        if input_shape is None:
            return
        raise Incorrect(
            "your model cannot take a batch of 32×32×3 images; start it with `keras.Input(shape=(32, 32, 3))` "
            "and check its layers."
        ) from None
    units = output_shape[-1] if len(output_shape) == 2 else None
    if units != NUM_CLASSES:
        raise Incorrect(
            f"your model's output has shape {_shape_text(output_shape)} for a batch of 2 images; a classifier "
            f"needs one output per class for each image ({NUM_CLASSES} for CIFAR-10, labels 0–{NUM_CLASSES - 1}): "
            f"end it with `keras.layers.Dense({NUM_CLASSES})`."
        )


def _check_loss(model: Any) -> None:
    """The compiled loss must take the course's labels — one integer class per image, shape (N,) — against 10
    outputs, as ``fit`` calls it (``model.compute_loss``), and be lower when the largest output is the right class:
    ``categorical_crossentropy`` wants one-hot labels and ``mse`` a number per output, so both raise on the first
    batch; a loss that runs but cannot tell the right class from a wrong one cannot train a classifier."""
    labels = np.array([3, 7, 9])
    right = 10.0 * np.eye(NUM_CLASSES, dtype="float32")[labels]
    wrong = 10.0 * np.eye(NUM_CLASSES, dtype="float32")[[7, 3, 0]]
    try:
        on_right, on_wrong = (
            float(keras.ops.convert_to_numpy(model.compute_loss(y=labels, y_pred=out))) for out in (right, wrong)
        )
    except Exception as e:  # noqa: BLE001 - what fit would raise on the first batch
        raise Incorrect(
            f"your loss cannot take the course's labels (one integer class per image, e.g. [3, 7, 9]) with "
            f"{NUM_CLASSES} outputs per image: {type(e).__name__}: {_first_line(e)}. Integer labels need "
            "`keras.losses.SparseCategoricalCrossentropy(from_logits=True)` (`categorical_crossentropy` wants "
            "one-hot labels, `mse` one number per output)."
        ) from None
    if not on_right < on_wrong:
        raise Incorrect(
            f"your loss is not lower when the right class gets the largest output ({on_right:.3g} for the right "
            f"class vs {on_wrong:.3g} for a wrong one), so training cannot learn the classes. Use "
            "`keras.losses.SparseCategoricalCrossentropy(from_logits=True)`."
        )


def _first_line(e: BaseException) -> str:
    try:
        text = str(e).strip().splitlines()
    except Exception:  # noqa: BLE001 - an exception whose __str__ fails
        return "(no message)"
    return (text[0][:160] if text else "") or "(no message)"


def _shape_text(shape: Any) -> str:
    return "(" + ", ".join("None" if d is None else str(int(d)) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def _optimizer_in_scope(optimizer: Any, strategy: Any) -> bool:
    """Whether the optimizer (and a wrapped inner one, e.g. LossScaleOptimizer) belongs to ``strategy``.

    Keras 3's TensorFlow optimizer records ``tf.distribute.get_strategy()`` at construction in
    ``_distribution_strategy`` (keras/src/backend/tensorflow/optimizer.py); ``fit`` later raises
    "Mixing different tf.distribute.Strategy objects" if that is not the model's strategy. If a
    future Keras renames it, fall back to where its step counter variable was created.
    """
    for opt in (optimizer, getattr(optimizer, "inner_optimizer", None)):
        if opt is None:
            continue
        owner = getattr(opt, "_distribution_strategy", None)
        if owner is not None:
            if owner is not strategy:
                return False
        elif getattr(opt, "iterations", None) is not None:
            step = getattr(opt.iterations, "value", opt.iterations)
            if not strategy.extended.variable_created_in_scope(step):
                return False
    return True


# References and typical wrong answers (tests use them; notebooks never see them).


EXERCISES = ExerciseBank(
    "tpu_initialization",
    [
        Exercise(
            name="replicas_on_v5e",
            question=(
                "How many replicas does `strategy.num_replicas_in_sync` report on Colab's free TPU runtime (v5e-1)?"
            ),
            checker=_check_replicas_on_v5e,
            answer_name="answer",
            hints=(
                "TPUStrategy makes one replica per TensorCore. How many chips does a v5e-1 have?",
                "The old v2-8 had 4 chips × 2 TensorCores = 8 replicas. A v5e chip has one TensorCore.",
            ),
            solution_code=("answer = 1  # v5e-1: 1 chip × 1 TensorCore = 1 replica (the retired v2-8 had 8)\n"),
            stub="answer = ...  # an int\n",
        ),
        Exercise(
            name="global_batch_size",
            question=("Write `global_batch_size(per_replica_batch, strategy)`: examples per step across all replicas."),
            checker=_check_global_batch_size,
            answer_name="global_batch_size",
            hints=(
                "Every replica processes its own per-replica batch in each step. "
                "How many replicas are there? Ask the strategy.",
                "`strategy.num_replicas_in_sync` is a plain int; the answer is one multiplication.",
            ),
            solution_code='''\
def global_batch_size(per_replica_batch, strategy):
    """Examples one training step consumes across all replicas."""
    return per_replica_batch * strategy.num_replicas_in_sync
''',
            stub='''\
def global_batch_size(per_replica_batch, strategy):
    """Return how many examples one training step consumes across all replicas."""
    ...  # your code here
''',
        ),
        Exercise(
            name="build_in_scope",
            question=(
                "Write `make_model(strategy)`: build AND compile a small classifier for 32×32×3 images and "
                "10 classes (integer labels 0–9) inside `strategy.scope()`."
            ),
            checker=_check_build_in_scope,
            answer_name="make_model",
            needs=("strategy",),
            hints=(
                "Everything that creates variables must run inside `with strategy.scope():` — "
                "the layers (via `keras.Input`, which builds them) and the optimizer.",
                "Inside the `with` block: `keras.Sequential([keras.Input(shape=(32, 32, 3)), ...])`, then "
                "`model.compile(optimizer='adam', loss=...)`; return the model after the block.",
            ),
            solution_code="""\
import keras

def make_model(strategy):
    with strategy.scope():  # weights AND optimizer must be created in here
        model = keras.Sequential([
            keras.Input(shape=(32, 32, 3)),  # an input shape builds the weights now, in the scope
            keras.layers.Flatten(),
            keras.layers.Dense(10),
        ])
        model.compile(
            optimizer="adam",  # a string: the optimizer is created inside the scope
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    return model
""",
            stub='''\
def make_model(strategy):
    """Build AND compile a small classifier for 32x32x3 images and 10 classes (integer labels 0-9) so it can train
    under `strategy`."""
    ...  # your code here: build the model, compile it, return it
''',
        ),
    ],
)
