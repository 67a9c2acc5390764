import pytest


def pytest_addoption(parser):
    parser.addoption(
        "--regen",
        action="store_true",
        default=False,
        help="rewrite golden files (fixtures/**/*.out.py, *.txt) from the current output instead of comparing",
    )


@pytest.fixture
def regen(request) -> bool:
    return request.config.getoption("--regen")
