"""Every environment id, registered in one place on `import finality_gym`.

Each id is one probe arm of the same class; it also passes its arm as `registered_probe`, so
`gym.make("FinalityNoProbe-v0", probe="full")` is refused by the env (a full-probe env under the
no-probe id would be graded and reported as the wrong arm), while `probe=` naming the id's own
arm is accepted. `gym.make_vec(id, num_envs)` gives the native vector env
(`finality_gym/vector.py`; `vectorization_mode="sync"` Gymnasium's `SyncVectorEnv`).
`max_episode_steps` is only a
safety net (the 40-call budget ends every episode first).
"""

from __future__ import annotations

from gymnasium.envs.registration import register, registry

from .tasks import CALL_BUDGET

ENV_IDS = {
    "Finality-v0": "full",
    "FinalityNoProbe-v0": "none",
    "FinalityDelayedProbe-v0": "delayed",
    "FinalityRateLimitedProbe-v0": "rate_limited",
    "FinalityIdentityProbe-v0": "identity",
}


def register_envs() -> None:
    for env_id, probe in ENV_IDS.items():
        if env_id not in registry:
            register(id=env_id, entry_point="finality_gym.env:FinalityEnv",
                     vector_entry_point="finality_gym.vector:FinalityVectorEnv",
                     max_episode_steps=CALL_BUDGET + 10,
                     kwargs={"probe": probe, "registered_probe": probe})
