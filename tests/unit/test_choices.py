"""The one check for closed sets of values: the key, the bad value, the choices, a near miss."""

from __future__ import annotations

import pytest

from brats_seg.choices import check_choice, format_choices


@pytest.mark.parametrize(
    "value,allowed,key,message",
    [
        (
            "cosin",
            ("cosine", "constant"),
            "trainer.lr_schedule",
            "trainer.lr_schedule='cosin': use cosine or constant. Did you mean 'cosine'?",
        ),
        (
            "layer",
            ("instance", "group", "batch"),
            "model.norm",
            "model.norm='layer': use one of instance, group, batch.",
        ),
        (
            "bf61",
            ("fp32", "fp16", "bf16"),
            "backend.precision",
            "backend.precision='bf61': use one of fp32, fp16, bf16. Did you mean 'bf16'?",
        ),
        (3, (1, 4), "model.in_channels", "model.in_channels=3: use 1 or 4."),
    ],
)
def test_a_bad_value_names_the_key_the_value_and_the_choices(value, allowed, key, message):
    with pytest.raises(ValueError) as err:
        check_choice(value, allowed, key)
    assert str(err.value) == message


def test_a_good_value_is_returned_and_the_error_type_and_hint_are_the_callers():
    class BackendError(RuntimeError):
        pass

    assert check_choice("gpu", ("auto", "gpu"), "backend") == "gpu"
    with pytest.raises(BackendError, match=r"^backend='cuda': use auto or gpu\. Only these here\.$"):
        check_choice("cuda", ("auto", "gpu"), "backend", error=BackendError, hint="Only these here.")
    assert format_choices(["a"]) == "one of a"


def test_config_errors_reach_the_user_through_it():
    """The sites that check a choice use it (one shape of message everywhere)."""
    from brats_seg.config import DistributeConfig, check_distribute_config
    from brats_seg.model.checks import check_policy

    with pytest.raises(
        ValueError, match=r"^distribute\.lr_scaling='lin': use none or linear\. Did you mean 'linear'\?$"
    ):
        check_distribute_config(DistributeConfig(lr_scaling="lin"))
    with pytest.raises(ValueError, match=r"dtype policy='float64': use one of float32, mixed_float16, mixed_bfloat16"):
        check_policy("float64")
