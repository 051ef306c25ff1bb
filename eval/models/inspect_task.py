"""The benchmark as an inspect_ai task: any model inspect can reach, graded by this engine.

    inspect eval eval/inspect_task.py --model PROVIDER/MODEL \\
        [-T split=public] [-T subset=stratified|all] [-T seeds=1] [-T probe=full] \\
        [-T max_requests=80] [-T max_invalid_turns=8] [-T max_total_tokens=N]
    python -m eval import-inspect LOG --out DIR      # the log as a model-arm results folder

One sample per (task, seed) of the model arm's cases (`eval.models.arm.stratified_subset`, 48 tasks,
by default). inspect's `--epochs N` plays each sample N times, each epoch on a seed of its own
(`episode_seed`: epoch e of seed s plays s + (e - 1) x seeds, so with `-T seeds=1` epoch k plays
seed k - 1), never the same episode twice; task version 1 (version 0 played every epoch on the
sample's seed). The conversation is the model arm's own: `agents.model.ModelPolicy` runs it (the
same system prompt, brief, twelve tools, tool results, reminders, invalid-call answers and caps),
and only the request goes through inspect: each turn it asks inspect's model (the provider given by
`--model`: OpenAI, Anthropic, Google, Bedrock, vLLM, Ollama, ...) with the same messages and tools.
The assistant messages go back to inspect as inspect returned them, so a provider's own fields
(reasoning blocks, signatures) survive. The episode is played by the engine in a worker thread, the
model asked in the sample's event loop.

Each sample is scored with the engine's record: `gap` (dollars) and `exact`, the disposition as
the answer, the failure label as the explanation, and the whole graded row (the record, the
loss breakdown, the model's requests and tokens, the calls) as metadata, which `python -m eval
import-inspect` turns into a results folder the shared grader's statistics apply to. The import
believes none of it: it plays each logged conversation again through this module's own code
(`replay_conversation`: the same parsing of tool calls, invalid-call answers, reminders and
caps) and keeps a row only where it is what the conversation gives.

Where inspect differs from the model arm (said in docs/model-arm.md): inspect parses a tool
call's arguments itself and recovers some that the arm refuses (YAML for a non-object, such as
a bare `60` for `wait`, becomes `{"ticks": 60}`; stray quotes after an object are dropped); a
call it cannot parse is answered as invalid, as in the arm. inspect's tool schema has no
`minimum`, so `wait`'s `ticks >= 1` is in its description only (the engine still refuses 0).
inspect retries transient errors itself (`--max-retries`); a sample it gives up on is an error
in the log, never a scored episode. Its model name is what `--model` says, not what the server
reports.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import json

from inspect_ai import Task
from inspect_ai.dataset import Sample
from inspect_ai.model import (ChatMessageSystem, ChatMessageTool, ChatMessageUser,
                              get_model)
from inspect_ai.scorer import Score, mean, scorer, stderr
from inspect_ai.solver import solver
from inspect_ai.tool import ToolInfo, ToolParam, ToolParams

from agents import brief_for
from agents.model import ChatEndpoint, ContextOverflow, ModelConfig, ModelPolicy, brief_message
from finality_gym import PROBE_ARMS, load_corpus
from finality_gym.tools import TOOL_TABLE

from eval.grading.grader import RunConfig, grade_row
from eval.models.arm import stratified_subset
from eval.models.import_checks import Requests



def tool_infos() -> list[ToolInfo]:
    """`finality_gym.tools.TOOL_TABLE` in inspect's terms (its schema has no `minimum`)."""
    infos = []
    for spec in TOOL_TABLE:
        schema = spec["parameters"]
        properties = {name: ToolParam(**{k: v for k, v in prop.items() if k != "minimum"})
                      for name, prop in schema["properties"].items()}
        infos.append(ToolInfo(name=spec["name"], description=spec["description"],
                              parameters=ToolParams(properties=properties,
                                                    required=schema.get("required", []))))
    return infos


class InspectEndpoint(ChatEndpoint):
    """What `ModelPolicy` asks of an endpoint (`agents.model.ChatEndpoint`), answered by
    inspect's model: the policy runs in a worker thread, the model's `generate` in the sample's
    event loop and context (so inspect records it in the sample's transcript). Its replies come
    whole, and a case here keeps no transcript, so `room` is not read."""

    params: dict = {}  # the sampling settings are inspect's (--temperature, --max-tokens, ...)

    def __init__(self, model, loop: asyncio.AbstractEventLoop):
        self.model, self.loop = model, loop
        self.messages: list = []   # what inspect is sent, parallel to the policy's messages
        self.replies: list = []    # inspect's assistant messages, sent back as they came
        self.functions: dict[str, str] = {}  # tool call id -> tool name
        self.placed = 0            # replies already among `messages`
        self.tools = tool_infos()

    def complete(self, request: dict, rng, *,
                 room: int | None = None) -> tuple[dict, float, int, list]:
        self.place(request["messages"])
        output = self._run(self.model.generate(list(self.messages), tools=self.tools,
                                               tool_choice="auto"))
        if output.stop_reason == "model_length" and not output.message.tool_calls:
            raise ContextOverflow("the conversation outgrew the model's context (inspect's stop "
                                  "reason model_length)")
        return self.answer(output.message, output.usage, output.model, output.stop_reason,
                           output.time)

    def place(self, messages: list[dict]) -> None:
        """The policy's messages not yet among `messages`, in inspect's terms: its assistant
        messages are inspect's replies, as they came."""
        for message in messages[len(self.messages):]:
            role = message["role"]
            if role == "assistant":
                self.messages.append(self.replies[self.placed])
                self.placed += 1
            elif role == "tool":
                self.messages.append(ChatMessageTool(
                    content=message["content"], tool_call_id=message["tool_call_id"],
                    function=self.functions.get(message["tool_call_id"])))
            elif role == "system":
                self.messages.append(ChatMessageSystem(content=message["content"]))
            else:
                self.messages.append(ChatMessageUser(content=message["content"]))

    def answer(self, message, usage=None, model: str | None = None, stop_reason=None,
               seconds: float | None = None) -> tuple[dict, float, int, list]:
        """Inspect's assistant message as the Chat Completions body `ModelPolicy` reads: each
        tool call with its arguments as inspect parsed them (JSON), or as unparsed (an invalid
        call) where inspect could not parse them."""
        self.replies.append(message)
        calls = []
        for call in message.tool_calls or []:
            self.functions[call.id] = call.function
            arguments = (json.dumps(call.arguments) if call.parse_error is None
                         else f"<not parsed: {call.parse_error}>")
            calls.append({"id": call.id, "type": "function",
                          "function": {"name": call.function, "arguments": arguments}})
        body = {"model": model, "usage": {} if usage is None else {
                    "prompt_tokens": usage.input_tokens,
                    "completion_tokens": usage.output_tokens,
                    "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
                    "prompt_tokens_details": {"cached_tokens": usage.input_tokens_cache_read}},
                "choices": [{"finish_reason": stop_reason, "message": {
                    "role": "assistant", "content": message.text or None,
                    **({"tool_calls": calls} if calls else {})}}]}
        return body, float(seconds or 0.0), 1, []

    def conversation(self) -> list:
        """The whole conversation as inspect keeps it: every message sent, then the replies
        not sent back (the last one, unless the case ended in asking for another)."""
        return list(self.messages) + self.replies[self.placed:]

    def _run(self, coroutine):
        """Run `coroutine` in the sample's loop, in a copy of this thread's context (which
        `asyncio.to_thread` copied from the sample's), and wait for it here."""
        done: concurrent.futures.Future = concurrent.futures.Future()
        context = contextvars.copy_context()

        def start() -> None:
            running = self.loop.create_task(coroutine, context=context)

            def finish(t: asyncio.Task) -> None:
                if t.cancelled():
                    done.cancel()
                elif t.exception() is not None:
                    done.set_exception(t.exception())
                else:
                    done.set_result(t.result())
            running.add_done_callback(finish)

        self.loop.call_soon_threadsafe(start)
        return done.result()


class LoggedEndpoint(InspectEndpoint):
    """A logged conversation's replies answered again, in order, to the task's own conversation
    (`python -m eval import-inspect`): what the task made of them is then made again by the same
    code. A request past the last logged reply is the context overflow that ended the case (a
    completed sample ends only by the case's end, a cap, or that). The episode's tokens, which
    a conversation does not hold, are counted at its last reply (`usage`): only their totals
    decide a row (the token cap is checked before each request)."""

    def __init__(self, replies: list, usage=None):
        super().__init__(None, None)
        self.logged = list(replies)
        self.usage = usage
        self.requests = Requests()  # the lengths of the requests answered, and overflowed

    def complete(self, request: dict, rng, *,
                 room: int | None = None) -> tuple[dict, float, int, list]:
        self.place(request["messages"])
        turn = len(self.replies)
        self.requests.asked(request["messages"], overflowed=turn == len(self.logged))
        if turn == len(self.logged):
            raise ContextOverflow("the logged conversation ends where the case asks for another "
                                  "reply")
        return self.answer(self.logged[turn],
                           self.usage if turn == len(self.logged) - 1 else None)


def play_case(endpoint: InspectEndpoint, model: str, split: str, task_id: str, seed: int,
              probe: str, max_requests: int = 80, max_invalid_turns: int = 8,
              max_total_tokens: int | None = None) -> dict:
    """One case played by the model arm's policy through `endpoint`: its graded row."""
    config = ModelConfig(model=model, base_url="http://inspect.invalid",
                         max_requests=max_requests, max_invalid_turns=max_invalid_turns,
                         max_total_tokens=max_total_tokens)
    policy = ModelPolicy(config, endpoint)
    run = RunConfig((policy.name,), split=split, seeds=(seed,), probe=probe)
    return grade_row(policy, policy.name, load_corpus(split).task(task_id), seed, run)


def replay_conversation(messages: list, model: str, split: str, task_id: str, seed: int,
                        probe: str, caps: dict, usage=None) -> tuple[dict, list, Requests]:
    """A logged sample's conversation played again by the task: its assistant messages are the
    model's replies, in order; returns the graded row they give, the conversation the task
    keeps for them (`state.messages`), for the log's to be compared with, and the lengths of the
    requests it asked (`eval.models.import_checks.check_overflows` compares them across a log)."""
    endpoint = LoggedEndpoint([m for m in messages if m.role == "assistant"], usage)
    row = play_case(endpoint, model, split, task_id, seed, probe, **caps)
    return row, endpoint.conversation(), endpoint.requests


def episode_seed(seed: int, epoch: int, seeds: int) -> int:
    """The engine seed that epoch `epoch` (from 1) of a sample plays: the sample's own seed in
    epoch 1, and `(epoch - 1) * seeds` more in a later one, so `--epochs N` plays N x `seeds`
    distinct seeds (with `seeds=1`, epoch k plays seed k - 1), never one episode twice."""
    return seed + (epoch - 1) * seeds


CAPS = ("max_requests", "max_invalid_turns", "max_total_tokens")


def _count(name: str, value, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None
    if number < 1:
        raise ValueError(f"{name} must be >= 1, got {number}")
    return number


def task_arguments(split: str = "public", subset: str = "stratified", seeds: int = 1,
                   probe: str = "full", max_requests: int = 80, max_invalid_turns: int = 8,
                   max_total_tokens: int | None = None) -> dict:
    """The task's arguments, checked, as it uses them (`finality`; `python -m eval
    import-inspect` reads them back from a log's `task_args`)."""
    if not isinstance(split, str):
        raise ValueError(f"split must be a split's name, got {split!r}")
    if subset not in ("stratified", "all"):
        raise ValueError(f"subset must be 'stratified' or 'all', got {subset!r}")
    if probe not in PROBE_ARMS:
        raise ValueError(f"probe: unknown arm {probe!r}; valid: {', '.join(PROBE_ARMS)}")
    return {"split": split, "subset": subset, "seeds": _count("seeds", seeds), "probe": probe,
            "max_requests": _count("max_requests", max_requests),
            "max_invalid_turns": _count("max_invalid_turns", max_invalid_turns),
            "max_total_tokens": _count("max_total_tokens", max_total_tokens, optional=True)}


def dataset(args: dict) -> list[Sample]:
    """The task's samples for its checked arguments (`task_arguments`): one per (task, seed),
    task by task in corpus order, seeds 0 .. seeds - 1 within each."""
    split, probe = args["split"], args["probe"]
    corpus = load_corpus(split)
    ids = stratified_subset(split) if args["subset"] == "stratified" else [
        t.task_id for t in corpus.tasks]
    return [Sample(input=brief_message(brief_for(corpus.task(task_id), seed, probe)),
                   id=f"{task_id}__seed{seed}",
                   metadata={"split": split, "task_id": task_id, "seed": seed, "probe": probe})
            for task_id in ids for seed in range(args["seeds"])]


@solver
def finality_agent(max_requests: int = 80, max_invalid_turns: int = 8,
                   max_total_tokens: int | None = None, seeds: int = 1):
    """Play the sample's case (epoch e: `episode_seed`) with the model arm's conversation; keep
    the graded row."""

    async def solve(state, generate):
        meta = state.metadata
        endpoint = InspectEndpoint(get_model(), asyncio.get_running_loop())
        state.metadata["row"] = await asyncio.to_thread(
            play_case, endpoint, endpoint.model.name, meta["split"], meta["task_id"],
            episode_seed(meta["seed"], state.epoch, seeds), meta["probe"], max_requests,
            max_invalid_turns, max_total_tokens)
        state.messages = endpoint.conversation()
        state.completed = True
        return state

    return solve


@scorer(metrics={"gap": [mean(), stderr()], "exact": [mean()]})
def engine_record():
    """The engine's record of the episode: the gap in dollars and whether it is exact."""

    async def score(state, target) -> Score:
        row = state.metadata["row"]
        return Score(value={"gap": row["gap"] / 100, "exact": float(row["gap"] == 0)},
                     answer=row["disposition"], explanation=row["label"], metadata={"row": row})

    return score


# 1: epoch e of a sample plays seed `episode_seed` (0: every epoch played the sample's seed), and
# a case ended by a context overflow keeps its last reply once (0: twice).
VERSION = 1


def build_task(split: str = "public", subset: str = "stratified", seeds: int = 1,
             probe: str = "full", max_requests: int = 80, max_invalid_turns: int = 8,
             max_total_tokens: int | None = None) -> Task:
    """The model arm's cases as samples: one per (task, seed); the model sees the brief."""
    args = task_arguments(split, subset, seeds, probe, max_requests, max_invalid_turns,
                          max_total_tokens)
    return Task(dataset=dataset(args),
                solver=finality_agent(*(args[cap] for cap in CAPS), seeds=args["seeds"]),
                scorer=engine_record(), version=VERSION,
                metadata={k: args[k] for k in ("split", "subset", "seeds", "probe")})
