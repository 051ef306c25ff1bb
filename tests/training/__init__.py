"""Training (`train/`): PPO and the other algorithms, sweeps, the search, RL Zoo, the
baselines, versus and the memory arms."""
