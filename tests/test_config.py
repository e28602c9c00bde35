"""GRPOConfig: the framework API's defaults, documented fields, validation that names the field."""

import ast
import dataclasses
import inspect

import pytest

from grpo import config as config_module
from grpo.config import GRPOConfig


def test_framework_api_defaults():
    """The framework API's fields have their defaults, but for a fixed reference."""
    c = GRPOConfig()
    assert (c.group_size, c.batch_size, c.num_epochs_per_update) == (4, 64, 4)
    assert (c.clip_epsilon, c.kl_coeff, c.entropy_coeff) == (0.2, 0.04, 0.01)
    assert (c.max_grad_norm, c.normalize_advantages) == (1.0, True)
    assert c.ref_update_frequency == 0  # the framework API's 1 makes the KL term exactly 0 (see below)
    assert c.advantage_scale == "group"


def test_reinforce_refuses_reusing_a_rollout():
    """loss_type reinforce has no ratio: more than one epoch per rollout is rejected by name."""
    with pytest.raises(ValueError, match="num_epochs_per_update=2 with loss_type='reinforce'"):
        GRPOConfig(loss_type="reinforce", num_epochs_per_update=2)
    GRPOConfig(loss_type="reinforce", num_epochs_per_update=1)  # on-policy: accepted


def test_every_field_has_a_docstring():
    """Each dataclass field is followed by a string literal documenting it."""
    tree = ast.parse(inspect.getsource(config_module))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "GRPOConfig")
    documented = set()
    for stmt, after in zip(cls.body, cls.body[1:], strict=False):
        is_doc = isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
        if isinstance(stmt, ast.AnnAssign) and is_doc and isinstance(after.value.value, str):
            documented.add(stmt.target.id)
    assert documented == {f.name for f in dataclasses.fields(GRPOConfig)}


@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [
        ("group_size", 1, ">= 2"),
        ("batch_size", 0, ">= 1"),
        ("num_epochs_per_update", 2.5, ">= 1"),
        ("ref_update_frequency", -1, ">= 0"),
        ("clip_epsilon", -0.1, ">= 0"),
        ("kl_coeff", float("nan"), ">= 0"),
        ("max_grad_norm", 0.0, "> 0"),
        ("learning_rate", 0.0, "> 0"),
        ("loss_type", "ppo", "clipped"),
        ("aggregation", "mean", "token_mean"),
        ("kl_estimator", "k4", "k3"),
        ("advantage_baseline", "median", "leave_one_out"),
    ],
)
def test_bad_value_names_field_value_and_allowed(field, value, allowed):
    """A bad value raises ValueError naming the field, the value and what is allowed."""
    with pytest.raises(ValueError) as err:
        GRPOConfig(**{field: value})
    message = str(err.value)
    assert field in message and repr(value) in message and allowed in message


def test_normalize_false_means_no_scale_and_conflicts_are_caught():
    """normalize_advantages=False selects scale 'none'; an explicit other scale is an error."""
    assert GRPOConfig(normalize_advantages=False).advantage_scale == "none"
    with pytest.raises(ValueError, match="advantage_scale='batch' contradicts"):
        GRPOConfig(normalize_advantages=False, advantage_scale="batch")


def test_constant_length_needs_max_completion_length():
    """Dr. GRPO's aggregation is refused without its fixed denominator."""
    with pytest.raises(ValueError, match="max_completion_length"):
        GRPOConfig(aggregation="constant_length")
    assert GRPOConfig(aggregation="constant_length", max_completion_length=8).aggregation


def test_from_dict_round_trip_and_unknown_keys():
    """from_dict(to_dict()) is identity; an unknown key is named in the error."""
    c = GRPOConfig(group_size=8, loss_type="gspo", clip_epsilon_high=0.28)
    assert GRPOConfig.from_dict(c.to_dict()) == c
    with pytest.raises(ValueError, match="unknown key.*'kl_coef'.*allowed keys: .*kl_coeff"):
        GRPOConfig.from_dict({"kl_coef": 0.1})


def test_no_baseline_with_group_scale_is_refused_naming_both_keys():
    """baseline 'none' + scale 'group' divides equal rewards by eps: an error naming both keys;
    batch and no scaling stay allowed."""
    for fields in (
        {"advantage_baseline": "none"},
        {"advantage_baseline": "none", "advantage_scale": "group"},
    ):
        with pytest.raises(ValueError, match="advantage_baseline='none' with advantage_scale"):
            GRPOConfig(**fields)
    assert GRPOConfig(advantage_baseline="none", advantage_scale="batch").advantage_scale
    assert GRPOConfig(advantage_baseline="none", normalize_advantages=False).advantage_scale
