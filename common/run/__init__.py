"""The run plumbing both scripts share: Run (run.py) and, for several ranks, RankedRun
(ranks.py)."""

from .run import Run

__all__ = ["Run"]
