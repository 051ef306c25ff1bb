"""PPO baselines on `Finality-v0`, graded by the shared grader (`python -m train ...`)."""
