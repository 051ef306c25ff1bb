"""The paper's experiments, each a `python -m eval` command resumable into its folder:
`headline` (the main job), `ablation`, `tuning`, `costs`, `plans`, `everything` (`all`: every
one of them into one folder) and `show` (one episode drawn as a timeline).

May import: finality_gym, agents, eval.grading, eval.stats, eval.reports; one experiment may
reuse another's folder or function (`everything` runs them all). Nothing imports this room but
`eval/__main__.py` (`tests/test_layout.py` checks it).
"""
