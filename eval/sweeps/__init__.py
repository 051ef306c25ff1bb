"""A learned policy across training seeds: `aggregate` (a sweep's summary.json, report.md and
seeds.png from its seeds' graded runs), `versus` (two sweeps of one probe arm, paired),
`baselines` (every arm's learned baseline, one table for the README) and `provenance` (the
machine a seed trained on).

May import: finality_gym, agents, eval.grading, eval.stats, eval.reports. `train` imports this
room to aggregate what it trained (`tests/test_layout.py` checks it).
"""
