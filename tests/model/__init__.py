"""The language-model arm (`agents/model/`, `eval/models/`): the endpoint protocol, replies,
limits, the inspect_ai task and its verified import. The chat server helpers (`chat_*.py`,
`hostile_replies.py`, `model_client.py`) are a real HTTP server on 127.0.0.1."""
