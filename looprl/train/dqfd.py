"""Demonstrations that stay with the learner: DQfD's large-margin loss beside DQN's TD loss.

Fine-tuning a cloned policy with plain TD updates erases it: the clone's greedy action leads the
others by a small margin, its value head starts at zero, and a few hundred regressions towards
noisy measured returns reorder the actions (the shipped clone fell from 2.52x to 1.67x in
validation that way). Deep Q-learning from Demonstrations (Hester et al., 2018) keeps the
demonstrated actions ahead while the values are learned: every update adds, on a minibatch of
demonstration states, the supervised large-margin loss

    J_E(Q) = max_a [Q(s, a) + l(a_E, a)] - Q(s, a_E),    l(a_E, a) = margin if a != a_E else 0

to the n-step TD loss on the agent's own replayed experience. An action the agent finds better
by measurement may still overtake a demonstrated one where the TD loss pulls harder than the
margin; where nothing was learned, the demonstration holds.

The demonstrations are the run's ``demonstrations.npz`` (flat observations and action indices;
:mod:`looprl.train.expert_iteration` writes them with
:func:`looprl.train.demonstration_files.save_demonstrations`; a later round of expert iteration
rewrites the file and :meth:`DQfDTorchLearner.reload_demonstrations` reads it again).
:class:`DQfDTorchLearner` is RLlib's DQN learner with that loss added (found by
:mod:`looprl.train.learners`' registry); the agent's ``demonstrations`` section sets ``margin``
(on the scale of rewards: fractions of the peak), ``weight`` (lambda_E) and ``batch_size``.
"""

from __future__ import annotations

import torch
from ray.rllib.algorithms.dqn.dqn_learner import QF_PREDS
from ray.rllib.algorithms.dqn.torch.dqn_torch_learner import DQNTorchLearner
from ray.rllib.core.columns import Columns

from looprl.train.cloning import margin_loss
from looprl.train.demonstration_files import load_demonstrations
from looprl.train.schema import LOSS_SETTINGS


class DQfDTorchLearner(DQNTorchLearner):
    """RLlib's DQN learner plus DQfD's large-margin loss on the run's demonstrations
    (``config.learner_config_dict["demonstrations"]``: ``path`` and the loss settings)."""

    def build(self) -> None:
        super().build()
        settings = self.config.learner_config_dict["demonstrations"]
        self._demo_settings = {name: settings[name] for name in LOSS_SETTINGS}
        self._demo_generator = torch.Generator().manual_seed(int(settings.get("seed", 0)))
        self.reload_demonstrations()

    def reload_demonstrations(self) -> int:
        """Read the run's demonstrations file again (expert iteration's next round rewrote
        it); returns the number of pairs."""
        observations, actions = load_demonstrations(self.config.learner_config_dict["demonstrations"]["path"])
        self._demo_observations = torch.as_tensor(observations, dtype=torch.float32, device=self._device)
        self._demo_actions = torch.as_tensor(actions, dtype=torch.long, device=self._device)
        return len(actions)

    def compute_loss_for_module(self, *, module_id, config, batch, fwd_out):
        td_loss = super().compute_loss_for_module(module_id=module_id, config=config, batch=batch, fwd_out=fwd_out)
        settings = self._demo_settings
        picks = torch.randint(len(self._demo_actions), (settings["batch_size"],), generator=self._demo_generator).to(self._device)
        module = self.module[module_id].unwrapped()
        q_values = module.compute_q_values({Columns.OBS: self._demo_observations[picks]})[QF_PREDS]
        actions = self._demo_actions[picks]
        supervised = margin_loss(q_values, actions, settings["margin"])
        agreement = (q_values.argmax(dim=1) == actions).float().mean()
        self.metrics.log_dict({"demonstration_margin_loss": supervised.detach(), "demonstration_agreement": agreement.detach()},
                              key=module_id, window=1)
        return td_loss + settings["weight"] * supervised
