"""The private Grid Engine cell the sge tests run against (plugins/sge/cell.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def sge_cell():
    """One private Grid Engine cell per test process (xdist worker), started on first use.

    Tests that change it (a queue disabled, the qmaster stopped, a job limit) ask for ``sge``
    instead, which puts it back first. A missing Grid Engine package, or a cell that does not
    start, fails the test, never skips.
    """
    from gridgate.plugins.sge.cell import CellError, SgeCell, missing_programs

    missing = missing_programs()
    if missing:
        pytest.fail(
            f"the sge tests need the Debian packages {' '.join(missing)} "
            "(bash dev.sh test installs them)",
            pytrace=False,
        )
    cell = SgeCell()
    try:
        cell.start()
    except CellError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield cell
    finally:
        cell.stop()


@pytest.fixture
def sge(sge_cell):
    """The session's cell, healthy: qmaster and execd running, every queue enabled, no access
    list or job limit, no job left."""
    from gridgate.plugins.sge.cell import CellError

    try:
        sge_cell.reset()
    except CellError as exc:
        pytest.fail(f"the private Grid Engine cell could not be put back: {exc}", pytrace=False)
    return sge_cell
