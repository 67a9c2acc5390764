import os
from typing import List

import pytest

# Order of the run: the costliest tests first, so that under ``pytest -n 2`` the two workers
# do not end with one long test each while the other waits (longest-first scheduling). A
# file's weight is about the seconds of CPU one of its `torchrun`/`slow` tests takes; tests
# without those markers keep weight 0. Only the order changes, never what runs.
COST = {
    "tests/test_rewrite_property.py": 100,  # three tests of 100 generated scripts, each migrated twice
    "tests/test_precommit.py": 100,  # one xdist group: builds a hook environment (pip) once
    "tests/test_elastic.py": 60,  # real torchrun launches (a restart)
    "tests/test_template.py": 50,  # real torchrun launches
    "tests/test_zygote.py": 40,  # real launches beside forked ones
    "tests/test_behaviour.py": 40,
    "tests/test_corpus.py": 35,  # dp2ddp verify of real training scripts (verify and its runs forked)
    "tests/test_verify.py": 35,  # some real: the hang, the two-node runs, Ctrl-C
    "tests/test_verify_migrations.py": 30,
    "tests/test_verify_unit.py": 30,
    "tests/test_corpus_originals.py": 5,  # forked from a zygote
    "tests/test_verify_outputs.py": 25,
    "tests/test_verify_guard.py": 25,
    "tests/test_shard_eval.py": 20,
    "tests/test_work.py": 20,
    "tests/test_project.py": 20,
    "tests/test_rewrite_fixtures.py": 10,
    "tests/test_verify_partition.py": 10,  # the probe in a fresh Python
}


def pytest_addoption(parser):
    parser.addoption(
        "--regen",
        action="store_true",
        default=False,
        help="rewrite golden files (fixtures/**/*.out.py, *.txt) from the current output instead of comparing",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config) -> None:
    # `-n 2` alone means --dist load, which hands each worker a quarter of the suite up front,
    # in order: with the costliest first, one worker would get all of them. loadgroup (here:
    # one test per unit) hands out two tests per worker, then one more as each finishes.
    if getattr(config.option, "dist", None) == "load":
        config.option.dist = "loadgroup"


def _weight(item: pytest.Item) -> int:
    if item.get_closest_marker("torchrun") is None and item.get_closest_marker("slow") is None:
        return 0
    return COST.get(item.nodeid.split("::", 1)[0], 50)


def pytest_collection_modifyitems(config, items: List[pytest.Item]) -> None:
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (-_weight(item), order[id(item)]))


@pytest.fixture
def regen(request) -> bool:
    return request.config.getoption("--regen")


@pytest.fixture(autouse=True)
def _environment_put_back():
    """``os.environ`` as it was before the test. A test that changes it in-process (torch sets
    ``TORCHINDUCTOR_CACHE_DIR`` the first time a DDP wrapper is built in the pytest process)
    would otherwise make every later launch of its worker run the real command instead of a
    zygote fork (an import-time variable the zygote lacks: tests/_zygote.py), ten times as
    slow, for the rest of the run."""
    before = dict(os.environ)
    yield
    if dict(os.environ) != before:
        os.environ.clear()
        os.environ.update(before)
