"""Session-wide test setup."""

from tests.helpers import become_subreaper

become_subreaper()  # orphans of the scripts under test come to this process, where the tests can find them
