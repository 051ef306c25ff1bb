"""A model episode's transcript (`transcripts/TASK__seedSEED.jsonl` of a model arm's folder) as
its episode page shows it: every message once, marked by what it is, with each request's
tokens, latency and retries."""

from __future__ import annotations

import json
from pathlib import Path

from agents.model import REMINDER

from eval.grading.runfolder import json_lines


def conversation(data: bytes, path: Path) -> dict:
    """The transcript file's bytes (read from `path`) as the page shows them."""
    return _conversation(_transcript(data, path))


def _transcript(data: bytes, path: Path) -> list[dict]:
    """A transcript's complete lines (`model_arm.read_transcript`, of bytes read without
    following a link)."""
    lines = []
    for number, line in enumerate(json_lines(data), 1):
        try:
            lines.append(json.loads(line))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"{path}:{number} is not a transcript line ({exc})") from None
    return lines



def _conversation(transcript: list[dict]) -> dict:
    """A model episode's transcript (its lines) as the page shows it: the messages in order,
    each marked (`system`, `brief`, `assistant`, `result`, `invalid`, `not_executed`,
    `reminder`), with each request's tokens, latency and retries."""
    turns = []
    for line in transcript:
        messages = []
        for m in line.get("new_messages", []):
            kind = m.get("role", "?")
            if kind == "assistant":  # the previous reply, sent back: shown once, as the reply
                continue
            content = m.get("content")
            if kind == "user":
                kind = "reminder" if content == REMINDER else "brief"
            elif kind == "tool":
                text = content if isinstance(content, str) else json.dumps(content)
                kind = ("invalid" if '"invalid call:' in text else
                        "not_executed" if '"not executed:' in text else "result")
            messages.append({**m, "kind": kind})
        choices = (line.get("response") or {}).get("choices") or [{}]
        turns.append({"turn": line.get("turn"), "messages": messages,
                      "reply": choices[0].get("message"),
                      "finish": choices[0].get("finish_reason"),
                      "usage": line.get("usage"), "latency_s": line.get("latency_s"),
                      "attempts": line.get("attempts"), "errors": line.get("errors", []),
                      "params": line.get("params")})
    return {"turns": turns}

