"""The test CA, made once per session (tests/cli/https_server.py)."""

from __future__ import annotations

import pytest

from tests.cli.https_server import LocalCA, make_ca


@pytest.fixture(scope="session")
def local_ca(tmp_path_factory: pytest.TempPathFactory) -> LocalCA:
    return make_ca(tmp_path_factory.mktemp("ca"))
