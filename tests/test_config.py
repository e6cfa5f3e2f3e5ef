"""The one config object: modes, replicas, data source, and clear errors for bad values."""

import pytest

from course_utils import config
from course_utils.config import ConfigError


def test_defaults_are_full_mode_real_data_one_replica():
    cfg = config.load({})
    assert (cfg.smoke, cfg.cpu_replicas, cfg.device, cfg.data) == (False, 1, "auto", "tfds")
    assert cfg.sizes == config.FULL_SIZES


def test_smoke_mode_is_small_and_offline_and_says_so():
    cfg = config.load({"COURSE_SMOKE": "1"})
    assert cfg.sizes == config.SMOKE_SIZES and cfg.data == "synthetic"
    assert "smoke mode uses offline data" in cfg.data_reason
    # every size that drives run time is smaller in smoke mode
    for field in (
        "per_replica_batch",
        "train_examples",
        "test_examples",
        "model_width",
        "matmul_size",
        "timing_repeats",
        "capstone_budget_s",
        "capstone_ablations",
    ):
        assert getattr(config.SMOKE_SIZES, field) < getattr(config.FULL_SIZES, field), field


def test_explicit_data_source_wins_in_both_modes():
    assert config.load({"COURSE_SMOKE": "1", "COURSE_DATA": "tfds"}).data == "tfds"
    cfg = config.load({"COURSE_DATA": "npz:/data/cifar10.npz"})
    assert cfg.data == "npz:/data/cifar10.npz" and cfg.data_reason == "set by COURSE_DATA"


@pytest.mark.parametrize(
    "env, message",
    [
        ({"COURSE_SMOKE": "maybe"}, "COURSE_SMOKE='maybe' is not a yes/no value"),
        ({"COURSE_CPU_REPLICAS": "four"}, "COURSE_CPU_REPLICAS='four' is not a whole number"),
        ({"COURSE_CPU_REPLICAS": "16"}, "COURSE_CPU_REPLICAS=16 is out of range: use 1 to 8"),
        ({"COURSE_DATA": "cifar"}, "COURSE_DATA='cifar' is not a data source"),
        ({"COURSE_DATA": "npz:"}, "is not a data source"),
        ({"COURSE_DEVICE": "npu"}, "COURSE_DEVICE='npu' is not one of auto, tpu, gpu, cpu"),
    ],
)
def test_bad_values_name_the_variable_and_the_fix(env, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        config.load(env)


def test_replicas_and_booleans_parse():
    assert config.load({"COURSE_CPU_REPLICAS": " 4 "}).cpu_replicas == 4
    assert config.load({"COURSE_SMOKE": "Yes"}).smoke is True
    assert config.load({"COURSE_SMOKE": "0"}).smoke is False


def test_jit_setting():
    from course_utils import config

    assert config.load({}).jit is False
    on = config.load({"COURSE_JIT": "1"})
    assert on.jit is True and "jit=on" in on.describe()  # the label lessons print is runtime.xla_label (a TPU: on)
    assert not hasattr(on, "xla_label")  # one definition: a config alone cannot know it runs on a TPU
    with pytest.raises(config.ConfigError, match="COURSE_JIT"):
        config.load({"COURSE_JIT": "maybe"})


def test_memory_batch_is_a_size():
    from course_utils import config

    assert config.load({"COURSE_SMOKE": "1"}).sizes.memory_batch <= config.load({}).sizes.memory_batch
