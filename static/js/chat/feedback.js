// Feedback on an answer: thumbs with reason chips and a comment, stars, a correction; compare votes.

import { openConversation } from "./conversation.js";
import { els, REASONS_DOWN, REASONS_UP } from "./dom.js";
import { api } from "../http.js";
import { nodeOf, paintFeedback } from "./messages.js";
import { showError } from "./notify.js";
import { render } from "./render.js";
import { state } from "./state.js";

// Radio-group keys: arrows move the rating (and the focus) by one star, Home/End to 1/5.
export function starKeys(ev, m) {
  const star = ev.target.closest(".star");
  if (!star) return;
  const current = parseInt(star.dataset.value, 10);
  const moves = { ArrowRight: current + 1, ArrowUp: current + 1, ArrowLeft: current - 1, ArrowDown: current - 1,
                  Home: 1, End: 5 };
  if (!(ev.key in moves)) return;
  ev.preventDefault();
  const value = Math.min(5, Math.max(1, moves[ev.key]));
  const node = nodeOf(m);
  if (node) node.querySelector(`.star[data-value="${value}"]`).focus();
  if (!m.feedback || m.feedback.rating !== value) saveFeedback(m, { rating: value });
}

// Shows the change at once, then stores it; one message's saves go out one after the other,
// so the last click wins. A failed save reloads what the server has.
export function saveFeedback(m, changes) {
  m.feedback = { thumb: null, rating: null, correction: null, comment: null, reasons: [], ...(m.feedback || {}), ...changes };
  const node = nodeOf(m);
  if (node) paintFeedback(node, m);
  const convId = state.conv.id;
  m.pendingSaves = (m.pendingSaves || 0) + 1;
  m.saving = (m.saving || Promise.resolve()).then(async () => {
    try {
      const data = await api("POST", `/api/messages/${m.id}/feedback`, changes);
      if (--m.pendingSaves === 0) { // the newest save: the server's row is the truth
        m.feedback = data.feedback;
        const fresh = nodeOf(m);
        if (fresh) paintFeedback(fresh, m);
      }
      return true;
    } catch (e) {
      m.pendingSaves--;
      showError(e.message);
      if (state.conv && state.conv.id === convId) await openConversation(convId, true);
      return false;
    }
  });
  return m.saving;
}

export async function thumb(m, value) {
  const current = m.feedback && m.feedback.thumb;
  const next = current === value ? null : value;
  const changes = { thumb: next };
  if (next !== current) changes.reasons = []; // reasons belong to the old thumb
  const node = nodeOf(m);
  if (node && !next) node.querySelector(".feedback-panel").hidden = true;
  const saved = saveFeedback(m, changes);
  if (next && node) openFeedbackPanel(m, node, next, `thumb-${value}`);
  await saved;
}

// opener: data-key of the button that opened the panel (the focus goes back there on close)
export function openFeedbackPanel(m, node, thumbValue, opener) {
  const panel = node.querySelector(".feedback-panel");
  const chips = panel.querySelector(".chips");
  chips.replaceChildren();
  const chosen = new Set((m.feedback && m.feedback.reasons) || []);
  const options = thumbValue === "up" ? REASONS_UP : thumbValue === "down" ? REASONS_DOWN
    : REASONS_UP.concat(REASONS_DOWN);
  for (const reason of options) {
    const chip = document.createElement("button");
    chip.type = "button";
    chip.className = "chip" + (chosen.has(reason) ? " on" : "");
    chip.textContent = reason;
    chip.setAttribute("aria-pressed", String(chosen.has(reason)));
    chip.addEventListener("click", () => {
      if (chosen.has(reason)) chosen.delete(reason); else chosen.add(reason);
      chip.classList.toggle("on", chosen.has(reason));
      chip.setAttribute("aria-pressed", String(chosen.has(reason)));
    });
    chips.append(chip);
  }
  const comment = panel.querySelector(".comment-input");
  comment.value = (m.feedback && m.feedback.comment) || "";
  panel.hidden = false;
  const close = () => {
    panel.hidden = true;
    const back = node.querySelector(`[data-key="${opener}"]`);
    if (back) back.focus();
  };
  panel.querySelector(".save-feedback").onclick = async () => {
    if (await saveFeedback(m, { reasons: Array.from(chosen), comment: comment.value })) close();
  };
  panel.querySelector(".cancel-feedback").onclick = close;
  panel.onkeydown = (ev) => { if (ev.key === "Escape") { ev.preventDefault(); close(); } };
  comment.focus();
}

export function openCorrection(m, node) {
  const editor = node.querySelector(".correction-editor");
  const input = editor.querySelector(".correction-input");
  input.value = (m.feedback && m.feedback.correction) || m.content;
  editor.hidden = false;
  input.focus();
  const close = () => { editor.hidden = true; node.querySelector(".correct").focus(); };
  editor.querySelector(".save-correction").onclick = async () => {
    const text = input.value.trim();
    if (!text) { showError("The correction is empty."); return; }
    if (await saveFeedback(m, { correction: text })) close();
  };
  editor.querySelector(".cancel-correction").onclick = close;
  editor.onkeydown = (ev) => { if (ev.key === "Escape") { ev.preventDefault(); close(); } };
}

export async function vote(pair, winner) {
  try {
    const data = await api("POST", `/api/pairs/${pair.id}/vote`, { winner });
    state.conv.comparisons.set(pair.prompt_message_id, data.pair);
    if (data.answerers) { // admins only, once the vote is in: which side was which model
      for (const side of ["a", "b"]) Object.assign(state.conv.messages.get(data.pair[side]) || {}, data.answerers[side]);
    }
    state.selected.set(pair.prompt_message_id, data.continue_from);
    render();
    els.input.focus();
  } catch (e) { showError(e.message); }
}
