"""`Finality-v0`: a thin Gymnasium encoder over the world engine (`finality_gym.Episode`)."""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from .corpus import SPLITS, load_corpus
from .economics import DEFAULT_COSTS, Costs
from .encoder import DEFAULT_WAITS, OBS_FIELDS, ObservationEncoder
from .episode import PROBE_ARMS, Episode, InvalidCall
from .faults import FAMILIES, FaultProfile
from .registration import ENV_IDS
from .tasks import ARCHETYPES, HANDOVER_AT, HORIZON, ORDER_VALUES, SHIP_BY, Task

INFO_MODES = ("numeric", "full")  # the `info` argument: the Info section of FinalityEnv
REWARDS = ("dollars", "relative")  # the `reward` argument: the Rewards section
RESET_OPTIONS = {"task_id", "fault_seed"}
# The info's numbers as numpy int64 scalars, made once: every clock time and call count an info
# can show (numpy's scalars are immutable, so one object can stand in every info that shows it;
# making one costs ten times as much as a list lookup).
_INT64 = tuple(np.int64(n) for n in range(HORIZON + 1))
_ORDER_VALUES = {value: np.int64(value) for value in ORDER_VALUES}
# copied for each info's flags: a copy costs a third of np.array(False)
_FALSE, _TRUE = np.array(False), np.array(True)


def relative_reward(gap: int, order_value: int) -> float:
    """The training reward of an ended episode (`reward="relative"`, the Rewards section):
    minus its gap as a fraction of the order value, both in cents."""
    return -gap / order_value


def _record_gap(episode: Episode) -> int:
    return episode.record().gap


class FinalityEnv(gym.Env):
    """
    ## Description

    An online merchant's agent is handed one order at t=120 whose card capture may or may not
    settle. Four replica systems (processor, ledger, ERP, bank) each show a faulty, delayed copy
    of the truth; an authoritative probe is slower; waiting costs time; a capture retry with the
    original idempotency key is safe, with a fresh key it is a second real charge. The episode
    ends with one irreversible disposition and is graded by its economic position against a
    reference that knows only how the pending capture resolves. The rules are in
    `docs/world.md` (the world, section 2; the systems, 3; the faults, 4; the tools, 5; the
    economics, 7; the reference, 8). The engine is `finality_gym.Episode`, reachable as
    `env.unwrapped.episode`.

    ## Action Space

    `Discrete(12 + len(wait_ticks))`; with the default `wait_ticks=(10, 30, 60, 120)`:

    | index | tool |
    |-------|------|
    | 0 | `read_processor` |
    | 1 | `read_ledger` |
    | 2 | `read_erp` |
    | 3 | `read_bank` |
    | 4 | `probe_processor` |
    | 5..8 | `wait(ticks)` for ticks in `wait_ticks` (10, 30, 60, 120) |
    | 9 | `retry_capture(key="original")` |
    | 10 | `retry_capture(key="fresh")` |
    | 11 | `ship` |
    | 12 | `refund` |
    | 13 | `write_off` |
    | 14 | `escalate` |
    | 15 | `close` |

    With other `wait_ticks` the waits take indices 5..4+W and everything after shifts by W - 4.
    `action_masks()` (for sb3-contrib's MaskablePPO) masks `ship` after the ship-by deadline
    and the probe where the arm refuses it (`none`; `rate_limited` once spent).

    ## Observation Space

    `Box(low, high, (58,), float32)`, finite bounds. Ages and times are in ticks over the span
    named; money is a fraction of the order value; counts are over 4 (clipped at 1). A system
    never read has read=0, age=1 and an all-zero view; one-hot blocks have exactly one 1 once read.

    | index | name | range | meaning |
    |-------|------|-------|---------|
    | 0 | time_since_handover | 0..1 | (t - 120) / 1680 |
    | 1 | time_to_deadline | 0..1 | max(0, 600 - t) / 480 |
    | 2 | calls_left | 0..1 | (40 - calls used) / 40 |
    | 3 | order_value_log | 0..1 | ln(order value in cents) / ln(349900) |
    | 4 | processor_read | 0/1 | the processor has been read |
    | 5 | processor_read_age | 0..1 | min(t - last read, 1800) / 1800 |
    | 6..11 | processor_original_* | one-hot | cap1 as the processor shows it: absent, submitted, settled, failed_soft, failed_hard, reversed |
    | 12..17 | processor_newest_* | one-hot | the newest capture, same statuses |
    | 18 | processor_captures | 0..1 | captures the processor knows / 4 |
    | 19 | ledger_read | 0/1 | |
    | 20 | ledger_read_age | 0..1 | |
    | 21 | ledger_cash | -4..4 | cash balance / order value |
    | 22 | ledger_clearing | -4..4 | clearing balance / order value |
    | 23 | ledger_imbalance | -4..4 | (debits - credits) / order value |
    | 24 | ledger_settlement_entries | 0..1 | settlement entries / 4 |
    | 25 | ledger_failure_entries | 0..1 | failure reversals / 4 |
    | 26 | erp_read | 0/1 | |
    | 27 | erp_read_age | 0..1 | |
    | 28..36 | erp_* | one-hot | unknown, placed, authorized, payment_pending, paid, payment_failed, shipped, refunded, disputed |
    | 37 | bank_read | 0/1 | |
    | 38 | bank_read_age | 0..1 | |
    | 39 | bank_credits | 0..4 | credit lines' total / order value |
    | 40 | bank_debits | 0..4 | debit lines' total (absolute) / order value |
    | 41 | bank_credit_lines | 0..1 | credit lines / 4 |
    | 42..47 | probe_original_* | one-hot | last probe answer for cap1: none, unknown, settled, failed_soft, failed_hard, submitted |
    | 48..53 | probe_newest_* | one-hot | last probe answer for the newest capture, same values |
    | 54 | probe_age | 0..1 | min(t - last answered probe, 1800) / 1800 (1 if none) |
    | 55 | retries_original | 0..1 | `retry_capture("original")` calls / 4 |
    | 56 | retries_fresh | 0..1 | `retry_capture("fresh")` calls / 4 |
    | 57 | last_call_refused | 0/1 | the last call returned an error (late ship, refused probe) |

    The agent never sees the archetype, the card fate or `t_det`; everything above is decoded
    from tool results, so the two halves of a twin pair see identical observations before `t_det`.

    ## Rewards

    0 on every step but the last; at the end, with `reward="dollars"` (the default),
    `-gap / 100 / reward_scale`: the excess loss in dollars over `reward_scale` (default 100).
    With `reward="relative"`, the training reward: `-gap / order_value`, the excess loss as a
    fraction of the order value (`reward_scale` unused). The order value is observed and fixed
    within an episode, so dividing by it leaves the optimal policy unchanged, but it keeps the
    rare $3,499 orders from drowning a value function in variance: trained on the dollar
    reward, PPO's value function explained almost none of the return and the policy learned
    one action (docs/training.md). Grading always uses the dollar gap. A lapse is graded like
    any other end (`docs/world.md` sections 7 and 8).

    ## Starting State

    t=120, 40 calls left, nothing read. `reset` draws a task uniformly from the configured
    split (and archetypes) and a fault seed, both from `self.np_random`; `options` may name
    `task_id` and `fault_seed` to replay one exact evaluation episode.

    ## Episode End

    `terminated` on a disposition (`ship` before the deadline, `refund`, `write_off`,
    `escalate`, `close`); `truncated` on a lapse (the 40-call budget spent or the horizon
    reached).

    ## Info

    By default (`info="numeric"`) `reset` and every `step` return the same seven keys with the
    same dtypes and shapes, so that toolkits which stack or compare infos across steps accept
    them (Tianshou's buffer, Minari's `DataCollector(record_infos=True)`, TorchRL's info reader
    and `ActionMask`, Gymnasium's vector envs; `tests/env/test_toolkits.py`). The numbers are numpy
    int64 scalars and the flags 0-d bool arrays (`int(info["gap"])`, `bool(info["ended"])` give
    Python values): TorchRL's info reader takes a dtype from every value (a Python int has
    none), and a numpy bool scalar would become an object array in a Gymnasium vector env, where
    a 0-d array keeps its dtype.

    | key | type | meaning |
    |-----|------|---------|
    | `action_mask` | bool, (n_actions,) | the actions allowed next: `action_masks()` |
    | `t` | int64 scalar | the clock in ticks after the call (what obs[0] encodes; 120 at reset) |
    | `calls_used` | int64 scalar | calls of the 40-call budget spent (0 at reset) |
    | `order_value` | int64 scalar | the order's value in cents (the episode's; obs[3] encodes it) |
    | `ended` | bool, 0-d array | the case has ended: this step terminated or truncated |
    | `gap` | int64 scalar | once ended, the excess loss in cents (the reward's); 0 before |
    | `exact` | bool, 0-d array | ended with a gap of 0 (the reports' "exact"); False before |

    Once ended, `action_mask` is the clock's mask at the end; no action is valid after the end.
    With `info="full"` the info also carries, on every step, the tool's `result` (a JSON dict
    whose keys depend on the tool) and, at the end, the whole `record`
    (`finality_gym.EpisodeRecord`), as every info did in 0.1.0; their keys change from step to
    step, so toolkits that stack infos refuse them.

    ## Rendering

    `render()` returns None without a render mode. Neither mode names the task, its archetype,
    its card fate or its twin half, and while the case runs neither shows anything the tools did
    not tell the agent: the two halves of a twin pair render identically, byte for byte, before
    `t_det`.

    - `"ansi"`: text, one line per call (time, call, result), and once the case has ended the
      disposition, its time, the position, the reference and the gap in dollars.
    - `"rgb_array"`: an RGB `uint8` image of shape (800, 1280, 3), the same shape at every step
      of every episode (`finality_gym/timeline.py`; matplotlib's Agg, imported at the first
      render; `benchmarks/env.py` measures a frame). A timeline of the case: x is the clock from the hand-over
      t=120 to the horizon t=1800, drawn wider up to the ship-by deadline t=600 (after it the
      scale is 4.5 times compressed and shaded), with the hand-over, the deadline and the
      horizon marked. The header gives the order value, cap1's submission at t=10, the probe
      arm, the clock and the calls used. Tracks, top to bottom:
      - *truth*: while the case runs, an empty box "truth: hidden until the case ends", and no
        `t_det`. Once it has ended: every event of the canonical log (`docs/world.md` section 2)
        from the hand-over to the horizon with its time (capture submitted or retried, settled
        or declined with its decline, refunded, voided, chargeback, shipped, escalated, closed,
        written off; the specialist's marked), a band of each capture's true status (cap1, and
        above it the newest other capture), the world's later events after the agent's end
        shaded, and a dashed line at `t_det`, when cap1's outcome was determined.
      - *processor*, *ledger*, *ERP*, *bank*: a tick at every read of that system the agent
        made and, from that read to the next, a band coloured by what it showed (paid, pending,
        declined, money returned, shipped, nothing), labelled with the read's time where the
        view changed: the processor's status of each capture (and decline), the ledger's cash
        and clearing balances and any imbalance in dollars, the ERP's order status, the bank's
        credits and debits in dollars; "never read" otherwise. Once the case has ended, each
        system's track also marks with a star and a label every delivery or read a profile
        fault changed (lost, delayed to t, duplicated, reordered, half-committed, stale read):
        exactly the firings `fault_firings` counts (an archetype's own faults are not marked).
      - *agent calls*: every call at its time: reads as ticks with their systems' letters
        (P, L, E, B), probes with their answer (a `delayed` probe's as-of time too), waits as
        spans, retries with their key (a fresh key flagged as another charge), refused calls,
        and the disposition (or the lapse); a run of identical calls shares one label ("x6").
      A vertical line marks "now" while the case runs, the agent's end once it has ended. Below,
      once ended: the disposition and its time (or the lapse), the position and its parts (cash
      kept, cost of goods, liability, dispute and escalation fees), the reference and the gap in
      dollars, from `episode.record()`; before that, "outcome: hidden until the case ends".

    ## Arguments

    `split` ("public" | "regenerated"), `archetypes` (a subset of the nine, default all),
    `faults` (a `FaultProfile`, an intensity, or a dict of `FaultProfile` arguments; default
    `docs/world.md` section 4's profile), `probe` ("full" | "none" | "delayed" | "rate_limited" |
    "identity"; each id registered by `finality_gym` fixes its own arm and refuses another,
    through `registered_probe`, which the ids set to their arm),
    `wait_ticks` (a non-empty sequence of ints >= 1), `reward` ("dollars" | "relative", above),
    `reward_scale` (> 0), `cogs_fraction`,
    `dispute_fee`, `escalation_fee` (`docs/world.md` section 7 defaults), `render_mode` (None |
    "ansi" | "rgb_array"), `info` ("numeric" | "full", above). Invalid values raise `ValueError`
    naming the argument and the valid values.

    ## Vector env

    `gym.make_vec(id, num_envs)` gives `finality_gym.vector.FinalityVectorEnv` (every id's
    `vector_entry_point`): the same episodes as `SyncVectorEnv` over this env, stepped in one
    call, with its info as one dict of arrays (`finality_gym/vector.py` says more).

    ## Version History

    - v0 (0.2.0): `info` is numeric and the same at every step (above); `result` and `record`
      only with `info="full"`; `reward="relative"` and the native vector env. Observations,
      rewards and dynamics are unchanged, so every agent's trajectories, rewards and scores are
      too: the ids stay v0.
    - v0 (0.1.0): the first release.
    """

    metadata = {"render_modes": ["ansi", "rgb_array"], "render_fps": 4}

    def __init__(self, split: str = "public", archetypes: Any = None, faults: Any = None,
                 probe: str = "full", wait_ticks: Any = DEFAULT_WAITS, reward_scale: float = 100.0,
                 cogs_fraction: float = DEFAULT_COSTS.cogs_fraction,
                 dispute_fee: int = DEFAULT_COSTS.dispute_fee,
                 escalation_fee: int = DEFAULT_COSTS.escalation_fee,
                 render_mode: str | None = None, registered_probe: str | None = None,
                 info: str = "numeric", reward: str = "dollars"):
        if registered_probe is not None and probe != registered_probe:
            others = ", ".join(f"{i} ({a})" for i, a in ENV_IDS.items())
            env_id = next(i for i, a in ENV_IDS.items() if a == registered_probe)
            raise ValueError(f"probe: {env_id} is the {registered_probe!r} probe arm and cannot "
                             f"be made with probe={probe!r}; each id fixes its arm: {others} (or "
                             "construct finality_gym.env.FinalityEnv(probe=...) directly)")
        if split not in SPLITS:
            raise ValueError(f"split: unknown split {split!r}; valid: {', '.join(SPLITS)}")
        if archetypes is None:
            archetypes = ARCHETYPES
        if isinstance(archetypes, str) or not set(archetypes) <= set(ARCHETYPES) or not archetypes:
            raise ValueError(f"archetypes: must be a non-empty subset of {', '.join(ARCHETYPES)}; "
                             f"got {archetypes!r}")
        if probe not in PROBE_ARMS:
            raise ValueError(f"probe: unknown arm {probe!r}; valid: {', '.join(PROBE_ARMS)}")
        try:
            wait_ticks = tuple(wait_ticks)
        except TypeError:
            raise ValueError(f"wait_ticks: must be a non-empty sequence of ints >= 1; "
                             f"got {wait_ticks!r}") from None
        if not wait_ticks or any(type(w) is not int or w < 1 for w in wait_ticks):
            raise ValueError(f"wait_ticks: must be a non-empty sequence of ints >= 1; "
                             f"got {wait_ticks!r}")
        if isinstance(reward_scale, bool) or not isinstance(reward_scale, (int, float)) \
                or not reward_scale > 0 or not math.isfinite(reward_scale):
            raise ValueError(f"reward_scale: must be a finite number > 0; got {reward_scale!r}")
        if reward not in REWARDS:
            raise ValueError(f"reward: must be 'dollars' or 'relative'; got {reward!r}")
        if info not in INFO_MODES:
            raise ValueError(f"info: must be 'numeric' or 'full'; got {info!r}")
        if render_mode not in (None, *self.metadata["render_modes"]):
            raise ValueError(f"render_mode: must be None or 'ansi' or 'rgb_array'; "
                             f"got {render_mode!r}")
        try:
            self.costs = Costs(cogs_fraction, dispute_fee, escalation_fee)
        except ValueError as exc:
            raise ValueError(f"cost constants: {exc}") from None
        self.faults = _fault_profile(faults)
        self.split = split
        self.archetypes = tuple(a for a in ARCHETYPES if a in set(archetypes))
        self.probe = probe
        self.wait_ticks = wait_ticks
        self.reward_scale = float(reward_scale)
        self.reward = reward
        self.render_mode = render_mode
        self.info_mode = info
        self._make_info = self._full_info if info == "full" else self._info
        # The ended episode's gap: from its record where the info carries the record anyway,
        # else without building it (the record costs three times as much).
        self._gap_of = _record_gap if info == "full" else Episode.gap
        corpus = load_corpus(split)
        self._corpus = corpus
        self._tasks = tuple(t for t in corpus.tasks if t.archetype in self.archetypes)
        self._encoder = ObservationEncoder(wait_ticks)
        self._actions = self._encoder.actions
        self._n_actions = len(self._actions)
        self.action_space = spaces.Discrete(self._n_actions)
        low = np.array([f[1] for f in OBS_FIELDS], dtype=np.float32)
        high = np.array([f[2] for f in OBS_FIELDS], dtype=np.float32)
        self.observation_space = spaces.Box(low, high, dtype=np.float32)
        self.episode: Episode | None = None
        self._order_value = np.int64(0)  # the episode's, as its info shows it

    # ----------------------------------------------------------------- Gymnasium API
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        return self._begin(options).copy(), self._make_info(None, None)

    def step(self, action):
        if self.episode is None:
            raise InvalidCall("step() before reset(): call reset() first")
        if type(action) is not int:
            if not isinstance(action, np.integer):
                raise ValueError(f"invalid action {action!r}; valid: integers "
                                 f"0..{len(self._actions) - 1}")
            action = int(action)
        if not 0 <= action < self._n_actions:
            raise ValueError(f"invalid action {action}; valid: integers 0..{len(self._actions) - 1}")
        obs, result, gap = self._advance(action)
        if gap is None:
            return obs.copy(), 0.0, False, False, self._make_info(result, None)
        lapsed = self.episode.lapsed
        return obs.copy(), self._reward(gap), not lapsed, lapsed, self._make_info(result, gap)

    # The episode's moves without the Gymnasium envelope, shared with the vector env
    # (`finality_gym/vector.py`), which builds its info for all its envs at once.
    def _begin(self, options: dict | None) -> np.ndarray:
        """A new episode from `self.np_random` and `options`; its first observation, the
        encoder's own array (copy it to keep it)."""
        return self._start(*self._chosen(options))

    def _chosen(self, options: dict | None) -> tuple[Task | None, int | None]:
        """The task and fault seed `options` name (None for each not named), checked: a
        refused reset changes nothing, not even the generator."""
        task = fault_seed = None
        if options:
            unknown = set(options) - RESET_OPTIONS
            if unknown:
                raise ValueError(f"options: unknown keys {sorted(unknown)}; valid: task_id, "
                                 "fault_seed")
            if "task_id" in options:
                if type(options["task_id"]) is not str:
                    raise ValueError(f"options: task_id must be a task id (a str); got "
                                     f"{options['task_id']!r}")
                task = self._corpus.task(options["task_id"])
            if "fault_seed" in options:
                fault_seed = options["fault_seed"]
                if type(fault_seed) is not int or fault_seed < 0:
                    raise ValueError(f"options: fault_seed must be a non-negative int; got "
                                     f"{fault_seed!r}")
        return task, fault_seed

    def _start(self, task: Task | None, fault_seed: int | None) -> np.ndarray:
        """`_begin` once the options are checked."""
        # One draw gives both the task and the fault seed (a numpy call costs 3 us); it is made
        # whatever the options say, so that they change no later episode.
        draw = int(self.np_random.integers(len(self._tasks) << 31))
        if task is None:
            task = self._tasks[draw >> 31]
        if fault_seed is None:
            fault_seed = draw & (2**31 - 1)
        self.episode = Episode(task, seed=fault_seed, faults=self.faults, probe=self.probe,
                               costs=self.costs)
        self._order_value = _ORDER_VALUES.get(task.order_value) or np.int64(task.order_value)
        return self._encoder.reset(task.order_value)

    def _advance(self, action: int) -> tuple[np.ndarray, dict, int | None]:
        """One valid action: the observation after it (the encoder's own array), the tool's
        result and, once the case has ended, its gap in cents (else None)."""
        episode = self.episode
        tool, args = self._actions[action]
        result = episode.call(tool, **args)
        obs = self._encoder.update(action, result, episode.now, episode.calls_used)
        return obs, result, (self._gap_of(episode) if episode.done else None)

    def _reward(self, gap: int) -> float:
        """The last step's reward (the Rewards section)."""
        if self.reward == "relative":
            return relative_reward(gap, self.episode.task.order_value)
        return -gap / 100.0 / self.reward_scale

    def _info(self, result: dict | None, gap: int | None) -> dict:
        """The Info section's keys (`gap` None before the end): its arrays new every call (a
        toolkit may keep or change them), its numbers numpy's immutable scalars."""
        episode = self.episode
        if gap is None:
            ended, exact, gap_cents = _FALSE.copy(), _FALSE.copy(), _INT64[0]
        else:
            ended, exact, gap_cents = _TRUE.copy(), np.array(gap == 0), np.int64(gap)
        return {"action_mask": self._encoder.masks(episode.now, self.probe,
                                                   episode.probes_answered),
                "t": _INT64[episode.now],
                "calls_used": _INT64[episode.calls_used], "order_value": self._order_value,
                "ended": ended, "gap": gap_cents, "exact": exact}

    def _full_info(self, result: dict | None, gap: int | None) -> dict:
        """`_info` with the tool's `result` and, at the end, the `record` (`info="full"`)."""
        info = self._info(result, gap)
        if result is not None:
            info["result"] = result
        if gap is not None:
            info["record"] = self.episode.record()
        return info

    def action_masks(self) -> np.ndarray:
        episode = self.episode
        if episode is None:
            return self._encoder.masks(HANDOVER_AT, self.probe, 0)
        return self._encoder.masks(episode.now, self.probe, episode.probes_answered)

    def render(self):
        if self.render_mode == "rgb_array":
            from .timeline import draw
            return draw(self.episode)
        if self.render_mode != "ansi":
            return None
        episode = self.episode
        if episode is None:
            return "(not reset)\n"
        # Nothing here names the task: an agent shown this text (a language model's natural
        # observation) must learn no more than the tools told it. The outcome appears once ended.
        lines = [f"case: order {episode.task.order_value / 100:.2f} "
                 f"USD, handed over at t={HANDOVER_AT}, ship by t={SHIP_BY}"]
        for t, tool, args, result in episode.history:
            shown = {k: v for k, v in result.items() if k not in ("tool", "t")}
            call = f"{tool}({', '.join(f'{k}={v!r}' for k, v in args.items())})"
            lines.append(f"t={t:>4}  {call:<30} -> {shown}")
        if episode.done:
            rec = episode.record()
            lines.append(f"ended: {rec.disposition}{' (lapsed)' if rec.lapsed else ''} at "
                         f"t={rec.end_t}; position {rec.position / 100:.2f}, reference "
                         f"{rec.reference / 100:.2f}, gap {rec.gap / 100:.2f} USD")
        return "\n".join(lines) + "\n"


def _fault_profile(faults: Any) -> FaultProfile:
    if faults is None:
        return FaultProfile()
    if isinstance(faults, FaultProfile):
        return faults
    try:
        if isinstance(faults, dict):
            return FaultProfile(**faults)
        return FaultProfile(faults)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"faults: must be a FaultProfile, an intensity in [0, 1], or a dict with "
                         f"'intensity' and 'families' (from {', '.join(FAMILIES)}); {exc}") from None
