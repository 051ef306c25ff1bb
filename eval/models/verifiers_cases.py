"""The benchmark as a `verifiers` environment, less verifiers: its cases, its episode, its reward
and metrics, and the replay that `python -m eval import-verifiers` checks a run with. The
environment itself (`eval/models/hub/finality_gym_env/`, id `finality-gym-env`, installed into
`.venv-verifiers` by `make verifiers`) is a thin adapter over this module; this module imports
no verifiers, so the main venv tests it.

**The cases** (`case_set`): one task of the environment per (task, seed) of a split (`public`,
`regenerated`, or `private`, made from a master seed file as `eval verify` makes it): the model
arm's stratified subset or the whole split, seeds 0 .. seeds - 1 of each task; optionally only
some `archetypes`, and only the first `count` tasks in corpus order (each with every seed). A
task's id is opaque (`opaque_id`: an HMAC of the task id and the seed under a key of the split:
its fingerprint, or for the private split its master seed, so a private id says nothing without
it): no id names a task, an archetype or a seed, and nothing of the master seed is in any trace.
Nor does a case's position (verifiers numbers the tasks, `task.data.idx`): the tasks are in the
order of an HMAC of their ids under the same key (`order_key`), not in corpus order (where twin
halves alternate and archetypes come in blocks), each task's seeds consecutive (so vf-eval's
`-n` of a multiple of the seeds takes whole tasks); the same options give the same order. The
model sees what `python -m eval model` shows it: the regime's system prompt and the brief (never
the seed).

**The episode** (`play`): the model arm's own code, `agents.model.ModelPolicy` over the arm's
`Endpoint`, graded by the shared grader's `grade_row`, so every request (its messages, tools,
sampling fields) and every row is the arm's, byte for byte, the endpoint aside. It runs in the
environment's process (one engine per episode); an endpoint failure (`InfrastructureError`,
`ConfigurationError`) is raised, never scored.

**The reward** (`reward`): `order_value / (order_value + gap)`, in (0, 1]: 1 for an exact
episode (gap 0), strictly decreasing in the gap (a gap of the whole order value is 0.5), and 1
too for a gap below 0 (`beat_reference`: a refusal on a task the reference lost on; no better a
decision than the reference's, so no more reward). **The metrics** (`metrics`): `exact`,
`premature`, `gap_usd` (the gap in dollars), `money_loss` (labels `MONEY_LOSS`: goods out
unpaid, a card charged twice) and `revenue_loss` (`REVENUE_LOSS`: a refused sale, money held on
an unshipped order), each a float; the failure label itself is in the trace's `info`.

**The replay** (`replay`): a logged conversation's replies answered again, in order, to the
arm's own policy (`LoggedChat`), which must ask for each exactly the logged conversation; the
row that gives is the one a run may claim, and the lengths of the requests it asked are what
`eval.models.import_checks.check_overflows` compares across the run.

May import: finality_gym, agents (the model arm's policy and endpoint), eval.grading and the
room's own `eval.models.arm` and `eval.models.import_checks`; never verifiers (this module runs
in the main venv too).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import hmac
import json
import random
from dataclasses import dataclass, field

from agents import brief_for
from agents.model import (ConfigurationError, ContextOverflow, Endpoint, ModelConfig,
                          ModelPolicy, brief_message, system_prompt)
from agents.model.prompt import REGIMES
from finality_gym import PROBE_ARMS, Corpus, load_corpus
from finality_gym.corpus import PRIVATE, private_corpus

from eval.grading.grader import MAX_SEEDS, RunConfig, grade_row
from eval.grading.labels import MONEY_LOSS, REVENUE_LOSS
from eval.grading.master_seed import master_seed
from eval.models.arm import run_config, stratified_subset
from eval.models.import_checks import Requests

ENV_ID = "finality-gym-env"
ENV_VERSION = 1  # of the environment's cases, episode, reward and metrics (in each trace's info)
SPLITS = ("public", "regenerated", PRIVATE)
SUBSETS = ("stratified", "all")


@dataclass(frozen=True)
class Options:
    """The taskset's options (`--env.taskset.*`), checked when made."""

    split: str = "public"
    master_seed_file: str | None = None  # the private split's (`python -m eval keygen`)
    subset: str = "stratified"
    seeds: int = 1
    probe: str = "full"
    archetypes: tuple[str, ...] | None = None  # only these archetypes' tasks
    count: int | None = None  # only the first `count` tasks, each with every seed
    regime: str = "open"
    max_requests: int = 80
    max_invalid_turns: int = 8
    max_total_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.archetypes is not None:  # hashable, whatever sequence was given
            object.__setattr__(self, "archetypes", tuple(self.archetypes))
        checks = [(self.split in SPLITS, f"split: one of {', '.join(SPLITS)}"),
                  ((self.split == PRIVATE) == (self.master_seed_file is not None),
                   "the private split and a master_seed_file go together"),
                  (self.subset in SUBSETS, f"subset: one of {', '.join(SUBSETS)}"),
                  (self.probe in PROBE_ARMS, f"probe: one of {', '.join(PROBE_ARMS)}"),
                  (self.regime in REGIMES, f"regime: one of {', '.join(REGIMES)}")]
        for name in ("seeds", "max_requests", "max_invalid_turns", "count", "max_total_tokens"):
            value = getattr(self, name)
            optional = name in ("count", "max_total_tokens")
            checks.append((value is None and optional or type(value) is int and value >= 1,
                           f"{name}: an integer >= 1"))
        checks.append((self.seeds <= MAX_SEEDS if type(self.seeds) is int else True,
                       f"seeds: at most {MAX_SEEDS}"))
        for ok, rule in checks:
            if not ok:
                raise ValueError(f"finality-gym-env option {rule} (got {self.as_dict()})")

    @classmethod
    def of(cls, fields: dict) -> Options:
        """The options of a taskset config's fields (those of this class; others ignored)."""
        known = {f.name for f in dataclasses.fields(cls)}
        given = {k: v for k, v in fields.items() if k in known}
        if given.get("master_seed_file") is not None:
            given["master_seed_file"] = str(given["master_seed_file"])
        return cls(**given)

    def as_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["archetypes"] = None if self.archetypes is None else list(self.archetypes)
        return data


@dataclass(frozen=True)
class Case:
    id: str       # opaque
    task_id: str
    seed: int


@dataclass(frozen=True)
class CaseSet:
    """A taskset's cases, in the taskset's order (`order_key`), with its tasks in corpus order
    (a `RunConfig`'s) and what plays and grades them."""

    options: Options
    corpus: Corpus
    cases: tuple[Case, ...]
    tasks: tuple[str, ...]
    master_seed: int | None = field(default=None, repr=False, compare=False)

    def by_id(self) -> dict[str, Case]:
        return {c.id: c for c in self.cases}

    def model_config(self, model: str, base_url: str = "http://verifiers.invalid",
                     temperature: float | None = None,
                     max_tokens: int | None = None) -> ModelConfig:
        """The arm's `ModelConfig` of an episode: the caps and regime of the options, the
        sampling fields the run sets (else the arm's defaults: temperature 0, 1,024 tokens)."""
        o = self.options
        sampling = {"temperature": temperature, "max_tokens": max_tokens}
        return ModelConfig(model=model, base_url=base_url, regime=o.regime,
                           max_requests=o.max_requests, max_invalid_turns=o.max_invalid_turns,
                           max_total_tokens=o.max_total_tokens,
                           **{k: v for k, v in sampling.items() if v is not None})

    def run_config(self, model: str, tasks: tuple[str, ...] | None = None,
                   seeds: tuple[int, ...] | None = None) -> RunConfig:
        """The arm's `RunConfig` (`eval.models.arm.run_config`: its policy's name, its guard
        for the regime) on this split and these tasks (all of the set's by default)."""
        o = self.options
        arm = run_config(self.model_config(model), "public", "all", o.seeds, o.probe)
        return dataclasses.replace(arm, split=o.split, master_seed=self.master_seed,
                                   tasks=self.tasks if tasks is None else tasks,
                                   seeds=arm.seeds if seeds is None else seeds)

    def prompts(self, case: Case) -> tuple[str, str]:
        """(system prompt, first user message) of a case, as the arm sends them."""
        brief = brief_for(self.corpus.task(case.task_id), case.seed, self.options.probe)
        return system_prompt(self.options.regime), brief_message(brief)


def read_master_seed(path: str) -> int:
    """A master seed file's seed, read and checked as `eval verify` reads it."""
    return master_seed(argparse.Namespace(master_seed=None, master_seed_file=path))


def id_key(corpus: Corpus, seed: int | None) -> bytes:
    """The key of a split's case ids: its fingerprint's, or its master seed's."""
    if seed is not None:
        return hmac.new(seed.to_bytes(32, "big"), b"finality-gym-env case ids",
                        hashlib.sha256).digest()
    return hashlib.sha256(b"finality-gym-env case ids\0" + corpus.fingerprint.encode()).digest()


def opaque_id(key: bytes, task_id: str, seed: int) -> str:
    return "case-" + hmac.new(key, f"{task_id}\0{seed}".encode(), hashlib.sha256).hexdigest()[:20]


def order_key(key: bytes, task_id: str) -> bytes:
    """Where a task's cases stand in the taskset: an HMAC of its id under the ids' key."""
    return hmac.new(key, b"taskset order\0" + task_id.encode(), hashlib.sha256).digest()


@functools.lru_cache(maxsize=16)
def case_set(options: Options) -> CaseSet:
    """The cases the options declare (see the module's docstring); made once a process for
    each options (every task of a taskset carries its options)."""
    seed = None
    if options.split == PRIVATE:
        seed = read_master_seed(options.master_seed_file)
        corpus = private_corpus(seed)
    else:
        corpus = load_corpus(options.split)
    ids = (stratified_subset(corpus) if options.subset == "stratified"
           else tuple(t.task_id for t in corpus.tasks))
    if options.archetypes is not None:
        known = {t.archetype for t in corpus.tasks}
        unknown = sorted(set(options.archetypes) - known)
        if unknown:
            raise ValueError(f"archetypes: unknown {unknown}; valid: {', '.join(sorted(known))}")
        ids = tuple(t for t in ids if corpus.task(t).archetype in options.archetypes)
    ids = ids[:options.count] if options.count is not None else ids
    if not ids:
        raise ValueError(f"the options declare no case ({options.as_dict()})")
    key = id_key(corpus, seed)
    cases = tuple(Case(opaque_id(key, t, s), t, s)
                  for t in sorted(ids, key=lambda t: order_key(key, t))
                  for s in range(options.seeds))
    if len({c.id for c in cases}) != len(cases):
        raise RuntimeError("two cases share an id")  # 80 bits: never, but never silently
    return CaseSet(options, corpus, cases, ids, seed)


def play(cases: CaseSet, case: Case, model: str, base_url: str, api_key: str,
         temperature: float | None = None, max_tokens: int | None = None) -> dict:
    """One episode of the model at `base_url` (bearer `api_key`) on `case`, played and graded
    by the model arm's own code: its graded row. No preflight: a bad key or model fails the
    first request (`ConfigurationError`), and the run's sampling settings are the caller's."""
    config = cases.model_config(model, base_url, temperature, max_tokens)
    endpoint = Endpoint(config)
    endpoint.client = endpoint.client.with_options(api_key=api_key)  # the key is never in env
    try:
        policy = ModelPolicy(config, endpoint)
        return grade_row(policy, policy.name, cases.corpus.task(case.task_id), case.seed,
                         cases.run_config(model))
    finally:
        endpoint.client.close()


def reward(row: dict) -> float:
    """The reward of a graded row: `order_value / (order_value + gap)`, 1 at gap <= 0."""
    gap, value = row["gap"], row["order_value"]
    return 1.0 if gap <= 0 else value / (value + gap)


def metrics(row: dict) -> dict[str, float]:
    return {"exact": float(row["gap"] == 0), "premature": float(row["premature"]),
            "gap_usd": row["gap"] / 100, "money_loss": float(row["label"] in MONEY_LOSS),
            "revenue_loss": float(row["label"] in REVENUE_LOSS)}


# ------------------------------------------------------------------ the replay of a logged run
def canonical(message: dict) -> dict:
    """A message as both the arm and a verifiers trace hold it: role, content (None for an
    empty one), each tool call's id, name and arguments (as text), a tool result's call id."""
    out = {"role": message.get("role"), "content": message.get("content") or None}
    if message.get("role") == "tool":
        out["tool_call_id"] = message.get("tool_call_id")
    calls = []
    for call in message.get("tool_calls") or ():
        function = call.get("function") or call
        arguments = function.get("arguments")
        calls.append((call.get("id"), function.get("name"),
                      arguments if isinstance(arguments, str) or arguments is None
                      else json.dumps(arguments)))
    if calls:
        out["tool_calls"] = calls
    return out


@dataclass
class Turn:
    """One logged model reply: the assistant message, its usage (as the provider reported it:
    prompt tokens with the cached ones), and the failed attempts before it."""

    message: dict
    usage: dict
    attempts: int = 1
    model: str | None = None
    finish_reason: str | None = None


class LoggedChat:
    """A `ChatEndpoint` that answers the arm's policy with a logged conversation's replies, in
    order, checking that each request's conversation is the logged one up to that reply. A
    request past the last reply is the context overflow that ended the case if `overflowed`
    (the log's last exchange failed), else a refusal; the messages it adds after the logged
    ones (the last reply's tool results, which a failed exchange does not record) are the
    policy's own. `requests`: the lengths of the requests answered and overflowed; `fields`: what
    the policy's requests carry besides the model, the messages and the tools."""

    params: dict = {}

    def __init__(self, messages: list[dict], turns: list[Turn], overflowed: bool):
        self.messages, self.turns, self.overflowed = messages, turns, overflowed
        self.answered = 0
        self.consumed = 0  # logged messages the requests and replies have matched
        self.requests, self.fields = Requests(), {}

    def complete(self, request: dict, rng: random.Random, *,
                 room: int | None = None) -> tuple[dict, float, int, list]:
        sent = request["messages"]
        self.fields = {k: v for k, v in request.items() if k not in ("model", "messages", "tools")}
        for number, (message, logged) in enumerate(zip(sent, self.messages)):
            if canonical(logged) != canonical(message):
                raise ValueError(f"message {number} of request {self.answered} is not the logged "
                                 f"one (the case sends {_short(canonical(message))}, the log has "
                                 f"{_short(canonical(logged))})")
        if self.answered == len(self.turns):
            # A failed request commits nothing of itself: what it added after the last reply
            # (that reply's tool results) is not in the log, and is the policy's own.
            if self.overflowed and len(sent) >= len(self.messages):
                self.consumed = len(self.messages)
                self.requests.asked(sent, overflowed=True)
                raise ContextOverflow("the logged conversation ends in a failed request")
            raise ValueError(f"the case asks for reply {self.answered + 1} where the log has "
                             f"{len(self.turns)}")
        if len(sent) >= len(self.messages) or self.messages[len(sent)].get("role") != "assistant":
            raise ValueError(f"request {self.answered} does not end where the log's reply "
                             f"{self.answered + 1} follows")
        turn = self.turns[self.answered]
        self.requests.asked(sent, overflowed=False)
        self.answered += 1
        self.consumed = len(sent) + 1
        body = {"model": turn.model, "usage": turn.usage,
                "choices": [{"finish_reason": turn.finish_reason, "message": turn.message}]}
        return body, 0.0, turn.attempts, ["a failed attempt"] * (turn.attempts - 1)


def replay(cases: CaseSet, case: Case, model: str, messages: list[dict], turns: list[Turn],
           overflowed: bool = False) -> tuple[dict, LoggedChat]:
    """The row a logged conversation gives, and the chat that answered it (its `requests` and
    `fields`): its replies played again by the arm's policy, which must send exactly the logged
    messages; ValueError where it does not."""
    chat = LoggedChat(messages, turns, overflowed)
    config = cases.model_config(model)
    policy = ModelPolicy(config, chat)
    try:
        row = grade_row(policy, policy.name, cases.corpus.task(case.task_id), case.seed,
                        cases.run_config(model))
    except ConfigurationError as exc:
        raise ValueError(f"its conversation does not play ({exc})") from None
    if chat.answered != len(turns) or chat.consumed != len(messages):
        raise ValueError(f"the case ended after {chat.answered} of the log's {len(turns)} "
                         f"replies ({chat.consumed} of its {len(messages)} messages): the log "
                         "holds messages the case never sent")
    return json.loads(json.dumps(row)), chat


def _short(value, limit: int = 160) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= limit else text[:limit] + "..."
