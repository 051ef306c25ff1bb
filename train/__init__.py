"""Learned baselines on `Finality-v0`: stable-baselines3 runs of any algorithm of `--algo`
(`run.py`, their recipe in `config.py`), sweeps of one recipe across training seeds
(`sweep.py`, `seed.py`, `ray_backend.py`), the search that picks an algorithm (`search.py`),
and offline RL: Minari datasets of the rules' decisions (`dataset.py`) and behaviour cloning
from them (`offline.py`), each graded by the shared grader (`python -m train ...`)."""
