"""LoopTune's actions as data, and the one transition rule everything that acts calls."""

from looprl.actions.action_set import Action, ActionSet, State
from looprl.actions.transition import Transition, follow, reach, replay, step

__all__ = ["Action", "ActionSet", "State", "Transition", "follow", "reach", "replay", "step"]
