// Admin dashboard actions: call the admin JSON API with the CSRF token, then reload.
"use strict";

(() => {
  const csrf = document.querySelector('meta[name="csrf-token"]').content;
  const toast = document.getElementById("toast");

  function showError(message) {
    toast.textContent = message;
    toast.hidden = false;
    setTimeout(() => { toast.hidden = true; }, 8000);
  }

  async function call(method, url, body) {
    const opts = { method, credentials: "same-origin", headers: { "Accept": "application/json", "X-CSRFToken": csrf } };
    if (body !== undefined) {
      opts.headers["Content-Type"] = "application/json";
      opts.body = JSON.stringify(body);
    }
    const resp = await fetch(url, opts);
    let data = null;
    try { data = await resp.json(); } catch (e) { /* no body */ }
    if (!resp.ok) throw new Error((data && data.error) || `Request failed (${resp.status})`);
    return data;
  }

  async function act(fn, reloadTo) {
    try {
      await fn();
      if (reloadTo) window.location.href = reloadTo; else window.location.reload();
    } catch (e) { showError(e.message); }
  }

  const handlers = {
    "promote": (el) => act(() => call("POST", `/api/admin/versions/${el.dataset.id}/promote`)),
    "rollback": (el) => {
      if (!window.confirm("Roll back to the previous version? New answers will come from it at once.")) return;
      act(() => call("POST", `/api/admin/versions/${el.dataset.id}/rollback`));
    },
    "stop-experiment": (el) => act(() => call("POST", `/api/admin/experiments/${el.dataset.key}/stop`)),
    "conclude": (el) => {
      const label = el.dataset.decision === "promote" ? "Promote the variant to active for everyone?" : "Keep the control and retire the variant?";
      if (!window.confirm(label)) return;
      act(() => call("POST", `/api/admin/experiments/${el.dataset.key}/conclude`, { decision: el.dataset.decision }));
    },
  };

  const forms = {
    "create-experiment": (form) => {
      const f = new FormData(form);
      const body = { key: f.get("key"), control_version_id: parseInt(f.get("control_version_id"), 10),
                     variant_version_id: parseInt(f.get("variant_version_id"), 10),
                     traffic_split: parseFloat(f.get("traffic_split")) };
      act(() => call("POST", "/api/admin/experiments", body), `/admin/experiments/${encodeURIComponent(body.key)}`);
    },
    "set-split": (form) => {
      const split = parseFloat(new FormData(form).get("traffic_split"));
      act(() => call("PATCH", `/api/admin/experiments/${form.dataset.key}`, { traffic_split: split }));
    },
    "start-run": (form) => {
      act(async () => { await call("POST", "/api/admin/runs", { algorithm: new FormData(form).get("algorithm") });
                        await new Promise((r) => setTimeout(r, 1500)); });
    },
  };

  document.addEventListener("click", (ev) => {
    const el = ev.target.closest("button[data-action]");
    if (el && handlers[el.dataset.action]) { ev.preventDefault(); handlers[el.dataset.action](el); }
  });
  document.addEventListener("submit", (ev) => {
    const form = ev.target.closest("form[data-action]");
    if (form && forms[form.dataset.action]) { ev.preventDefault(); forms[form.dataset.action](form); }
  });

  // Live progress of a training run.
  const live = document.querySelector(".run-progress[data-live='yes']");
  if (live) {
    const id = live.dataset.runId;
    const timer = setInterval(async () => {
      try {
        const run = await call("GET", `/api/admin/runs/${id}`);
        document.getElementById("run-bar").value = run.progress;
        document.getElementById("run-stage").textContent = run.stage || "";
        document.getElementById("run-pct").textContent = `${Math.round(run.progress * 100)}%`;
        document.getElementById("run-status").textContent = run.status;
        document.getElementById("run-log").textContent = run.log || "";
        if (run.status !== "running" && run.status !== "queued") { clearInterval(timer); window.location.reload(); }
      } catch (e) { clearInterval(timer); showError(e.message); }
    }, 2000);
  }
  // The runs list refreshes while any run is in progress.
  if (document.querySelector("table[data-poll='runs'] .status-running")) setTimeout(() => window.location.reload(), 3000);
})();
