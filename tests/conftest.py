from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.harness import DistWorld


@pytest.fixture(scope="session")
def world2() -> Iterator[DistWorld]:
    world = DistWorld(2)
    yield world
    world.close()


@pytest.fixture(scope="session")
def world4() -> Iterator[DistWorld]:
    world = DistWorld(4)
    yield world
    world.close()
