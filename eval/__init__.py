"""The shared grader, its statistics, the experiments and their reports (`python -m eval ...`)."""
