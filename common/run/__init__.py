"""The run plumbing both scripts share: Run (run.py), and RankedRun (ranks.py) for several ranks."""

from .run import Run as Run
