"""The scheduler's Open WebUI pull: fetch Open WebUI's feedback export with an admin's API key
and import it (webapp.training.openwebui), so ratings given there reach training with no one
moving files. Off while ``RLHF_OPENWEBUI_URL`` is unset; a failed fetch is the job's recorded
result, never an exception out of the scheduler.

The fetch carries an admin's key, so it trusts nothing the server says beyond the one answer:
redirects are never followed (a redirect elsewhere would take the key with it: urllib keeps
``Authorization`` across hosts), the body is read up to :data:`MAX_EXPORT_BYTES` and no further,
and the whole fetch -- connect, headers, every read -- shares one deadline
(:data:`FETCH_DEADLINE_SECONDS`), not a timeout per read that a slow server can renew forever.
"""
from __future__ import annotations

import http.client
import logging
import ssl
import time
import urllib.parse
from typing import Any

from flask import current_app

from webapp.core.display import mask_url
from webapp.core.validation import clip
from webapp.training.openwebui import import_ratings
from webapp.training.openwebui_export import EXPORT_PATH, ExportError, load_export

log = logging.getLogger("webapp.training.openwebui_pull")

FETCH_DEADLINE_SECONDS = 60.0
# An export holds every rating with a snapshot of its chat: about 5-20 KB a record, so 64 MiB is
# several thousand records; a larger answer is refused rather than read into memory.
MAX_EXPORT_BYTES = 64 * 1024 * 1024
_CHUNK = 256 * 1024


class FetchError(OSError):
    """The export could not be fetched (one line: why)."""


class HTTPStatusError(FetchError):
    def __init__(self, status: int, reason: str, detail: str = "") -> None:
        super().__init__(f"HTTP {status} {reason}{detail}")
        self.status, self.reason = status, reason


def fetch_export(url: str, api_key: str | None, deadline_seconds: float | None = None,
                 max_bytes: int | None = None) -> list:
    """The export's records from the Open WebUI at ``url`` (its base URL); raises FetchError
    (network, HTTP status, redirect, too large, too slow) or ExportError (not an export)."""
    target = urllib.parse.urlsplit(url.rstrip("/") + EXPORT_PATH)
    if target.scheme not in ("http", "https") or not target.hostname:
        raise FetchError(f"not an http(s) URL: {clip(url)}")
    deadline_seconds = FETCH_DEADLINE_SECONDS if deadline_seconds is None else deadline_seconds
    max_bytes = MAX_EXPORT_BYTES if max_bytes is None else max_bytes
    end = time.monotonic() + deadline_seconds

    def remaining() -> float:
        left = end - time.monotonic()
        if left <= 0:
            raise FetchError(f"no complete answer within {deadline_seconds:g} s")
        return left

    cls = http.client.HTTPSConnection if target.scheme == "https" else http.client.HTTPConnection
    extra = {"context": ssl.create_default_context()} if target.scheme == "https" else {}
    conn = cls(target.hostname, target.port, timeout=remaining(), **extra)
    try:
        path = target.path + (f"?{target.query}" if target.query else "")
        headers = {"Accept": "application/json", "User-Agent": "rlhf-chat openwebui-pull",
                   **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
        conn.request("GET", path, headers=headers)
        conn.sock.settimeout(remaining())
        response = conn.getresponse()
        if 300 <= response.status < 400:
            where = mask_url(response.getheader("Location") or "nowhere")
            raise HTTPStatusError(response.status, response.reason,
                                  f" (a redirect to {clip(where, 120)}: not followed, since it would carry the "
                                  "admin key; set RLHF_OPENWEBUI_URL to the address it names)")
        if response.status != 200:
            raise HTTPStatusError(response.status, response.reason)
        length = response.getheader("Content-Length")
        if length and length.isdigit() and int(length) > max_bytes:
            raise FetchError(f"the export is {int(length):,} bytes, over the limit of {max_bytes:,} bytes")
        body = bytearray()
        while True:
            conn.sock.settimeout(remaining())  # each read waits only as long as the whole fetch has left
            chunk = response.read1(min(_CHUNK, max_bytes + 1 - len(body)))  # what has arrived, not a full buffer
            if not chunk:
                break
            body += chunk
            if len(body) > max_bytes:
                raise FetchError(f"the export is over the limit of {max_bytes:,} bytes")
        remaining()
    except TimeoutError:
        raise FetchError(f"no complete answer within {deadline_seconds:g} s") from None
    finally:
        conn.close()
    return load_export(bytes(body))


def pull_tick() -> dict[str, Any]:
    """One pull (the ``openwebui_pull`` job): fetch, import, and the outcome in one line."""
    cfg = current_app.config
    url = cfg.get("RLHF_OPENWEBUI_URL")
    if not url:
        return {"action": "skip", "reason": "no Open WebUI to pull from (RLHF_OPENWEBUI_URL is not set)"}
    endpoint = mask_url(url.rstrip("/") + EXPORT_PATH)  # the outcome is shown and logged: no credentials in it
    try:
        records = fetch_export(url, cfg.get("RLHF_OPENWEBUI_API_KEY"))
    except HTTPStatusError as exc:
        hint = " (RLHF_OPENWEBUI_API_KEY must be an admin's API key)" if exc.status in (401, 403) else ""
        return _failed(f"{endpoint} answered {exc}{hint}")
    except FetchError as exc:
        return _failed(f"could not fetch {endpoint}: {exc}")
    except (OSError, http.client.HTTPException) as exc:
        return _failed(f"could not fetch {endpoint}: {str(exc) or type(exc).__name__}")
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
