"""Fixtures the hosts' tests share with the acceptance tests."""

from tests.acceptance.conftest import daemons as daemons
from tests.acceptance.conftest import data_dir as data_dir
