"""`ValidationCallback`: the graded validation (`finality_gym.validation`) of a stable-baselines3
model while it trains, logged where SB3 logs (`validation/mean_gap`, `validation/exact_rate`,
`validation/premature_rate`: TensorBoard with `tensorboard_log=`), so a run is judged by its grade
rather than by `ep_rew_mean`, the training return.

    from sb3_contrib import MaskablePPO
    from finality_gym.callbacks import ValidationCallback

    env = gym.make("Finality-v0", reward="relative")
    model = MaskablePPO("MlpPolicy", env, gamma=1.0, tensorboard_log="runs/mine")
    model.learn(200_000, callback=ValidationCallback(eval_every=50_000))

stable-baselines3 is an optional dependency of the package: this module needs it (the `train`
extra), nothing else in `finality_gym` imports it.

The model plays as the grader plays a saved one (`sb3:`): an actor-critic's actions sampled, with
torch's generator seeded from each episode's brief, so a validation's number depends on the
weights alone; a Q-learner (DQN, QR-DQN) greedily; MaskablePPO given the env's masks. The probe
arm is the training env's. A model whose observations are not the env's own (a frame stack) or
that carries a recurrent state takes `policy=`, a function from the model to a
`finality_gym.policy.Policy` (`python -m train` passes `agents.learned.policy.sb3_policy`).
"""

from __future__ import annotations

import inspect
from typing import Callable

try:
    from stable_baselines3.common.callbacks import BaseCallback
except ImportError as exc:  # pragma: no cover - the train extra is missing
    raise ImportError("finality_gym.callbacks needs stable-baselines3: pip install "
                      "'finality-gym[train]'") from exc

from .env import FinalityEnv
from .policy import GymPolicy, Policy
from .validation import METRICS, validate


def model_policy(model, env: FinalityEnv) -> GymPolicy:
    """An SB3 model in memory as a policy of the env it trains on, played as the module
    docstring says; a model that does not see the env's own observations is refused."""
    import torch
    advice = ("pass policy=, a function from the model to a finality_gym.policy.Policy (a "
              "GymPolicy whose predict(obs, mask) gives the model what it was trained on)")
    if model.get_vec_normalize_env() is not None:
        raise ValueError("ValidationCallback: the model's observations are normalized "
                         f"(VecNormalize), the grader's are the env's own: {advice}")
    space = model.observation_space
    if space != env.observation_space:
        shape = getattr(space, "shape", None)
        what = ("a frame stack or another shape" if shape != env.observation_space.shape
                else "an observation wrapper (NormalizeObservation, ...)")
        raise ValueError(f"ValidationCallback: the model observes {type(space).__name__} of "
                         f"shape {shape}, not the env's own observation ({what}): {advice}")
    if hasattr(model.policy, "lstm_actor"):
        raise ValueError("ValidationCallback: a recurrent model carries its state from step to "
                         f"step: {advice}; in a clone of the repository, policy=lambda model: "
                         "agents.learned.policy.sb3_policy(model, 'validation')")
    sampled = hasattr(model.policy, "get_distribution")  # an actor-critic; a Q-learner is greedy
    masked = "action_masks" in inspect.signature(model.predict).parameters

    def predict(obs, mask) -> int:
        if masked:
            return int(model.predict(obs, deterministic=not sampled, action_masks=mask)[0])
        return int(model.predict(obs, deterministic=not sampled)[0])
    return GymPolicy("validation", predict, env.wait_ticks,
                     start=torch.manual_seed if sampled else None)


class ValidationCallback(BaseCallback):
    """Validate at the first step (the untrained model: the curve's start), then whenever
    `eval_every` steps have passed since the last validation (SB3 counts steps in whole
    vectorized steps: with 8 envs, at 8, 50,008, ...) and once at the end of training: log the
    three `METRICS` under `validation/` and keep them in `history` (with `timesteps`); `best` is
    the lowest mean gap's (the callback saves no model: save one in `evaluate`'s override, as
    `python -m train` does). `probe`: the arm to validate in (default: the training env's).
    `policy(model) -> Policy`: how the model plays (default `model_policy`). `stride`: the
    validation set's (`finality_gym.validation`)."""

    def __init__(self, eval_every: int = 50_000, probe: str | None = None, stride: int = 2,
                 policy: Callable[[object], Policy] | None = None, verbose: int = 0):
        super().__init__(verbose)
        if type(eval_every) is not int or eval_every < 1:
            raise ValueError(f"eval_every: must be an int >= 1; got {eval_every!r}")
        self.eval_every = eval_every
        self.probe = probe
        self.stride = stride
        self.policy = policy
        self.history: list[dict] = []
        self.best: dict = {"mean_gap": float("inf")}
        self.last = -eval_every  # the step of the last validation

    def _on_training_start(self) -> None:
        if self.probe is None or self.policy is None:
            env = self.training_env.get_attr("unwrapped")[0]
            if not isinstance(env, FinalityEnv):
                raise ValueError(f"ValidationCallback: the training env is a "
                                 f"{type(env).__name__}, not a Finality env: pass probe= and "
                                 "policy=")
            if self.probe is None:
                self.probe = env.probe
            if self.policy is None:
                self.policy = lambda model, env=env: model_policy(model, env)

    def _on_step(self) -> bool:
        if self.num_timesteps - self.last >= self.eval_every:
            self.evaluate()
        return True

    def _on_training_end(self) -> None:
        if self.num_timesteps != self.last:
            self.evaluate()

    def evaluate(self) -> dict:
        """Validate now; the result with its `timesteps`."""
        self.last = self.num_timesteps
        result = {"timesteps": self.num_timesteps,
                  **validate(self.policy(self.model), self.probe, self.stride)}
        for key in METRICS:
            self.logger.record(f"validation/{key}", result[key])
        self.logger.dump(self.num_timesteps)
        self.history.append(result)
        if result["mean_gap"] < self.best["mean_gap"]:
            self.best = result
        if self.verbose:
            print(f"{self.num_timesteps:,} steps: validation gap ${result['mean_gap']:.2f}, "
                  f"exact {result['exact_rate']:.1%}", flush=True)
        return result
