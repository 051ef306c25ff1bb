"""The language-model arm (`agents/model/`, `eval/models/`): the endpoint protocol, replies,
limits, the inspect_ai task and its verified import. `chat_server.py` (with `chat_script.py`
and `chat_http.py`) is a real HTTP server on 127.0.0.1 speaking Chat Completions, also used by
the board's and the site's tests; `hostile_replies.py` edits its replies into hostile ones and
`model_client.py` holds the arm's client fixtures."""
