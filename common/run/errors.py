"""The exceptions that say how a run ends; Run.cli exits with the status each names."""


class FlagError(ValueError):
    """A flag the user must change, in one line that names it (nothing started): exit status 2."""


class RunError(RuntimeError):
    """A failure one line explains (unwritable disk, NaN weights, ...): exit status 1."""


class Finished(Exception):
    """Nothing left to do (a resumed run that had already finished): this message, exit status 0."""
