"""The model store: one directory per version under ``<instance>/models/``.

A version is written into a hidden temporary directory next to its final place and renamed
into place only when complete, so a crash never leaves a half-written version that looks
real. Each version directory carries ``version.json`` with its lineage; a LoRA adapter version
(rlhf.models.adapters) also names its base there (``adapter``: base version name and path).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from rlhf.models.adapters import ADAPTER_CONFIG, adapter_lineage

VERSION_FILE = "version.json"
_NAME_RE = re.compile(r"^v(\d+)-")


def next_version_name(store: str | Path, kind: str) -> str:
    """``v<N>-<kind>`` with N one above the highest version in the store."""
    store = Path(store)
    numbers = [int(m.group(1)) for p in (store.iterdir() if store.is_dir() else [])
               if (m := _NAME_RE.match(p.name))]
    return f"v{max(numbers, default=0) + 1}-{kind}"


def write_version(store: str | Path, kind: str, write: Callable[[Path], dict[str, Any] | None],
                  lineage: dict[str, Any] | None = None, name: str | None = None) -> tuple[str, Path, dict]:
    """Create a version: ``write(tmp_dir)`` saves the model there and may return metrics.

    Returns (name, final path, metrics). On any exception the temporary directory is removed
    and nothing appears in the store.
    """
    store = Path(store)
    store.mkdir(parents=True, exist_ok=True)
    name = name or next_version_name(store, kind)
    final = store / name
    if final.exists():
        raise FileExistsError(f"model version {name} already exists at {final}")
    tmp = store / f".tmp-{name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        metrics = write(tmp) or {}
        meta = {"name": name, "kind": kind, "created_at": datetime.now(timezone.utc).isoformat(),
                "metrics": metrics, **(lineage or {})}
        adapter = adapter_lineage(tmp)
        if adapter:  # a LoRA adapter without weights of its own: which version it runs on
            meta["adapter"] = adapter
        (tmp / VERSION_FILE).write_text(json.dumps(meta, indent=2, default=str))
        _fsync_tree(tmp)
        os.rename(tmp, final)  # atomic on one filesystem
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return name, final, metrics


def _fsync_tree(path: Path) -> None:
    for p in path.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())


def has_model_config(path: str | Path) -> bool:
    """The directory has a model's config: ``config.json``, or a LoRA adapter's (rlhf.models.adapters)."""
    p = Path(path)
    return (p / "config.json").is_file() or (p / ADAPTER_CONFIG).is_file()


def is_complete(path: str | Path) -> bool:
    """A version directory that was renamed into place (has its lineage file and config)."""
    return (Path(path) / VERSION_FILE).is_file() and has_model_config(path)


def remove_stale_temporaries(store: str | Path) -> int:
    """Delete temporary directories left by crashed writers; returns how many."""
    store = Path(store)
    if not store.is_dir():
        return 0
    removed = 0
    for p in store.glob(".tmp-*"):
        shutil.rmtree(p, ignore_errors=True)
        removed += 1
    return removed
