"""The exceptions that say how a run ends, and the exit status each gives (Run.cli):
FlagError 2 (nothing started), RunError 1 (one line, no traceback), Finished 0."""


class FlagError(ValueError):
    """A flag the user must change, in one line that names it: exit status 2."""


class RunError(RuntimeError):
    """A failure during the run that one line explains (unwritable disk, NaN weights, ...): exit
    status 1."""


class Finished(Exception):
    """Nothing left to do (a resumed run that had already finished): this message, exit status 0."""
