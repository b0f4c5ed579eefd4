// Admin dashboard actions: call the admin JSON API (static/js/http.js: the CSRF token, the
// server's error message), then reload.
import { api } from "./http.js";

const toast = document.getElementById("toast");

function showError(message) {
  toast.textContent = message;
  toast.hidden = false;
  setTimeout(() => { toast.hidden = true; }, 8000);
}

async function act(fn, reloadTo) {
  try {
    await fn();
    if (reloadTo) window.location.href = reloadTo; else window.location.reload();
  } catch (e) { showError(e.message); }
}

const handlers = {
  "promote": (el) => act(() => api("POST", `/api/admin/versions/${el.dataset.id}/promote`)),
  "rollback": (el) => {
    if (!window.confirm("Roll back to the previous version? New answers will come from it at once.")) return;
    act(() => api("POST", `/api/admin/versions/${el.dataset.id}/rollback`));
  },
  "stop-experiment": (el) => act(() => api("POST", `/api/admin/experiments/${el.dataset.key}/stop`)),
  "conclude": (el) => {
    const label = el.dataset.decision === "promote" ? "Promote the variant to active for everyone?" : "Keep the control and retire the variant?";
    if (!window.confirm(label)) return;
    act(() => api("POST", `/api/admin/experiments/${el.dataset.key}/conclude`, { decision: el.dataset.decision }));
  },
};

// Raters: an account's sessions end everywhere (POST /api/admin/users/<id>/sign-out).
handlers["sign-out-everywhere"] = (el) => {
  if (!window.confirm(`Sign ${el.dataset.name} out everywhere? Every browser signed in to this account is signed out at once; the password stays the same.`)) return;
  act(() => api("POST", `/api/admin/users/${encodeURIComponent(el.dataset.id)}/sign-out`));
};

// Raters: quarantine / restore / trust, confirmed in a dialog with a note (POST /api/admin/raters/<id>/trust).
const trustDialog = document.getElementById("trust-dialog");
const TRUST_TEXT = {
  quarantined: (name) => `Quarantine ${name}? Their feedback and votes will be left out of training and of A/B verdicts until you restore them.`,
  trusted: (name) => `Trust ${name}? The training run's assessment will not quarantine them automatically.`,
  auto: (name) => `Restore ${name} to automatic? The next training run's assessment decides about them again.`,
};
const TRUST_TITLE = { quarantined: "Quarantine this rater", trusted: "Trust this rater", auto: "Restore to automatic" };
handlers["rater-trust"] = (el) => {
  const { id, trust, name } = el.dataset;
  if (!trustDialog) return;
  trustDialog.dataset.id = id;
  trustDialog.dataset.trust = trust;
  document.getElementById("trust-dialog-title").textContent = TRUST_TITLE[trust] || "Change the rater's trust";
  document.getElementById("trust-dialog-text").textContent = (TRUST_TEXT[trust] || TRUST_TEXT.auto)(name);
  document.getElementById("trust-note").value = "";
  document.getElementById("trust-dialog-error").hidden = true;
  trustDialog.returnFocus = el;
  trustDialog.showModal();
  document.getElementById("trust-note").focus();
};
if (trustDialog) {
  document.getElementById("trust-cancel").addEventListener("click", () => trustDialog.close());
  trustDialog.addEventListener("close", () => { if (trustDialog.returnFocus) trustDialog.returnFocus.focus(); });
}

const forms = {
  "rater-trust-confirm": async (form) => {
    const error = document.getElementById("trust-dialog-error");
    const note = new FormData(form).get("note").trim();
    try {
      await api("POST", `/api/admin/raters/${encodeURIComponent(trustDialog.dataset.id)}/trust`,
                { trust: trustDialog.dataset.trust, note: note || null });
      window.location.reload();
    } catch (e) {
      error.textContent = e.message;
      error.hidden = false;
    }
  },
  "create-experiment": (form) => {
    const f = new FormData(form);
    const body = { key: f.get("key"), control_version_id: parseInt(f.get("control_version_id"), 10),
                   variant_version_id: parseInt(f.get("variant_version_id"), 10),
                   traffic_split: parseFloat(f.get("traffic_split")) };
    act(() => api("POST", "/api/admin/experiments", body), `/admin/experiments/${encodeURIComponent(body.key)}`);
  },
  "set-split": (form) => {
    const split = parseFloat(new FormData(form).get("traffic_split"));
    act(() => api("PATCH", `/api/admin/experiments/${form.dataset.key}`, { traffic_split: split }));
  },
  "start-run": async (form) => {
    try {
      const algorithm = new FormData(form).get("algorithm");  // "": the default, which the model's size may set
      const data = await api("POST", "/api/admin/runs", algorithm ? { algorithm } : {});
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

// Training curves of a run: drawn by the server; redrawn here (same chart as
// webapp/svg_charts.step_chart) while the run trains, and to overlay another run's curves.
const SVG_NS = "http://www.w3.org/2000/svg";
function svgEl(name, attrs, text) {
  const el = document.createElementNS(SVG_NS, name);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  if (text !== undefined) el.textContent = text;
  return el;
}
function numLabel(v, percent) {
  if (percent) return `${(v * 100).toFixed(0)}%`;
  if (v === 0) return "0";
  if (Math.abs(v) >= 1000 || Math.abs(v) < 0.01) return v.toExponential(1).replace("e+", "e");
  return String(Number(v.toPrecision(3)));
}
function stepTicks(lo, hi, most = 5) {
  if (hi <= lo) return [lo];
  const step = Math.max(1, Math.ceil((hi - lo) / (most - 1)));
  const out = [];
  for (let s = lo; s < hi; s += step) out.push(s);
  if (hi - out[out.length - 1] < step / 2 && out.length > 1) out.pop();
  out.push(hi);
  return out;
}
function stepChart(title, lines, percent, width = 520, height = 190) {
  const values = lines.flatMap((l) => l.points.map((p) => p.value));
  const own = lines.length ? lines[0].points.length : 0;
  const svg = svgEl("svg", { class: "chart", role: "img", viewBox: `0 0 ${width} ${height}`, "data-points": own });
  if (!values.length) {
    svg.setAttribute("aria-label", `${title}: no data yet`);
    svg.appendChild(svgEl("text", { x: width / 2, y: height / 2, "text-anchor": "middle", class: "chart-empty" }, "No data yet"));
    return svg;
  }
  const [padL, padR, padT, padB] = [66, 16, 14, 30];
  const steps = lines.flatMap((l) => l.points.map((p) => p.step));
  const sLo = Math.min(...steps), sHi = Math.max(...steps);
  let lo = Math.min(...values), hi = Math.max(...values);
  if (percent) { lo = Math.min(lo, 0); hi = Math.max(hi, 1); }
  else if (hi - lo < 1e-12) { lo -= Math.abs(lo) * 0.1 || 1; hi += Math.abs(hi) * 0.1 || 1; }
  else { const m = (hi - lo) * 0.05; lo -= m; hi += m; }
  const span = hi - lo;
  const x = (s) => padL + (width - padL - padR) * (sHi > sLo ? (s - sLo) / (sHi - sLo) : 0.5);
  const y = (v) => padT + (height - padT - padB) * (1 - (v - lo) / span);
  const summary = lines.filter((l) => l.points.length).map((l) => {
    const p = l.points[l.points.length - 1];
    return `${l.label} ${numLabel(p.value, percent)} at step ${p.step}`;
  }).join("; ");
  svg.setAttribute("aria-label", `${title} over ${sHi} steps; latest: ${summary}`);
  for (const frac of [0, 0.5, 1]) {
    const v = lo + span * frac;
    svg.appendChild(svgEl("line", { x1: padL, x2: width - padR, y1: y(v).toFixed(1), y2: y(v).toFixed(1), class: "chart-grid" }));
    svg.appendChild(svgEl("text", { x: padL - 6, y: (y(v) + 4).toFixed(1), "text-anchor": "end", class: "chart-axis" }, numLabel(v, percent)));
  }
  const ticks = stepTicks(sLo, sHi);
  ticks.forEach((s, i) => {
    const anchor = i === 0 && ticks.length > 1 ? "start" : (i === ticks.length - 1 && ticks.length > 1 ? "end" : "middle");
    svg.appendChild(svgEl("text", { x: x(s).toFixed(1), y: height - 9, "text-anchor": anchor, class: "chart-axis" }, `${i === 0 ? "step " : ""}${s}`));
  });
  for (const l of lines) {
    if (l.points.length > 1) {
      svg.appendChild(svgEl("polyline", { class: `chart-line ${l.cls}`,
        points: l.points.map((p) => `${x(p.step).toFixed(1)},${y(p.value).toFixed(1)}`).join(" ") }));
    }
    if (l.points.length <= 40) {
      for (const p of l.points) {
        const dot = svgEl("circle", { class: `chart-dot ${l.cls}`, cx: x(p.step).toFixed(1), cy: y(p.value).toFixed(1), r: 2.5 });
        dot.appendChild(svgEl("title", {}, `${l.label}, step ${p.step}: ${numLabel(p.value, percent)}`));
        svg.appendChild(dot);
      }
    }
  }
  return svg;
}
function chartLines(chart, data, group) {
  const stage = data.series[chart.stage] || {};
  const lines = [];
  chart.metrics.forEach((metric, i) => {
    const points = stage[metric] || [];
    if (group === "b" && !points.length) return;
    lines.push({ label: `run #${data.run_id} ${chart.labels[i]}`.trim(), cls: `series-${group}${i}`, points });
  });
  return lines;
}
const curves = document.getElementById("curves");
const curveState = { mine: null, other: null };
function drawCurves() {
  const { mine, other } = curveState;
  if (!curves || !mine) return;
  for (const chart of mine.charts) {
    const fig = curves.querySelector(`figure[data-chart="${CSS.escape(chart.id)}"]`);
    if (!fig) continue;
    const lines = chartLines(chart, mine, "a").concat(other ? chartLines(chart, other, "b") : []);
    const legend = fig.querySelector(".legend");
    legend.replaceChildren(...lines.map((l) => {
      const item = document.createElement("span");
      item.className = "legend-item";
      const swatch = document.createElement("span");
      swatch.className = `swatch ${l.cls}`;
      item.append(swatch, l.label);
      return item;
    }));
    fig.querySelector("svg").replaceWith(stepChart(chart.title, lines, chart.percent));
  }
  const note = document.getElementById("curves-note");
  if (note && Object.keys(mine.series).length > 0) {
    note.textContent = `Per training step, as TRL logged it${mine.live ? "; updated live while the run trains" : ""}.`;
  }
}
async function loadCurves() {
  curveState.mine = await api("GET", `/api/admin/runs/${curves.dataset.runId}/curves`);
  drawCurves();
}
if (curves) {
  const select = document.getElementById("compare-run");
  select.addEventListener("change", async () => {
    try {
      const id = select.value;
      curveState.other = id ? await api("GET", `/api/admin/runs/${encodeURIComponent(id)}/curves`) : null;
      if (!curveState.mine) await loadCurves(); else drawCurves();
      curves.dataset.compare = id;
      const url = new URL(window.location.href);
      if (id) url.searchParams.set("compare", id); else url.searchParams.delete("compare");
      window.history.replaceState(null, "", url);
    } catch (e) { showError(e.message); }
  });
  if (curves.dataset.live === "yes") {
    const compareId = curves.dataset.compare;
    const first = compareId ? api("GET", `/api/admin/runs/${encodeURIComponent(compareId)}/curves`)
      .then((d) => { curveState.other = d; }) : Promise.resolve();
    first.then(loadCurves).catch((e) => showError(e.message));
    const curveTimer = setInterval(() => {
      loadCurves().then(() => { if (!curveState.mine.live) clearInterval(curveTimer); })
        .catch((e) => { clearInterval(curveTimer); showError(e.message); });
    }, 1500);
  }
}

// Live progress of a training run.
const live = document.querySelector(".run-progress[data-live='yes']");
if (live) {
  const id = live.dataset.runId;
  const timer = setInterval(async () => {
    try {
      const run = await api("GET", `/api/admin/runs/${id}`);
      document.getElementById("run-bar").value = run.progress;
      document.getElementById("run-stage").textContent = run.stage || "";
      document.getElementById("run-pct").textContent = `${Math.round(run.progress * 100)}%`;
      const eta = document.getElementById("run-eta");
      if (eta) { eta.hidden = !run.eta; eta.textContent = run.eta ? run.eta.text : ""; }
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
