"""Reports: `format` (money, shares, intervals and names as the reports write them: the one
place a number becomes text), `report` (the headline's tables and report.md) and `figures`
(matplotlib, headless).

May import: finality_gym, agents, eval.grading, eval.stats (`tests/test_layout.py` checks it).
"""
