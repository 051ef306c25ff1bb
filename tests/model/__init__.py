"""The language-model arm (`agents/model/`, `eval/models/`): the endpoint protocol, replies,
limits, the regimes and the authority curve, the inspect_ai task and the `verifiers` environment
and their verified imports (`test_verifiers_env.py` runs only in `.venv-verifiers`, which `make
test` builds; `vf_traces.py` writes runs in vf-eval's format for the main venv's tests).
`chat_server.py` (with `chat_script.py` and `chat_http.py`) is a real HTTP server on 127.0.0.1
speaking Chat Completions, also used by the board's and the site's tests; `hostile_replies.py`
edits its replies into hostile ones and `model_client.py` holds the arm's client fixtures."""
