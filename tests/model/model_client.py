"""The model arm's client set up against the scripted chat server (`tests/model/chat_server.py`), as
every model test sets it up: the key the server takes in the environment (`key`, an autouse
fixture a test module imports), a config with a fast retry schedule (`config`), and the command
line against a server (`arm`). A test helper, not a test module."""

from __future__ import annotations

import pytest

from agents.model import ModelConfig
from eval.__main__ import main

# A generous timeout (a loaded CI machine must never time a request out where a test counts
# retries); a test that needs a short one sets its own.
FAST = dict(timeout_s=30.0, backoff_s=0.001, backoff_max_s=0.01)


@pytest.fixture(autouse=True)
def key(monkeypatch):
    monkeypatch.setenv("TEST_KEY", "test-key")
    monkeypatch.setenv("FINALITY_NO_PROGRESS", "1")


def config(server, **kw) -> ModelConfig:
    return ModelConfig(model="scripted-model", base_url=server.base_url, api_key_env="TEST_KEY",
                       **{**FAST, **kw})


def arm(server, out, *more) -> int:
    """`python -m eval model` against `server` in this process, writing to `out`: its exit
    code."""
    return main(["model", "--model", "scripted-model", "--base-url", server.base_url,
                 "--api-key-env", "TEST_KEY", "--out", str(out), *more])
