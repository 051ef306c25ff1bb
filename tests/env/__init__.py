"""The world engine and `Finality-v0` (`finality_gym/`): corpus, timelines, faults, tools,
readings, the env's spaces and checkers, rendering, the scripted policies and the toolkits'
adapters. `strategies.py`: the Hypothesis strategies of tasks, seeds and calls."""
