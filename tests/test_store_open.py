"""`open_store(url)`: the store a database URL names, chosen by its scheme."""

from __future__ import annotations

from pathlib import Path

import pytest

from agenttest_worker.store import STORES, SqlStore, open_store, upgrade


def test_a_sqlite_url_opens_the_database_store(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    upgrade(url)
    store = open_store(url)
    assert isinstance(store, SqlStore)
    assert store.load_case("no-such-run", "C1") is None


def test_a_postgres_url_opens_the_database_store(pg_database: str) -> None:
    upgrade(pg_database)
    store = open_store(pg_database)
    assert isinstance(store, SqlStore)
    assert store.load_case("no-such-run", "C1") is None


@pytest.mark.parametrize("url", ["mysql://root@127.0.0.1/runs", "redis://127.0.0.1:6379/0"])
def test_an_unknown_scheme_names_the_known_ones(url: str) -> None:
    with pytest.raises(ValueError) as refused:
        open_store(url)
    message = str(refused.value)
    assert url.partition("://")[0] + "://" in message
    assert all(f"{scheme}://" in message for scheme in STORES)
