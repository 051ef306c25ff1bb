"""The outside-policy sandbox (`agents/sandbox/`) and its red team: the protocol, isolation,
shared channels, leaks of the private split, import-once. `sandbox_harness.py` grades the
attacks of `redteam/` (policy files, not tests) through the command line."""
