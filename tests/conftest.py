import os
import sys

# the toy-model catalogue is imported by several test files as `models`
sys.path.insert(0, os.path.dirname(__file__))


def pytest_addoption(parser):
    parser.addoption(
        "--regen-golden",
        action="store_true",
        default=False,
        help="rewrite tests/golden/*.dot from the current renderer instead of comparing",
    )
