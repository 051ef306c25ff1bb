"""Statistics of graded rows: `bootstrap` (intervals over independent units, paired differences,
the seed-by-unit resampling of sweeps, pass^k, win shares) and `summary` (a run's rows to the
per-policy `summary.json`, and the one rule for the best scripted baseline).

May import: finality_gym, agents, eval.grading. Writes no text: the reports format what it
computes (`tests/test_layout.py` checks the imports).
"""
