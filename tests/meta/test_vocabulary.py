"""Each vocabulary the web app and training share is defined once, in rlhf, and the web app uses
those very objects: trust levels, rater statuses and rule names (rlhf.trust.vocabulary), reason
chips (rlhf.data.criteria). Neither module needs numpy, scipy or torch."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import rlhf
import rlhf.trust
from rlhf.data import criteria
from rlhf.trust import vocabulary
from webapp.admin import raters as admin_raters
from webapp.chat import pages
from webapp.core import models, raters
from webapp.core.ratings import reasons
from webapp.training import openwebui_export


def test_trust_vocabulary_is_defined_once():
    assert models.TRUST_LEVELS is raters.TRUST_LEVELS is admin_raters.TRUST_LEVELS is vocabulary.TRUST_LEVELS
    assert admin_raters.RATER_STATUSES is vocabulary.RATER_STATUSES
    assert admin_raters.STATUS_FILTERS[:-1] == vocabulary.RATER_STATUSES
    assert list(admin_raters.RULE_LABELS) == list(vocabulary.RULES)  # a label for each rule, in their order
    assert (rlhf.trust.TRUST_LEVELS, rlhf.trust.RATER_STATUSES, rlhf.trust.RULES) == \
        (vocabulary.TRUST_LEVELS, vocabulary.RATER_STATUSES, vocabulary.RULES)
    [check] = [c for c in models.RaterTrust.__table__.constraints if c.name == "ck_rater_trust_trust"]
    assert str(check.sqltext) == "trust IN ('auto', 'trusted', 'quarantined')"


def test_reason_chips_are_defined_once():
    assert reasons.REASONS is criteria.REASONS
    assert pages.REASONS_UP is criteria.REASONS_UP and pages.REASONS_DOWN is criteria.REASONS_DOWN
    named = set(criteria.COST_REASONS) | {chip for sides in criteria.CHIP_CRITERIA.values() for side in sides
                                          for chip in side}
    assert named <= set(criteria.REASONS)  # a criterion learns only from chips users can tick
    assert set(openwebui_export.REASON_CHIPS.values()) <= set(criteria.REASONS)


def test_vocabularies_import_without_numpy_or_torch():
    code = ("import sys, rlhf.trust.vocabulary, rlhf.data.criteria; "
            "print(sorted(m for m in ('numpy', 'scipy', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(rlhf.__file__).resolve().parent.parent).stdout
    assert out.strip() == "[]"
