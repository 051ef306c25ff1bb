"""The leaderboard: submissions as bundles, graded again by the operator, ranked on one page.

`bundle` (the bundle file: the one module that writes and reads it), `submit` (`python -m eval
submit`: a policy as a bundle), `loading` (a bundle's policy loaded in the safe form), `verify`
(`python -m eval verify`: bundles graded on the private and public splits into a board),
`provenance` (the grader's version, the form each kind is graded in), `standings` (a board's
groups, ranks, intervals and pairwise comparisons, computed from its rows) and `page` (`python
-m eval leaderboard`: the standings as a static page, with the public episodes' site).
The operator's guide is docs/trust.md, "Running a leaderboard".

May import: grading, stats, reports, models (a model entry is graded as the model arm grades),
sweeps (the machine's provenance) and site (the public episodes' site). No other room imports
it.
"""
