"""The test suite, in rooms that mirror the code's (each room's `__init__` says what it tests).
Run from the repository root: `make test` (`pytest -n 2 --dist loadfile tests`)."""
