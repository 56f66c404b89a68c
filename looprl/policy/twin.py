"""Tuning a problem whose constant right operand is stored across the output's columns.

A weight stored ``[out, in]`` (``torch.nn.Linear``'s W in ``mk,nk->mn``) puts the output's
columns (n) across B's rows: every schedule that does not re-lay B out reads it lane by lane
(gathers), tens of times slower than the same schedule of ``mk,kn->mn``, and a tuner that
measures the states on its way (the policy's rollout, the search) spends its budget on them.
But a constant input is converted to its layout once, when the kernel is bound to it, and
never inside the timed call. So such a problem is tuned as its *twin*: the same problem with
B's index letters reordered so that the output's last dimension comes last (``mk,kn->mn``,
what the policies were trained on), and the twin's schedule is carried back with B stored in
the twin's physical layout (for a row-major twin, B transposed: layout ``k1.n1``; a packed
twin's panels ``n48.k1.n1%48`` are the same text for both). The loops are the same (both specs
list the dimensions in the same order), so is the code, and so is the speed.

A right operand that changes from call to call (attention's keys in ``bmk,bnk->bmn``) can be
tuned through the twin too, but then the carried-back kernel converts it on every call, inside
the timed kernel: ``tune`` measures that schedule, conversion included, against the policy's
own schedule of the problem as given and keeps the faster (:func:`looprl.policy.tuner.tune`).
"""

from __future__ import annotations

from looprl.ir.layout import Layout
from looprl.ir.nest import LAYOUT_TENSORS, LoopNest
from looprl.ir.problem import Problem


def transposed_twin(problem: Problem, constant_only: bool = True) -> Problem | None:
    """The twin of ``problem`` (see the module docstring), or None: the right operand must be
    constant (unless ``constant_only`` is False: then a right operand that changes per call
    qualifies too, re-laid inside every call of the carried-back kernel), hold the output's
    last dimension but not last, and the twin must list the dimensions in the same order."""
    if constant_only and "in1" not in problem.constant:
        return None
    left, right = problem.operands
    column = problem.output[-1]
    if column not in right or right[-1] == column:
        return None
    spec = f"{left},{right.replace(column, '')}{column}->{problem.output}"
    twin = Problem(spec, problem.sizes, problem.constant, problem.epilogue)
    return twin if twin.dims == problem.dims else None


def carried_back(nest: LoopNest, problem: Problem) -> LoopNest:
    """The schedule ``nest`` of a twin, as a schedule of ``problem``: the same loops, and each
    tensor stored in the same physical layout (B's given by the twin's layout key)."""
    loops = "|".join(nest.key.split("|")[:2])
    result = LoopNest.from_key(problem, loops)
    for tensor in LAYOUT_TENSORS:
        index = result.tensor_index(tensor)
        layout = Layout.from_key(index, problem.shape(index), nest.layout(tensor).key)
        result = result.with_layout(tensor, layout)
    return result
