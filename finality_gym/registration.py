"""Every environment id, registered in one place on `import finality_gym`.

Each id is one probe arm of the same class, made by its own factory here, which fixes the arm:
`gym.make("FinalityNoProbe-v0", probe="full")` is refused (a full-probe env under the no-probe
id would be graded and reported as the wrong arm), while `probe=` naming the id's own arm is
accepted. Every other argument goes to `FinalityEnv` as given. `max_episode_steps` is only a
safety net (the 40-call budget ends every episode first).
"""

from __future__ import annotations

from gymnasium.envs.registration import register, registry

from .env import FinalityEnv
from .tasks import CALL_BUDGET

ENV_IDS = {
    "Finality-v0": "full",
    "FinalityNoProbe-v0": "none",
    "FinalityDelayedProbe-v0": "delayed",
    "FinalityRateLimitedProbe-v0": "rate_limited",
    "FinalityIdentityProbe-v0": "identity",
}


def _make(env_id: str, kwargs: dict) -> FinalityEnv:
    arm = ENV_IDS[env_id]
    probe = kwargs.pop("probe", arm)
    if probe != arm:
        others = ", ".join(f"{i} ({a})" for i, a in ENV_IDS.items())
        raise ValueError(f"probe: {env_id} is the {arm!r} probe arm and cannot be made with "
                         f"probe={probe!r}; each id fixes its arm: {others} (or construct "
                         "finality_gym.env.FinalityEnv(probe=...) directly)")
    return FinalityEnv(probe=arm, **kwargs)


# One factory per id, named so that `entry_point` stays a picklable "module:attribute" string.
def make_full(**kwargs):
    return _make("Finality-v0", kwargs)


def make_no_probe(**kwargs):
    return _make("FinalityNoProbe-v0", kwargs)


def make_delayed_probe(**kwargs):
    return _make("FinalityDelayedProbe-v0", kwargs)


def make_rate_limited_probe(**kwargs):
    return _make("FinalityRateLimitedProbe-v0", kwargs)


def make_identity_probe(**kwargs):
    return _make("FinalityIdentityProbe-v0", kwargs)


_FACTORIES = {
    "Finality-v0": "make_full",
    "FinalityNoProbe-v0": "make_no_probe",
    "FinalityDelayedProbe-v0": "make_delayed_probe",
    "FinalityRateLimitedProbe-v0": "make_rate_limited_probe",
    "FinalityIdentityProbe-v0": "make_identity_probe",
}


for _name in _FACTORIES.values():  # what gym.make reads to check and adapt `render_mode`
    globals()[_name].metadata = FinalityEnv.metadata


def register_envs() -> None:
    for env_id in ENV_IDS:
        if env_id not in registry:
            register(id=env_id, entry_point=f"finality_gym.registration:{_FACTORIES[env_id]}",
                     max_episode_steps=CALL_BUDGET + 10)
