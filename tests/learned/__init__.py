"""The learned-model loaders (`agents/learned/`): SB3 archives read as data, VecNormalize,
ONNX graphs, the shipped models and the model bounds. `sb3_reference.py`: SB3's own
evaluation loop, the reference the loaders are held to."""
