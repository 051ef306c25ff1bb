"""The model arm: a language model acting through tool calls. `arm` (grade a model beside the
scripted policies: the run, its costs and report), `command` (`python -m eval model`), `regimes`
(the authority curve: one model under the open, procedure and guarded regimes), `inspect_task`
(the same conversation as an inspect_ai task; `eval/inspect_task.py` is the file `inspect eval`
loads) and `import_inspect` (an inspect log, replayed and checked, as a results folder),
`verifiers_cases` (the benchmark as a `verifiers` environment: its cases, episode, reward and
metrics, importing no verifiers) and `import_verifiers` (a vf-eval run, replayed and checked),
with `import_checks` (the rules both imports share: values compared as JSON, one context window
an endpoint).
`hub/` is not a package of this room: it is the `verifiers` environment's own small project
(`finality_gym_env`, id `finality-gym-env`), installed into `.venv-verifiers` by `make
verifiers`, a thin adapter over `verifiers_cases`.

May import: finality_gym, agents, eval.grading, eval.stats, eval.reports (`tests/test_layout.py`
checks it).
"""
