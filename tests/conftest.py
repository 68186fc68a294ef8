"""Session-wide test setup."""

import pytest

from tests.helpers import become_subreaper

become_subreaper()  # orphans of the scripts under test come to this process, where the tests can find them


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The Slurm tests first, in two xdist groups (the batch scripts' jobs, the sweeps): they mostly
    wait for their jobs, so under the README's -n 4 --dist loadgroup each group starts at once on a
    worker of its own and the rest of the suite runs on the other two beside them (under -n 2 the two
    groups would hold both workers for their minutes of waiting)."""
    for item in items:
        if item.path.name == "test_slurm.py":
            item.add_marker(pytest.mark.xdist_group("slurm-sweeps" if "sweep" in item.name else "slurm-jobs"))
    items.sort(key=lambda item: item.path.name != "test_slurm.py")  # stable: the order within each stays
