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
    "start-run": async (form) => {
      try {
        const data = await call("POST", "/api/admin/runs", { algorithm: new FormData(form).get("algorithm") });
        if (data && data.run_id) { window.location.href = `/admin/runs/${encodeURIComponent(data.run_id)}`; return; }
        await new Promise((r) => setTimeout(r, 1500));  // no run id: give the child process a moment to register
        window.location.reload();
      } catch (e) { showError(e.message); }
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
        const late = document.getElementById("run-late");
        if (late) { late.hidden = !run.late; late.textContent = run.late ? `Late: ${run.late}` : ""; }
        if (run.status !== "running" && run.status !== "queued") { clearInterval(timer); window.location.reload(); }
      } catch (e) { clearInterval(timer); showError(e.message); }
    }, 2000);
  }
  // Timestamps: the server writes <time datetime="...Z" title="...Z" data-local>23 Nov 2026, 14:05 UTC</time>;
  // here they become the browser's local time ("5 min ago" when recent), the exact UTC time
  // staying on hover. Chart axis labels (<text data-time=... data-time-format=...>) likewise.
  const dateTimeFmt = new Intl.DateTimeFormat(undefined, { day: "numeric", month: "short", year: "numeric",
                                                           hour: "2-digit", minute: "2-digit" });
  const timeFmt = new Intl.DateTimeFormat(undefined, { hour: "2-digit", minute: "2-digit" });
  const dayFmt = new Intl.DateTimeFormat(undefined, { day: "numeric", month: "short" });
  const dayTimeFmt = new Intl.DateTimeFormat(undefined, { day: "numeric", month: "short", hour: "2-digit",
                                                          minute: "2-digit" });
  const sameDay = (a, b) => a.getFullYear() === b.getFullYear() && a.getMonth() === b.getMonth()
    && a.getDate() === b.getDate();

  function humanTime(date, now) {
    const minutes = Math.round((now - date) / 60000);
    if (Math.abs(minutes) < 1) return "just now";
    if (minutes > 0 && minutes < 60) return `${minutes} min ago`;
    if (minutes < 0 && minutes > -60) return `in ${-minutes} min`;
    const today = new Date(now);
    const yesterday = new Date(now);
    yesterday.setDate(yesterday.getDate() - 1);
    const tomorrow = new Date(now);
    tomorrow.setDate(tomorrow.getDate() + 1);
    if (sameDay(date, today)) return `today, ${timeFmt.format(date)}`;
    if (sameDay(date, yesterday)) return `yesterday, ${timeFmt.format(date)}`;
    if (sameDay(date, tomorrow)) return `tomorrow, ${timeFmt.format(date)}`;
    return dateTimeFmt.format(date);
  }

  function localizeTimes() {
    const now = new Date();
    for (const el of document.querySelectorAll("time[data-local]")) {
      const date = new Date(el.dateTime);
      if (Number.isNaN(date.getTime())) continue;
      el.textContent = humanTime(date, now);
      if (!el.title) el.title = el.dateTime;
    }
    const axisFormats = { time: timeFmt, date: dayFmt, datetime: dayTimeFmt };
    for (const el of document.querySelectorAll("svg text[data-time]")) {
      const date = new Date(el.dataset.time);
      const fmt = axisFormats[el.dataset.timeFormat];
      if (fmt && !Number.isNaN(date.getTime())) el.textContent = fmt.format(date);
    }
  }
  localizeTimes();
  setInterval(localizeTimes, 30000);  // keeps "5 min ago" true

  // Wide tables scroll sideways inside their box on small screens; a box that scrolls can be
  // focused (and scrolled with the arrow keys), one that does not stays out of the tab order.
  function markScrollableTables() {
    for (const box of document.querySelectorAll(".table-scroll")) {
      if (box.scrollWidth > box.clientWidth + 1) {
        box.tabIndex = 0;
        box.setAttribute("role", "region");
        box.setAttribute("aria-label", `${box.dataset.scrollLabel || "Table"} (scrolls sideways)`);
      } else {
        box.removeAttribute("tabindex");
        box.removeAttribute("role");
        box.removeAttribute("aria-label");
      }
    }
  }
  // On a phone, list tables reflow into one card per row (admin.css): each cell is labelled
  // with its column's header; empty cells are left out. Without JavaScript they scroll instead.
  for (const table of document.querySelectorAll("table.list")) {
    const headers = [...table.querySelectorAll("thead th")].map((th) => th.textContent.trim());
    for (const row of table.querySelectorAll("tbody tr")) {
      [...row.cells].forEach((cell, i) => {
        if (cell.colSpan > 1) { cell.dataset.wide = ""; return; }
        if (headers[i]) cell.dataset.label = headers[i];
        if (!cell.textContent.trim() && !cell.querySelector("button, progress, input, a")) cell.dataset.empty = "";
      });
    }
    table.classList.add("reflow");
  }
  markScrollableTables();
  window.addEventListener("resize", markScrollableTables);

  // The runs list refreshes while any run is in progress.
  if (document.querySelector("table[data-poll='runs'] .status-running")) setTimeout(() => window.location.reload(), 3000);
})();
