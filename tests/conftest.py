"""The strict-skip rule (tests/strict_skips.py): under CI or scripts/test.sh a skip for
something scripts/test.sh provides fails, saying what."""

from tests.strict_skips import pytest_make_collect_report, pytest_runtest_makereport

__all__ = ["pytest_make_collect_report", "pytest_runtest_makereport"]
