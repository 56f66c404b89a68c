"""Behaviour cloning: a DQN-shaped policy fitted to demonstrations' (observation, action) pairs,
and DQfD's large-margin loss that keeps demonstrated actions in front."""

from __future__ import annotations

import math

import numpy as np

from looprl.policy.numpy_policy import Policy
from looprl.train.config import agent_actions, hidden_layers
from looprl.train.export import policy_metadata
from looprl.train.schema import section_settings


def clone(observations: np.ndarray, labels: np.ndarray, hidden: list[int], action_count: int, *, epochs: int = 200,
          lr: float = 1e-3, seed: int = 0, margin: float = 0.05) -> dict[str, np.ndarray]:
    """Fit an MLP (``hidden`` ReLU layers, then an advantage head of ``action_count`` and a
    value head of 1, as DQN's dueling module) to predict ``labels`` from ``observations`` by
    cross-entropy. Returns the arrays named as an exported DQN policy's. The advantage head
    is then scaled so that the demonstrated action leads the next by about ``margin`` on
    average: rewards are a fraction of the peak, and Q-values of a much larger scale would
    take reinforcement learning long to unlearn."""
    import torch  # the [train] extra: only to fit a clone

    torch.manual_seed(seed)
    x = torch.as_tensor(observations.reshape(len(observations), -1), dtype=torch.float32)
    y = torch.as_tensor(labels)
    layers, width = [], x.shape[1]
    for size in hidden:
        layers += [torch.nn.Linear(width, size), torch.nn.ReLU()]
        width = size
    trunk = torch.nn.Sequential(*layers)
    head = torch.nn.Linear(width, action_count)
    optimizer = torch.optim.Adam(list(trunk.parameters()) + list(head.parameters()), lr=lr)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=generator)
        for start in range(0, len(x), 256):
            batch = order[start:start + 256]
            loss = torch.nn.functional.cross_entropy(head(trunk(x[batch])), y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    with torch.no_grad():
        logits = head(trunk(x))
        top2 = torch.topk(logits, 2, dim=1).values
        gap = float((top2[:, 0] - top2[:, 1]).mean())
        scale = margin / gap if gap > 0 else 1.0
    arrays = {}
    linear = [m for m in trunk if isinstance(m, torch.nn.Linear)]
    for i, layer in enumerate(linear):
        arrays[f"trunk.{i}.weight"] = layer.weight.detach().numpy().astype(np.float32)
        arrays[f"trunk.{i}.bias"] = layer.bias.detach().numpy().astype(np.float32)
    arrays["advantages.0.weight"] = (head.weight.detach().numpy() * scale).astype(np.float32)
    arrays["advantages.0.bias"] = (head.bias.detach().numpy() * scale).astype(np.float32)
    arrays["value.0.weight"] = np.zeros((1, width), dtype=np.float32)
    arrays["value.0.bias"] = np.zeros(1, dtype=np.float32)
    return arrays


def margin_loss(q_values, actions, margin: float):
    """DQfD's large-margin loss, the mean over the batch of ``max_a [Q(s,a) + l(a_E,a)] -
    Q(s,a_E)`` (torch tensors; ``l`` = ``margin`` for every action but the demonstrated one):
    DQfD's learner (:mod:`looprl.train.dqfd`) and ``--adapt``'s fine-tuning."""
    import torch  # the [train] extra

    margins = torch.full_like(q_values, float(margin))
    margins.scatter_(1, actions.view(-1, 1), 0.0)
    demonstrated = q_values.gather(1, actions.view(-1, 1)).squeeze(1)
    return ((q_values + margins).max(dim=1).values - demonstrated).mean()


def accuracy(arrays: dict[str, np.ndarray], observations: np.ndarray, labels: np.ndarray, hidden_layers: int) -> float:
    """Share of ``labels`` the cloned network's greedy action reproduces."""
    x = observations.reshape(len(observations), -1)
    for i in range(hidden_layers):
        x = np.maximum(x @ arrays[f"trunk.{i}.weight"].T + arrays[f"trunk.{i}.bias"], 0.0)
    chosen = np.argmax(x @ arrays["advantages.0.weight"].T + arrays["advantages.0.bias"], axis=1)
    return float(np.mean(chosen == labels)) if len(labels) else math.nan


def cloned_policy(agent: dict, x: np.ndarray, y: np.ndarray, seed: int, extra: dict, log=print) -> Policy:
    """A policy of ``agent``'s network cloned from the pairs ``(x, y)`` (:func:`clone` with the
    ``epochs``, ``lr`` and ``margin`` of the agent's ``pretrain`` section), its metadata holding ``extra``."""
    settings = section_settings(agent, "pretrain")
    hidden = hidden_layers(agent)
    arrays = clone(x, y, hidden, len(agent_actions(agent)), epochs=settings["epochs"], lr=float(settings["lr"]),
                   seed=seed, margin=float(settings["margin"]))
    log(f"[clone] {len(y)} state-action pairs; greedy action matches the demonstration on {accuracy(arrays, x, y, len(hidden)):.1%}")
    network = {
        "trunk": [{"weight": f"trunk.{i}.weight", "bias": f"trunk.{i}.bias", "activation": "relu"} for i in range(len(hidden))],
        "heads": {"advantages": [{"weight": "advantages.0.weight", "bias": "advantages.0.bias", "activation": "linear"}],
                  "value": [{"weight": "value.0.weight", "bias": "value.0.bias", "activation": "linear"}]},
        "greedy": "advantages",
    }
    return Policy.from_arrays(policy_metadata(agent, network, extra), arrays)
