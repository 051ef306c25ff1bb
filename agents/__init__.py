"""Policies behind one interface: the nine of docs/world.md section 9, the floors, and an adapter that
runs any Gymnasium-observation policy (for example a saved stable-baselines3 model) through the
same runner as every scripted policy."""

from .base import Brief, GiveUp, Policy, Privilege
from .registry import FLOORS, HEADLINE, is_unprivileged_scripted, make_policy
from .runner import brief_for, run_episode

__all__ = ["FLOORS", "HEADLINE", "Brief", "GiveUp", "Policy", "Privilege", "brief_for",
           "is_unprivileged_scripted", "make_policy", "run_episode"]
