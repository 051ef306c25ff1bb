"""`FinalityVectorEnv`: N episodes of a Finality env stepped in one call, every registered id's
`vector_entry_point` (`gym.make_vec(id, num_envs)`).

Why its own: Gymnasium's `SyncVectorEnv` steps N wrapped envs, each building an info dict that
the vector env then copies key by key into arrays (a third of its time here); this one steps the
N engines directly and builds each info key once, as one array over the envs. It plays the same
episodes as `SyncVectorEnv` over `gym.make(id)` for the same seeds, step for step: the same
observations, rewards, ends, masks and info arrays (`tests/env/test_vector.py` checks it on
random play of every arm and autoreset mode). `benchmarks/vector_env.py` measures both.

Spaces: `single_observation_space` and `single_action_space` are the scalar env's (`Box(58)`,
`Discrete(16)`); `observation_space` is their batch (N, 58) and `action_space`
`MultiDiscrete([16] * N)`. `step(actions)` takes N action indices (any integer array of shape
(N,)); an index out of range is refused before any env moves.

Info: the scalar env's seven numeric keys (`FinalityEnv`'s Info section), each an array over the
envs (`action_mask` (N, 16) bool; `t`, `calls_used`, `order_value`, `gap` int64 (N,); `ended`,
`exact` bool (N,)), each with Gymnasium's `_key` mask of the envs it holds, as `SyncVectorEnv`
gives them. `info="full"` (a tool result per step, a record at the end) is not batched: use
`SyncVectorEnv` for it. `action_masks()` gives the current masks.

Autoreset (`autoreset_mode`, Gymnasium 1.x's `AutoresetMode`; `metadata["autoreset_mode"]`):

- `NEXT_STEP` (the default, Gymnasium's): the step that ends an episode returns its last
  observation, its reward, `terminated`/`truncated`, and an info whose `ended`, `gap` and `exact`
  are the ended episode's. The env's next `step` ignores its action, starts a new episode and
  returns its first observation with reward 0 and no end.
- `SAME_STEP`: the step that ends an episode starts the next at once: it returns the new
  episode's first observation and info, the ended episode's reward and end flags, and the ended
  episode's last observation in `info["final_obs"]` (an object array, None for the other envs)
  and its info in `info["final_info"]` (a dict of arrays; its `gap` is the ended episode's);
  `info["_final_info"]` marks the envs that ended.
- `DISABLED`: an ended env must be reset with `reset(options={"reset_mask": mask})` before it
  is stepped again; stepping it is refused.

Reset: `seed` an int (env i gets `seed + i`), a list of N ints or Nones, or None, as
`SyncVectorEnv` takes it. `options` may name `task_id` and `fault_seed` once for every env (as
`SyncVectorEnv` passes one options dict to each) or as a sequence of N values, one per env (None:
drawn); `reset_mask`, a bool array of shape (N,), resets only the envs it marks, whose info
arrays alone are marked. Every option is checked before any env is reset: a refused reset
changes nothing.

`max_episode_steps` (which `gym.make_vec` passes from the id's registration, 50) truncates an
episode as Gymnasium's `TimeLimit` does; the 40-call budget ends every episode first.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from .env import RESET_OPTIONS, FinalityEnv

INFO_KEYS = ("action_mask", "t", "calls_used", "order_value", "ended", "gap", "exact")


class FinalityVectorEnv(VectorEnv):
    """N Finality episodes stepped at once; the module docstring documents the spaces, the
    info, the autoreset modes and the reset options."""

    def __init__(self, num_envs: int = 1, *,
                 autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
                 max_episode_steps: int | None = None, **kwargs: Any):
        if type(num_envs) is not int or num_envs < 1:
            raise ValueError(f"num_envs: must be an int >= 1; got {num_envs!r}")
        try:
            autoreset_mode = AutoresetMode(autoreset_mode)
        except ValueError:
            raise ValueError(f"autoreset_mode: must be one of "
                             f"{', '.join(m.value for m in AutoresetMode)}; got "
                             f"{autoreset_mode!r}") from None
        if max_episode_steps is not None and (type(max_episode_steps) is not int
                                              or max_episode_steps < 1):
            raise ValueError(f"max_episode_steps: must be None or an int >= 1; got "
                             f"{max_episode_steps!r}")
        if kwargs.get("info", "numeric") != "numeric":
            raise ValueError("info: the vector env batches the numeric info only; for "
                             "info='full' use gym.make_vec(..., vectorization_mode='sync')")
        self.envs = tuple(FinalityEnv(**kwargs) for _ in range(num_envs))
        one = self.envs[0]
        self.num_envs = num_envs
        self.single_observation_space = one.observation_space
        self.single_action_space = one.action_space
        self.observation_space = batch_space(one.observation_space, num_envs)
        self.action_space = batch_space(one.action_space, num_envs)
        self.autoreset_mode = autoreset_mode
        self.metadata = {**one.metadata, "autoreset_mode": autoreset_mode}
        self.render_mode = one.render_mode
        self.max_episode_steps = max_episode_steps
        self._n_actions = int(one.action_space.n)
        self._obs = np.zeros(self.observation_space.shape, dtype=np.float32)
        self._masks = np.zeros((num_envs, self._n_actions), dtype=bool)
        self._steps = [0] * num_envs           # of the running episode, for max_episode_steps
        self._ended = [False] * num_envs       # the env's last step ended its episode
        self._started = False

    # ----------------------------------------------------------------------------- reset
    def reset(self, *, seed: int | Sequence[int | None] | None = None,
              options: dict | None = None) -> tuple[np.ndarray, dict]:
        n = self.num_envs
        if seed is None:
            seeds = [None] * n
        elif isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
            seeds = [int(seed) + i for i in range(n)]
        else:
            seeds = list(seed)
            if len(seeds) != n:
                raise ValueError(f"seed: a list of seeds must have num_envs={n} entries; got "
                                 f"{len(seeds)}")
        options = dict(options or {})
        which = self._reset_mask(options.pop("reset_mask", None))
        # every env's options checked before any env changes
        chosen = {i: self.envs[i]._chosen(self._options_of(options, i)) for i in which}
        for i in which:
            env = self.envs[i]
            super(FinalityEnv, env).reset(seed=seeds[i])
            self._obs[i] = env._start(*chosen[i])
            self._steps[i] = 0
            self._ended[i] = False
            self._mask_of(i)
        self._started = True
        info = self._info([0] * n, which, len(which) == n)
        return self._obs.copy(), info

    def _reset_mask(self, mask: Any) -> list[int]:
        """The envs a reset resets: all, or those `options["reset_mask"]` marks."""
        if mask is None:
            return list(range(self.num_envs))
        if not isinstance(mask, np.ndarray) or mask.dtype != np.bool_ \
                or mask.shape != (self.num_envs,) or not mask.any():
            raise ValueError(f"options: reset_mask must be a bool numpy array of shape "
                             f"({self.num_envs},) with at least one True; got {mask!r}")
        if not self._started:
            raise ValueError("options: reset_mask before the first reset; reset every env first")
        return [int(i) for i in np.flatnonzero(mask)]

    def _options_of(self, options: dict, i: int) -> dict:
        """Env i's options: a value for every env, or a sequence with one per env."""
        unknown = set(options) - RESET_OPTIONS
        if unknown:
            raise ValueError(f"options: unknown keys {sorted(unknown)}; valid: task_id, "
                             "fault_seed, reset_mask")
        mine = {}
        for key, value in options.items():
            if isinstance(value, (list, tuple, np.ndarray)):
                if len(value) != self.num_envs:
                    raise ValueError(f"options: {key} as a sequence needs num_envs="
                                     f"{self.num_envs} values; got {len(value)}")
                value = value[i]
                if isinstance(value, np.integer):
                    value = int(value)
                if value is None:
                    continue
            mine[key] = value
        return mine

    # ----------------------------------------------------------------------------- step
    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        if not self._started:
            raise ValueError("step() before reset(): call reset() first")
        n = self.num_envs
        acts = np.asarray(actions)
        if acts.shape != (n,) or acts.dtype.kind not in "iu":
            raise ValueError(f"actions: must be {n} integer action indices, shape ({n},); got "
                             f"shape {acts.shape} of {acts.dtype}")
        if ((acts < 0) | (acts >= self._n_actions)).any():
            raise ValueError(f"actions: each must lie in 0..{self._n_actions - 1}; got "
                             f"{acts.tolist()}")
        mode = self.autoreset_mode
        if mode is AutoresetMode.DISABLED and any(self._ended):
            raise ValueError(f"envs {[i for i, e in enumerate(self._ended) if e]} have ended: "
                             "reset them with reset(options={'reset_mask': ...}) first "
                             "(autoreset_mode is disabled)")
        rewards = np.zeros(n, dtype=np.float64)
        terminated = np.zeros(n, dtype=bool)
        truncated = np.zeros(n, dtype=bool)
        gaps = [0] * n
        final: dict[int, tuple[np.ndarray, dict]] = {}
        obs, envs, steps, ended, limit = self._obs, self.envs, self._steps, self._ended, \
            self.max_episode_steps
        next_step, same_step = mode is AutoresetMode.NEXT_STEP, mode is AutoresetMode.SAME_STEP
        for i, action in enumerate(acts.tolist()):
            env = envs[i]
            if ended[i] and next_step:
                obs[i] = env._begin(None)
                steps[i] = 0
                ended[i] = False
                self._mask_of(i)
                continue
            obs[i], _, gap = env._advance(action)
            steps[i] += 1
            if gap is not None:
                rewards[i] = env._reward(gap)
                lapsed = env.episode.lapsed
                terminated[i], truncated[i] = not lapsed, lapsed
                gaps[i] = gap
                ended[i] = True
            if limit is not None and steps[i] >= limit:  # as TimeLimit: even on an end
                truncated[i] = ended[i] = True
            self._mask_of(i)
            if ended[i] and same_step:
                final[i] = (obs[i].copy(), self._one_info(i, gap))
                obs[i] = env._begin(None)
                steps[i] = 0
                ended[i] = False
                gaps[i] = 0
                self._mask_of(i)
        info = self._info(gaps, range(n), True)
        if final:
            self._add_final(info, final)
        return obs.copy(), rewards, terminated, truncated, info

    def _mask_of(self, i: int) -> None:
        env = self.envs[i]
        episode = env.episode
        self._masks[i] = env._encoder.shared_mask(episode.now, env.probe,
                                                  episode.probes_answered)

    def _info(self, gaps: list[int], which: Sequence[int], every: bool) -> dict:
        """The info of the envs in `which` (the others' entries zero and unmarked), each key one
        array, as `SyncVectorEnv` builds it from the scalar env's infos."""
        n = self.num_envs
        episodes = [env.episode for env in self.envs]
        # an env ended by max_episode_steps shows no end: the case still runs (TimeLimit's)
        ended = [e and episode.done for e, episode in zip(self._ended, episodes)]
        gap = np.array(gaps, dtype=np.int64)
        ended_array = np.array(ended, dtype=bool)
        values = {"action_mask": self._masks.copy(),
                  "t": np.array([e.now for e in episodes], dtype=np.int64),
                  "calls_used": np.array([e.calls_used for e in episodes], dtype=np.int64),
                  "order_value": np.array([e.task.order_value for e in episodes],
                                          dtype=np.int64),
                  "ended": ended_array, "gap": gap, "exact": ended_array & (gap == 0)}
        if every:
            marks = np.ones(n, dtype=bool)
        else:
            marks = np.zeros(n, dtype=bool)
            marks[list(which)] = True
            for value in values.values():
                value[~marks] = 0
        info = {}
        for key in INFO_KEYS:
            info[key] = values[key]
            info[f"_{key}"] = marks.copy()
        return info

    def _one_info(self, i: int, gap: int | None) -> dict:
        """Env i's info as the scalar env gives it (for `final_info`)."""
        episode = self.envs[i].episode
        done = gap is not None
        return {"action_mask": self._masks[i].copy(), "t": episode.now,
                "calls_used": episode.calls_used, "order_value": episode.task.order_value,
                "ended": done, "gap": gap or 0, "exact": done and gap == 0}

    def _add_final(self, info: dict, final: dict[int, tuple[np.ndarray, dict]]) -> None:
        """SAME_STEP's `final_obs` and `final_info` of the envs that ended, as `SyncVectorEnv`
        adds them."""
        n = self.num_envs
        marks = np.zeros(n, dtype=bool)
        marks[list(final)] = True
        final_obs = np.full(n, None, dtype=object)
        arrays = {"action_mask": np.zeros((n, self._n_actions), dtype=bool),
                  **{key: np.zeros(n, dtype=np.int64)
                     for key in ("t", "calls_used", "order_value", "gap")},
                  "ended": np.zeros(n, dtype=bool), "exact": np.zeros(n, dtype=bool)}
        for i, (obs, one) in final.items():
            final_obs[i] = obs
            for key, value in one.items():
                arrays[key][i] = value
        final_info = {}
        for key in INFO_KEYS:
            final_info[key] = arrays[key]
            final_info[f"_{key}"] = marks.copy()
        info["final_obs"], info["_final_obs"] = final_obs, marks.copy()
        info["final_info"], info["_final_info"] = final_info, marks.copy()

    # ----------------------------------------------------------------------------- the rest
    def action_masks(self) -> np.ndarray:
        """The actions each env allows next, (N, n_actions) bool."""
        return self._masks.copy()

    def render(self) -> tuple | None:
        """Each env's `render()` (a tuple of N), or None without a render mode."""
        if self.render_mode is None:
            return None
        return tuple(env.render() for env in self.envs)
