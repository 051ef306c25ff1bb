"""A language model as a policy (`ModelPolicy`): the conversation with the model, one case per
conversation, through its endpoint (`ChatEndpoint`).

The loop, for what real models do:
- A call with an unknown tool, arguments that are not a JSON object, or arguments the engine
  rejects (checked by the engine's own `check_call`, so the world never sees it) is answered to
  the model as `{"error": "invalid call: ..."}` and changes nothing in the world. Empty
  arguments (`""`, `null`) are the empty object: right for the ten tools without arguments,
  missing `ticks` or `key` for the other two. `"60"` and `60.0` are not integers.
- A reply with no tool call gets `REMINDER`.
- Several tool calls in one reply run in order until the case ends or one is invalid; every
  later call of that reply is answered as not executed, so every call id has an answer.
- Caps per episode: `max_requests` requests, `max_invalid_turns` replies that were invalid (a
  reply with no call, or with an invalid call), `max_total_tokens` tokens. Reaching one ends the
  case as a lapse (`GiveUp`), and the row's `agent_status` says which (`ok` otherwise).
- A conversation that outgrows the model's context (the endpoint's refusal in any of the forms
  of `context_overflow`) ends that case as a lapse too (`agent_status: "context_overflow"`):
  the model could not go on, the run does. Only at preflight, where the conversation is its
  shortest, is it a configuration error.

Every request and response goes to the episode's transcript (given by the harness: the model
arm's `eval.models.arm.Transcript` keeps it in a file), with usage, latency, attempts and the
served model's name. A re-run replays the recorded responses, turn by turn while the request is
the one recorded, before it goes live: an interrupted episode never pays for a turn twice.
"""

from __future__ import annotations

import hashlib
import json
import random

from finality_gym import InvalidCall
from finality_gym.policy import Brief, GiveUp, Policy
from finality_gym.tools import chat_tools

from .budget import Budget
from .config import ModelConfig
from .endpoint import ChatEndpoint, Endpoint
from .errors import ContextOverflow, InfrastructureError, UnreadableReply
from .prompt import REMINDER, brief_message, result_content, system_prompt
from .replies import check_reply, parse_call


class ModelPolicy(Policy):
    """One model over one endpoint (`Endpoint`, made from the config, unless another is
    given). `transcript`, set per episode by the harness, is anything with
    `recorded(turn, request_sha) -> line | None` (a turn to replay) and `append(line)`, and
    optionally `room()`, the bytes it has left."""

    def __init__(self, config: ModelConfig, endpoint: ChatEndpoint | None = None,
                 transcript=None, budget: Budget | None = None):
        self.config = config
        self.name = f"model:{config.model}"
        self.endpoint = endpoint
        self.transcript = transcript
        self.budget = budget

    def reset(self, brief: Brief) -> None:
        super().reset(brief)
        if self.budget is not None:
            self.budget.check()
        self.counts = {"requests": 0, "replayed": 0, "retries": 0, "invalid_turns": 0,
                       "tokens_in": 0, "tokens_out": 0, "tokens_reasoning": 0,
                       "tokens_cached": 0, "cost_microusd": 0}
        self.status = "ok"
        self._sent = 0  # messages already sent in an earlier request
        self._rng = random.Random(brief.seed)

    def stats(self) -> dict:
        return {**self.counts, "agent_status": self.status}

    def plan(self):
        messages = [{"role": "system", "content": system_prompt(self.config.regime)},
                    {"role": "user", "content": brief_message(self.brief)}]
        while True:
            message = self._chat(messages)
            calls = message.get("tool_calls") or []
            messages.append(returned(message))
            if not calls:
                self._invalid_turn()
                messages.append({"role": "user", "content": REMINDER})
                continue
            stop = None
            for call in calls:
                if stop is not None:
                    answer = {"error": f"not executed: {stop}"}
                else:
                    try:
                        tool, args = parse_call(call)
                    except InvalidCall as exc:
                        answer = {"error": f"invalid call: {exc}; nothing happened"}
                        stop = "an earlier call in this reply was invalid"
                        self._invalid_turn(raise_now=False)
                    else:
                        answer = yield (tool, args)
                messages.append({"role": "tool", "tool_call_id": call.get("id") or "",
                                 "content": result_content(answer)})
            if stop is not None:
                self._check_invalid_cap()

    def _invalid_turn(self, raise_now: bool = True) -> None:
        self.counts["invalid_turns"] += 1
        if raise_now:
            self._check_invalid_cap()

    def _check_invalid_cap(self) -> None:
        if self.counts["invalid_turns"] >= self.config.max_invalid_turns:
            self._give_up("invalid_turn_cap")

    def _give_up(self, status: str):
        self.status = status
        raise GiveUp(status)

    def _chat(self, messages: list[dict]) -> dict:
        c = self.config
        if self.counts["requests"] >= c.max_requests:
            self._give_up("request_cap")
        if c.max_total_tokens is not None and (
                self.counts["tokens_in"] + self.counts["tokens_out"] >= c.max_total_tokens):
            self._give_up("token_cap")
        params = {"model": c.model, **(self.endpoint.params if self.endpoint is not None
                                       else c.request_params())}
        request = {**params, "messages": messages, "tools": chat_tools(), "tool_choice": "auto"}
        sha = hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()
        turn = self.counts["requests"]
        line = self.transcript.recorded(turn, sha) if self.transcript is not None else None
        if line is not None:
            usage = self._replayed(turn, line)
        else:
            line, usage = self._asked(request, params, messages, turn, sha)
        self._sent = len(messages)
        self.counts["requests"] += 1
        self.counts["retries"] += line["attempts"] - 1
        self.counts["tokens_in"] += usage["prompt_tokens"]
        self.counts["tokens_out"] += usage["completion_tokens"]
        self.counts["tokens_reasoning"] += usage.get("reasoning_tokens", 0)
        self.counts["tokens_cached"] += usage.get("cached_tokens", 0)
        self.counts["cost_microusd"] += c.cost(usage)
        return line["response"]["choices"][0]["message"]

    def _replayed(self, turn: int, line: dict) -> dict:
        """A turn of the transcript replayed: its reply checked again; its usage."""
        try:  # written before these checks, or edited: not believed unchecked either
            usage = check_reply(line.get("response"))
        except UnreadableReply as exc:
            raise InfrastructureError(
                f"turn {turn} of the episode's transcript holds an unreadable reply ({exc});"
                " move the transcript away to play the episode live") from None
        self.counts["replayed"] += 1
        return usage

    def _asked(self, request: dict, params: dict, messages: list[dict], turn: int,
               sha: str) -> tuple[dict, dict]:
        """A turn played live: the endpoint's reply, checked, as the transcript's line (appended
        to it) and its usage (added to the budget)."""
        if self.endpoint is None:
            self.endpoint = Endpoint(self.config)
        room = getattr(self.transcript, "room", None)
        room = room() if room is not None else None  # bytes the transcript has left
        try:
            body, latency, attempts, errors = self.endpoint.complete(request, self._rng,
                                                                     room=room)
        except ContextOverflow:
            self._give_up("context_overflow")
        try:  # `Endpoint` checked it already; another endpoint (inspect's) may not have
            usage = check_reply(body)
        except UnreadableReply as exc:
            raise InfrastructureError(f"unreadable reply ({exc})") from None
        line = {"turn": turn, "request_sha": sha, "new_messages": messages[self._sent:],
                "params": params, "response": body,
                "usage": usage,
                "latency_s": round(latency, 4), "attempts": attempts, "errors": errors,
                "served_model": body.get("model")}
        if self.transcript is not None:
            self.transcript.append(line)
        if self.budget is not None:
            self.budget.add(self.config.cost(usage))
        return line, usage


# Fields of an assistant message a provider documents as output only, never sent back:
# OpenAI's `annotations` (citations of its own tools), DeepSeek's `reasoning_content` (its API
# answers 400 to a request that carries it). Every other field goes back as the provider sent
# it: tool calls with their `extra_content` (Gemini's thought signatures, which it requires
# back), `reasoning_details` (OpenRouter's), `refusal`.
OUTPUT_ONLY = frozenset({"annotations", "reasoning_content"})


def returned(message: dict) -> dict:
    """The assistant message as the next request carries it: as the provider sent it, less
    `OUTPUT_ONLY` and an empty `tool_calls`."""
    back = {key: value for key, value in message.items()
            if key not in OUTPUT_ONLY and not (key == "tool_calls" and not value)}
    return {**back, "role": "assistant", "content": message.get("content")}
