"""Every policy of the project behind one interface: the nine of docs/world.md section 9, the
floors, learned policies (any Gymnasium-observation policy, for example a saved
stable-baselines3 model), language models and outside policies. The interface itself and the one
runner live in the installed package (`finality_gym.policy`), so a policy written anywhere can
import them; they are re-exported here for the project's own code."""

from finality_gym.policy import (Brief, GiveUp, Policy, PolicyError, Privilege, brief_for, play,
                                 run_episode)

from .factory import make_policy
from .registry import FLOORS, HEADLINE
from .spec import PolicySpec, is_unprivileged_scripted, split_specs

__all__ = ["FLOORS", "HEADLINE", "Brief", "GiveUp", "Policy", "PolicyError", "PolicySpec", "Privilege",
           "brief_for", "is_unprivileged_scripted", "make_policy", "play", "run_episode",
           "split_specs"]
