"""A plan policy carried to another target's plans (``looprl-train --adapt`` to another ISA).

A plan action names one of its target's register tiles (:mod:`looprl.ir.plans`): AVX-512's
``plan_14x2`` (14 rows of two 16-lane vectors) has no place among AVX2's 16 registers, where
it compiles but spills. :func:`retargeted` gives a policy the plans of another target: its
network is the same, except that the greedy head's output for each new plan is a copy of its
output for the old plan that makes the same decision (:func:`~looprl.ir.plans.counterpart`:
the tile with as many vectors per row, so ``plan_14x2`` becomes ``plan_6x2``), and its other
actions keep theirs. Nothing is measured or trained: it is the starting point that
adaptation's measurements then correct, and its metadata says what it was mapped from.
"""

from __future__ import annotations

import numpy as np

from looprl.ir.plans import Plan, counterpart, plan_catalogue
from looprl.policy.numpy_policy import Dense, Policy
from looprl.target import Target


def needs_retargeting(policy: Policy, target: Target) -> bool:
    """Whether ``policy`` has plans that are not all in ``target``'s catalogue (a policy
    trained on a chosen few of its own target's plans keeps them)."""
    plans = set(policy.metadata.get("plans") or ())
    return bool(plans) and not plans <= {p.name for p in plan_catalogue(target)}


def _has_counterpart(plan: Plan, plans) -> bool:
    try:
        counterpart(plan, plans)
    except ValueError:
        return False
    return True


def retargeted(policy: Policy, target: Target) -> Policy:
    """``policy`` with ``target``'s plan catalogue in place of its own plans (module
    docstring), less the kinds of plan it has none of (a policy trained before the dot-product
    plans gets none); ``policy`` itself when it has no plans or already has those."""
    target = Target.required(target, "retargeted")
    if not needs_retargeting(policy, target):
        return policy
    old_names = policy.action_names
    old_plans = tuple(Plan.parse(name) for name in policy.metadata["plans"])
    new_plans = tuple(plan for plan in plan_catalogue(target) if _has_counterpart(plan, old_plans))  # kinds it never had: not given
    kept = list(old_names[: len(old_names) - len(old_plans)])  # the plan actions end action_names (check_metadata)
    mapping = {plan.name: counterpart(plan, old_plans).name for plan in new_plans}
    rows = list(range(len(kept))) + [old_names.index(mapping[plan.name]) for plan in new_plans]
    greedy = policy.metadata["network"]["greedy"]
    heads = dict(policy.heads)
    for name, layers in policy.heads.items():
        last = layers[-1]
        if last.weight.shape[0] != len(old_names):
            if name == greedy:
                raise ValueError(f"the greedy head has {last.weight.shape[0]} outputs for {len(old_names)} actions")
            continue  # a value head: one output, whatever the actions
        heads[name] = layers[:-1] + (Dense(np.ascontiguousarray(last.weight[rows]), np.ascontiguousarray(last.bias[rows]), last.activation),)
    source = policy.target
    metadata = dict(policy.metadata, action_names=kept + [plan.name for plan in new_plans], plans=[plan.name for plan in new_plans],
                    target=target.to_dict(), retargeted={
                        "from_target": source.isa if source is not None else None,
                        "plans": mapping,
                        "how": "each plan's greedy-head output copied from the plan with as many vectors per row; no measurement",
                    })
    return Policy(metadata, policy.trunk, heads)
