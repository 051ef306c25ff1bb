"""The grading core: every policy through one runner into one results folder.

`grader` (RunConfig, the jobs, the workers), `runfolder` (the only module that writes and reads
a results or training folder: lock, rows, seal, manifest), `distributed` (the Ray backend),
`labels` (what kind of mistake an episode made), `options` (the options every grading command
shares) and `master_seed` (the private split's seed: made by `keygen`, read by the commands).

May import: finality_gym, agents. Nothing else of eval: every other room of eval builds on this
one (`tests/test_layout.py` checks it).
"""
