"""Exercise bank "scaling_out" (lesson 08: multi-worker training, parameter servers, model parallelism, TPU pods)."""

from __future__ import annotations

import json
import math
from typing import Any

from ...exercises import (
    Exercise,
    Incorrect,
    call_learner,
    describe,
    ExerciseBank,
    require_callable,
    require_int,
    require_number,
)

# -- 1. tf_config_for -------------------------------------------------------------------------

_CONFIG_CASES = (
    (["10.0.0.1:12345", "10.0.0.2:12345"], 1),
    (["10.0.0.1:12345", "10.0.0.2:12345"], 0),
    (["localhost:2222", "localhost:2223", "localhost:2224", "localhost:2225"], 3),
    (["localhost:2222", "localhost:2223", "localhost:2224", "localhost:2225"], 2),  # neither first nor last
    (["host-a:5000"], 0),
)


# keys TensorFlow's TFConfigClusterResolver also reads; an answer may carry them, with a value TensorFlow accepts
_OPTIONAL_KEYS = ("rpc_layer", "environment", "session_master")
_OPTIONAL_VALUES = {"rpc_layer": ("grpc",), "environment": ("cloud", "google")}


def _expected_config(addresses, index):
    return {"cluster": {"worker": list(addresses)}, "task": {"type": "worker", "index": index}}


def _as_config(value: Any, shown: str) -> dict:
    """The learner's TF_CONFIG as a dict: a dict, or the JSON text TensorFlow actually reads."""
    if isinstance(value, (str, bytes)):
        try:
            value = json.loads(str.__str__(value) if isinstance(value, str) else bytes(value))
        except Exception:  # noqa: BLE001 - not JSON, or a str/bytes subclass whose methods misbehave
            raise Incorrect(
                f"{shown} returned text that is not JSON ({describe(value)}); TF_CONFIG is a JSON "
                "string: `json.dumps({...})`."
            ) from None
    if not isinstance(value, dict):
        raise Incorrect(
            f"{shown} returned {describe(value)}; return a dict (or its json.dumps) with the keys 'cluster' and 'task'."
        )
    try:  # what TensorFlow reads is JSON: plain dicts, lists, text and numbers, nothing else
        return json.loads(json.dumps(value))
    except Exception:  # noqa: BLE001 - any object json cannot write, however it fails
        raise Incorrect(
            f"{shown} returned {describe(value)}, which json.dumps cannot write; TF_CONFIG holds only "
            "dicts, lists, text and numbers."
        ) from None


def _check_tf_config(answer: Any) -> str:
    fn = require_callable(answer, "tf_config_for(addresses, index)", arity=2)
    for addresses, index in _CONFIG_CASES:
        shown = f"tf_config_for({addresses}, {index})"
        got = _as_config(call_learner(fn, list(addresses), index, shown_as=shown), shown)
        expected = _expected_config(addresses, index)
        if not {"cluster", "task"} <= set(got) or not set(got) <= {"cluster", "task", *_OPTIONAL_KEYS}:
            raise Incorrect(
                f"{shown} has the keys {sorted(map(str, got))[:5]}; TF_CONFIG needs 'cluster' (every "
                "task's address, by job) and 'task' (which one this process is); other keys it may "
                f"hold: {', '.join(_OPTIONAL_KEYS)}."
            )
        for key in _OPTIONAL_KEYS:
            if key in got and (key not in _OPTIONAL_VALUES or got[key] not in _OPTIONAL_VALUES[key]):
                raise Incorrect(
                    f"{shown} sets {key!r} to {describe(got[key])}; leave it out (the exercise asks for "
                    "'cluster' and 'task'): a wrong value changes how TensorFlow connects."
                )
        cluster, task = got["cluster"], got["task"]
        if cluster == list(addresses) or cluster == {"workers": list(addresses)}:
            raise Incorrect(
                f"{shown}: 'cluster' maps each job name to its addresses; the job is called 'worker' "
                "(singular): {'worker': [...]}."
            )
        if not isinstance(cluster, dict) or cluster != expected["cluster"]:
            raise Incorrect(
                f"{shown}: 'cluster' is {describe(cluster)}; it must list every worker, in order, the same "
                "in every process: {'worker': addresses}."
            )
        if not isinstance(task, dict) or set(task) != {"type", "index"}:
            raise Incorrect(
                f"{shown}: 'task' is {describe(task)}; it says which task this process is: "
                "{'type': ..., 'index': ...}."
            )
        if task.get("type") != "worker":
            raise Incorrect(
                f"{shown}: the task type is {describe(task.get('type'))}; these processes are all 'worker' tasks."
            )
        if isinstance(task["index"], bool) or not isinstance(task["index"], int):
            kind = "not text" if isinstance(task["index"], str) else "an int"
            raise Incorrect(
                f"{shown}: the task index is {describe(task['index'])}; it is a whole number ({index}), {kind}."
            )
        if task["index"] != index:
            raise Incorrect(
                f"{shown}: the task index is {task['index']}, expected {index}: the position of this "
                "process's own address in the list."
            )
    return (
        "Every process gets the same 'cluster' and its own 'task'. The launcher of this lesson writes exactly "
        "this (course_utils.cluster.tf_config); on Cloud TPU VMs and Kubernetes the platform sets it."
    )


# -- 2. global_batch_and_lr -------------------------------------------------------------------

# (per-core batch, cores, base LR, base batch)
# The last case's ratio (384 / 256 = 1.5) is not a power of two and its LR (0.0184500…) has more than two decimals:
# an answer that rounds, or scales by powers of two, fails there
_LR_CASES = (
    (128, 8, 0.1, 256),
    (128, 1, 0.1, 256),
    (64, 32, 0.2, 512),
    (32, 256, 0.05, 128),
    (256, 4, 0.4, 1024),
    (48, 8, 0.0123, 256),
)


def _namedtuple_fields(value: Any) -> tuple[str, ...] | None:
    """The field names of a namedtuple (``collections.namedtuple``, ``typing.NamedTuple``), None for anything else."""
    if not isinstance(value, tuple):
        return None
    try:
        fields = next((k.__dict__["_fields"] for k in type(value).__mro__ if "_fields" in k.__dict__), None)
    except Exception:  # noqa: BLE001 - a learner's class whose attributes cannot be read
        return None
    if type(fields) is not tuple or not all(type(f) is str for f in fields):
        return None
    return fields


_BATCH_NAMES = ("global_batch", "global_batch_size", "batch", "batch_size")
_LR_NAMES = ("lr", "learning_rate", "scaled_lr", "scaled_learning_rate")


def _pair(value: Any) -> tuple | None:
    """``(global_batch, lr)`` from a plain tuple or list of two, or a namedtuple of two (read by its field names when
    they say which is which, else in order); None for anything else, other tuple and list subclasses included. A
    namedtuple is read with tuple's own ``len``/``[]``: a learner's class that overrides them cannot make reading fail."""
    if type(value) in (tuple, list):
        return tuple(value) if len(value) == 2 else None
    fields = _namedtuple_fields(value)
    if fields is None or tuple.__len__(value) != 2 or len(fields) != 2:
        return None
    items = (tuple.__getitem__(value, 0), tuple.__getitem__(value, 1))
    names = [name.lower() for name in fields]
    if names[0] in _LR_NAMES and names[1] in _BATCH_NAMES:
        return items[1], items[0]
    return items


def _check_global_batch_and_lr(answer: Any) -> str:
    fn = require_callable(answer, "global_batch_and_lr(per_core_batch, cores, base_lr, base_batch)", arity=4)
    for per_core, cores, base_lr, base_batch in _LR_CASES:
        shown = f"global_batch_and_lr({per_core}, {cores}, {base_lr}, {base_batch})"
        got = call_learner(fn, per_core, cores, base_lr, base_batch, shown_as=shown)
        pair = _pair(got)
        if pair is None:
            raise Incorrect(f"{shown} returned {describe(got)}; return two numbers: (global_batch, lr).")
        batch = require_int(pair[0], "the global batch")
        lr = require_number(pair[1], "the learning rate")
        expected_batch = per_core * cores
        expected_lr = base_lr * expected_batch / base_batch
        if batch != expected_batch:
            if batch == per_core:
                raise Incorrect(
                    f"{shown} returned a global batch of {batch:g}: that is one core's share. Every core "
                    "takes its own per-core batch each step."
                )
            raise Incorrect(
                f"{shown} returned a global batch of {batch:g}, expected {expected_batch}: per-core batch × cores."
            )
        if math.isclose(lr, expected_lr, rel_tol=1e-6):
            continue
        if math.isclose(lr, base_lr * math.sqrt(expected_batch / base_batch), rel_tol=1e-6):
            raise Incorrect(
                f"{shown} returned lr {lr:g}: that is square-root scaling. The rule taught here (Goyal et "
                "al. 2017, for SGD) is linear: the LR grows in proportion to the global batch."
            )
        if math.isclose(lr, base_lr, rel_tol=1e-6):
            raise Incorrect(
                f"{shown} returned lr {lr:g}, the base LR unchanged, expected {expected_lr:g}: scale it by "
                "global_batch / base_batch — down, too, when the global batch is the smaller one."
            )
        if math.isclose(lr, base_lr * cores, rel_tol=1e-6):
            raise Incorrect(
                f"{shown} returned lr {lr:g}: scale by the global batch relative to the batch the base "
                "LR was tuned for (base_batch), not by the number of cores."
            )
        raise Incorrect(f"{shown} returned lr {lr:g}, expected {expected_lr:g}: base_lr × global_batch / base_batch.")
    return (
        "Linear scaling keeps the distance travelled per epoch: twice the batch, half the steps, twice the step. "
        "It needs a warm-up at large batches, and beyond some batch it stops holding (8k for ResNet-50 on "
        "ImageNet in Goyal et al.; much less on a dataset as small as CIFAR-10)."
    )


# -- 3. pipeline_idle_fraction ----------------------------------------------------------------

_BUBBLE_CASES = ((2, 1), (2, 4), (4, 4), (4, 16), (8, 32), (1, 8), (4, 2))  # (4, 2): fewer micro-batches than stages


def _check_pipeline_idle_fraction(answer: Any) -> str:
    fn = require_callable(answer, "pipeline_idle_fraction(stages, micro_batches)", arity=2)
    for stages, micro in _BUBBLE_CASES:
        shown = f"pipeline_idle_fraction({stages}, {micro})"
        value = require_number(call_learner(fn, stages, micro, shown_as=shown), "a fraction between 0 and 1")
        expected = (stages - 1) / (micro + stages - 1)
        if math.isclose(value, expected, rel_tol=1e-6, abs_tol=1e-12):
            continue
        quote = f"{shown} returned {value:g}, expected {expected:.4g}"
        if stages > 1 and math.isclose(value, 1 - expected, rel_tol=1e-6):
            raise Incorrect(f"{quote}: that is the busy fraction; the question asks for the idle one.")
        if stages > 1 and math.isclose(value, (stages - 1) / micro, rel_tol=1e-6):
            raise Incorrect(
                f"{quote}: count the slots of the whole schedule, micro_batches + stages − 1, not only "
                "the micro-batches."
            )
        if stages > 1 and math.isclose(value, (stages - 1) / stages, rel_tol=1e-6):
            raise Incorrect(
                f"{quote}: that is the naive split (one micro-batch); more micro-batches fill the pipeline."
            )
        raise Incorrect(
            f"Not quite: {quote}. Draw the schedule: each device works micro_batches slots out of "
            "micro_batches + stages − 1."
        )
    return (
        "(S − 1) / (M + S − 1): the bubble shrinks as micro-batches grow, which is why GPipe uses M ≥ 4·S — and "
        "why it costs activation memory for all M micro-batches in flight (lesson 07's recomputation helps)."
    )


EXERCISES = ExerciseBank(
    "scaling_out",
    [
        Exercise(
            name="tf_config_for",
            question=(
                "Write `tf_config_for(addresses, index)`: the TF_CONFIG (a dict or its JSON text) of worker "
                "`index` in a cluster of workers at `addresses`."
            ),
            checker=_check_tf_config,
            answer_name="tf_config_for",
            hints=(
                "The first cell after the setup cell prints a TF_CONFIG: look at its shape.",
                "Two keys: 'cluster' maps the job name 'worker' to the list of addresses; 'task' holds the type "
                "'worker' and this process's position in that list.",
            ),
            solution_code='''\
def tf_config_for(addresses, index):
    """TF_CONFIG of worker `index` in a cluster of workers at `addresses`."""
    return {"cluster": {"worker": list(addresses)}, "task": {"type": "worker", "index": index}}
''',
            stub='''\
def tf_config_for(addresses, index):
    """TF_CONFIG of worker `index` in a cluster of workers at `addresses`."""
    ...  # your code here
''',
        ),
        Exercise(
            name="global_batch_and_lr",
            question=(
                "Write `global_batch_and_lr(per_core_batch, cores, base_lr, base_batch)`: the global batch of "
                "one step on `cores` cores, and the learning rate by the linear scaling rule, given that "
                "`base_lr` was tuned at `base_batch`."
            ),
            checker=_check_global_batch_and_lr,
            answer_name="global_batch_and_lr",
            hints=(
                "Each core takes its own per-core batch every step: how many examples does one step see?",
                "The rule scales the LR by how many times larger the global batch is than the batch it was tuned at.",
            ),
            solution_code='''\
def global_batch_and_lr(per_core_batch, cores, base_lr, base_batch):
    """Global batch of one step, and the linearly scaled learning rate."""
    global_batch = per_core_batch * cores
    return global_batch, base_lr * global_batch / base_batch
''',
            stub='''\
def global_batch_and_lr(per_core_batch, cores, base_lr, base_batch):
    """Global batch of one step, and the linearly scaled learning rate."""
    ...  # your code here
''',
        ),
        Exercise(
            name="pipeline_idle_fraction",
            question=(
                "Write `pipeline_idle_fraction(stages, micro_batches)`: the share of a GPipe schedule each "
                "device spends idle (equal stages, free transfers)."
            ),
            checker=_check_pipeline_idle_fraction,
            answer_name="pipeline_idle_fraction",
            hints=(
                "Draw S devices against time: micro-batch m reaches stage s at slot m + s. How many slots does "
                "the whole schedule take?",
                "Each device is busy for micro_batches of those slots; the rest of the schedule it waits.",
            ),
            solution_code='''\
def pipeline_idle_fraction(stages, micro_batches):
    """Share of a GPipe schedule each device spends idle."""
    return (stages - 1) / (micro_batches + stages - 1)
''',
            stub='''\
def pipeline_idle_fraction(stages, micro_batches):
    """Share of a GPipe schedule each device spends idle."""
    ...  # your code here
''',
        ),
    ],
)
