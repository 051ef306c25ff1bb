"""The model arm: a language model acting through tool calls. `arm` (grade a model beside the
scripted policies: the run, its costs and report), `command` (`python -m eval model`),
`inspect_task` (the same conversation as an inspect_ai task; `eval/inspect_task.py` is the file
`inspect eval` loads) and `import_inspect` (an inspect log, replayed and checked, as a results
folder).

May import: finality_gym, agents, eval.grading, eval.stats, eval.reports (`tests/test_layout.py`
checks it).
"""
