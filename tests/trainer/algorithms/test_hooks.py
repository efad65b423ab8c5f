"""The algorithm interface has one form per hook: the list forms (``client_updates``, ``next_phases``,
``eval_models``) are the only ones the round loop calls, so an algorithm that still defines a retired one-client twin
would have it silently ignored."""

from __future__ import annotations

import pytest

from edgemask.trainer.algorithms import ALGORITHMS, Algorithm

RETIRED = ("client_update", "next_phase", "eval_model", "eval_forward", "evaluates_batched")


@pytest.mark.parametrize("name", ALGORITHMS.names())
def test_no_algorithm_defines_a_retired_one_client_hook(name):
    cls = ALGORITHMS.get(name)
    stale = [h for h in RETIRED for klass in cls.__mro__ if h in vars(klass)]
    assert not stale, f"{name}: {stale} are no hooks any more (use the list forms)"


def test_the_base_class_hooks_are_few_and_list_shaped():
    hooks = ("setup", "round_clients", "local_task", "next_phases", "client_updates", "aggregate", "eval_models",
             "eval_masks", "client_state", "shared_state")
    assert all(callable(getattr(Algorithm, h)) for h in hooks)
    assert not any(hasattr(Algorithm, h) for h in RETIRED)
