"""Learned policies, loaded as data: a saved stable-baselines3 model (`sb3:`, `ppo:`) and a
policy network as an ONNX graph (`onnx:`), both run over `Finality-v0`'s observations.

`policy.py` plays a model as `finality_gym.policy.GymPolicy` and loads SB3 archives (`load_sb3`); `sb3_archive.py` reads
an SB3 archive without running its pickles; `vecnormalize.py` reads a `vecnormalize.pkl` as data;
`onnx_policy.py` checks and runs an ONNX graph; `algorithms.py` names the algorithms a spec may
grade; `trained_for.py` owns what a model says it was trained for (env id, probe arm, layouts),
written by `train/` and checked before a model is graded.

What it may import: the standard library, numpy, gymnasium and `finality_gym`; torch,
stable-baselines3 and onnxruntime only inside the functions that need them, so that the grader,
`python -m train export` and an outside policy that loads a model import this room without
them. Nothing else of `agents/`. What imports it: the factory (the `sb3:`, `ppo:` and `onnx:`
specs, and the arm check of `trained_for`), the grader and the board (`vecnormalize`,
`sb3_archive`; the board `trained_for` too), `train/` (the algorithms, export, `trained_for`'s
stamp) and the benchmarks of learned policies. This file imports nothing, so importing one
loader imports only what it needs.
"""
