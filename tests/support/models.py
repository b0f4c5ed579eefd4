"""Embedded models built once per spec and cached between test sessions (and benchmarks)."""
from __future__ import annotations

import fcntl
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
    from rlhf.models.embedded import spec_for

    spec = spec_for(preset)
    key = hashlib.sha256(json.dumps(asdict(spec), sort_keys=True).encode()).hexdigest()[:12]
    target = MODEL_CACHE / f"{preset}-{key}"
    if (target / "config.json").is_file():
        return target
    MODEL_CACHE.mkdir(parents=True, exist_ok=True)
    # one builder at a time (pytest-xdist workers, a benchmark beside the tests): the others wait
    # for it and find the model built
    with open(MODEL_CACHE / f".lock-{preset}-{key}", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _build(preset, spec, target)
    return target


def _build(preset: str, spec: object, target: Path) -> None:
    from rlhf.models.embedded import build_embedded_model

    if not (target / "config.json").is_file():
        tmp = MODEL_CACHE / f".tmp-{target.name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        metrics = build_embedded_model(tmp, spec)
        (tmp / "build_metrics.json").write_text(json.dumps(metrics))
        shutil.rmtree(target, ignore_errors=True)
        os.rename(tmp, target)
