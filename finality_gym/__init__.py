"""finality-gym: a benchmark for agents that must act on money whose outcome is not final yet.

The world engine (`Episode`, `load_corpus`, `FaultProfile`, ...) does not depend on Gymnasium;
the environments in `finality_gym.env` are a thin encoder over it.
"""

from .corpus import SPLITS, Corpus, load_corpus
from .economics import Costs
from .episode import PROBE_ARMS, TOOLS, Episode, EpisodeRecord, InvalidCall
from .faults import FAMILIES, FaultProfile
from .tasks import ARCHETYPES, Task

from .registration import ENV_IDS, register_envs

register_envs()

__all__ = ["ARCHETYPES", "FAMILIES", "PROBE_ARMS", "SPLITS", "TOOLS", "Corpus", "Costs",
           "ENV_IDS", "Episode", "EpisodeRecord", "FaultProfile", "InvalidCall", "Task", "load_corpus"]
__version__ = "0.2.0"
