"""The scheduler's Open WebUI pull: fetch Open WebUI's feedback export with an admin's API key
and import it (webapp.training.openwebui), so ratings given there reach training with no one
moving files. Off while ``RLHF_OPENWEBUI_URL`` is unset; a failed fetch is the job's recorded
result, never an exception out of the scheduler."""
from __future__ import annotations

import http.client
import logging
import urllib.error
import urllib.request
from typing import Any

from flask import current_app

from webapp.training.openwebui import import_ratings
from webapp.training.openwebui_export import EXPORT_PATH, ExportError, load_export

log = logging.getLogger("webapp.training.openwebui_pull")

FETCH_TIMEOUT_SECONDS = 60.0


def fetch_export(url: str, api_key: str | None, timeout: float = FETCH_TIMEOUT_SECONDS) -> list:
    """The export's records from the Open WebUI at ``url`` (its base URL); raises OSError (network,
    HTTP status) or ExportError (not an export)."""
    headers = {"Accept": "application/json", **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
    request = urllib.request.Request(url.rstrip("/") + EXPORT_PATH, headers=headers)
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - an http(s) URL (checked setting)
        return load_export(response.read())


def pull_tick() -> dict[str, Any]:
    """One pull (the ``openwebui_pull`` job): fetch, import, and the outcome in one line."""
    cfg = current_app.config
    url = cfg.get("RLHF_OPENWEBUI_URL")
    if not url:
        return {"action": "skip", "reason": "no Open WebUI to pull from (RLHF_OPENWEBUI_URL is not set)"}
    endpoint = url.rstrip("/") + EXPORT_PATH
    try:
        records = fetch_export(url, cfg.get("RLHF_OPENWEBUI_API_KEY"))
    except urllib.error.HTTPError as exc:
        hint = " (RLHF_OPENWEBUI_API_KEY must be an admin's API key)" if exc.code in (401, 403) else ""
        return _failed(f"{endpoint} answered HTTP {exc.code} {exc.reason}{hint}")
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        why = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        return _failed(f"could not fetch {endpoint}: {type(why).__name__ if not str(why) else why}")
    except ExportError as exc:
        return _failed(f"{endpoint} answered with {exc}")
    summary = import_ratings(records, source=endpoint, actor="scheduler")
    fb, votes = summary["feedback"], summary["comparisons"]
    written = fb["created"] + fb["updated"] + votes["created"] + votes["updated"]
    reasons = ", ".join(f"{reason} {n}" for reason, n in summary["unmatched_by_reason"].items())
    return {"action": "imported" if written else "idle",
            "reason": (f"{summary['records']} records: {summary['matched']} matched ({fb['created']} new, "
                       f"{fb['updated']} updated; {votes['created'] + votes['updated']} votes), "
                       f"{summary['duplicate']} duplicate, {summary['unmatched']} unmatched"
                       + (f" ({reasons})" if reasons else "")),
            "summary": {k: v for k, v in summary.items() if k != "results"}}


def _failed(reason: str) -> dict[str, Any]:
    log.warning("openwebui_pull: %s", reason)
    return {"action": "error", "reason": reason[:300]}
