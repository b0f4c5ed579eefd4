"""The admin-side app of the admin and experiment-lifecycle tests: three versions and an admin account
(tests/support/admin.py)."""
from __future__ import annotations

import pytest

from tests.support.admin import admin_setup


@pytest.fixture
def setup(tmp_path, micro_model_dir):
    return admin_setup(tmp_path, micro_model_dir)
