"""Embedded models built once per spec and cached between test sessions (and benchmarks)."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import asdict
from pathlib import Path

from tests.support.paths import ROOT

# Built models are cached between test sessions (keyed by their spec) to keep local runs fast.
MODEL_CACHE = Path(os.environ.get("RLHF_TEST_MODEL_CACHE", ROOT / ".cache" / "test-models"))


def cached_model(preset: str) -> Path:
    """Build (once per spec) the embedded model of ``preset`` and return its directory."""
    from rlhf.models.embedded import build_embedded_model, spec_for

    spec = spec_for(preset)
    key = hashlib.sha256(json.dumps(asdict(spec), sort_keys=True).encode()).hexdigest()[:12]
    target = MODEL_CACHE / f"{preset}-{key}"
    if not (target / "config.json").is_file():
        tmp = MODEL_CACHE / f".tmp-{preset}-{key}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        metrics = build_embedded_model(tmp, spec)
        (tmp / "build_metrics.json").write_text(json.dumps(metrics))
        shutil.rmtree(target, ignore_errors=True)
        os.rename(tmp, target)
    return target
