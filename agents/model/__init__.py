"""A language model as a policy: a chat model behind an OpenAI-compatible Chat Completions
endpoint acts through tool calls, one case per conversation.

What the model sees (`prompt`): the system prompt of `agents/model/system.md` (the rules the
agent is told; it names no tool to prefer; a regime of more or less authority adds a written
procedure, `procedure.md`, and says it is enforced, `guarded.md`), a first user message with the case brief as JSON
(never the seed), the twelve tools of `finality_gym.tools.TOOL_TABLE`, and each tool result as
JSON. Each module's docstring says the rules of its part:

- `policy`: the conversation (`ModelPolicy`): invalid calls answered and counted, reminders,
  the caps of an episode, a context overflow as a lapse, the transcript and its replay;
- `endpoint`: what the policy asks of an endpoint (`ChatEndpoint`) and the Chat Completions
  endpoint over HTTP (`Endpoint`): retries, backoff, the preflight and what it learns;
- `guard`: each attempt's wall-clock deadline and byte cap, enforced on the connections;
- `replies`: every reply checked before it is believed, and whose failure it is when it is
  not readable (the endpoint's) or carries an invalid call (the model's);
- `errors`: the failures and whose they are; `config`: what a model run is (`ModelConfig`);
  `budget`: what a run may spend (`Budget`).

What it may import: the standard library and `finality_gym` (the tools, the interface), nothing
else of `agents/`; no LLM SDK (the endpoint speaks HTTP itself). What imports it: `eval/`'s model
arm (`eval/models/`, `python -m eval model`, the inspect_ai task), the board's loading and the
site's transcripts, and `benchmarks/model_harness.py`. The names below are the package's
surface: `from agents.model import X` for any of them.
"""

from .budget import Budget
from .config import (DEFAULT_MAX_RESPONSE_BYTES, DEFAULT_MAX_TRANSCRIPT_BYTES, OWN_FIELDS,
                     ModelConfig)
from .endpoint import REPLACEMENTS, TRANSIENT_STATUS, ChatEndpoint, Endpoint, refused_field
from .errors import (BudgetSpent, ConfigurationError, ContextOverflow, InfrastructureError,
                     UnreadableReply, context_overflow)
from .policy import OUTPUT_ONLY, ModelPolicy, returned
from .prompt import (PREFLIGHT, PROMPT_FILE, REGIMES, REMINDER, brief_message, prompt_hash,
                     result_content, system_prompt)
from .replies import (MAX_ARGUMENT_BYTES, MAX_ARGUMENT_DEPTH, MAX_BODY_DEPTH, MAX_TOOL_NAME,
                      MAX_USAGE, check_reply, json_depth, parse_arguments, parse_call, read_body,
                      usage_of)

__all__ = [
    "Budget", "BudgetSpent", "ChatEndpoint", "ConfigurationError", "ContextOverflow",
    "DEFAULT_MAX_RESPONSE_BYTES", "DEFAULT_MAX_TRANSCRIPT_BYTES", "Endpoint", "InfrastructureError",
    "MAX_ARGUMENT_BYTES", "MAX_ARGUMENT_DEPTH", "MAX_BODY_DEPTH", "MAX_TOOL_NAME", "MAX_USAGE",
    "ModelConfig", "ModelPolicy", "OUTPUT_ONLY", "OWN_FIELDS", "PREFLIGHT", "PROMPT_FILE",
    "REGIMES", "REMINDER", "REPLACEMENTS", "TRANSIENT_STATUS", "UnreadableReply", "brief_message",
    "check_reply", "context_overflow", "json_depth", "parse_arguments", "parse_call",
    "prompt_hash", "read_body", "refused_field", "result_content", "returned", "system_prompt",
    "usage_of",
]
