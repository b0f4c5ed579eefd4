// One node per message: questions (pager, copy, edit), answers (siblings, copy, ratings, flag,
// regenerate), a side-by-side compare, the placeholder of an answer being written; an answer's
// feedback and flag painted on its node. The controls call what main.js bound in actions.js.

import { actions } from "./actions.js";
import { siblingsOf } from "./branches.js";
import { cloneTemplate, els, setLabel, setPressed } from "./dom.js";
import * as markdown from "../markdown.js";
import { copyWithFeedback } from "./notify.js";
import { state } from "./state.js";

export function userNode(m) {
  const node = cloneTemplate("tpl-user-message");
  node.querySelector(".bubble").textContent = m.content;
  if (m.id == null) { // not stored yet (being sent)
    node.querySelector(".user-tools").remove();
    return node;
  }
  node.dataset.id = m.id;
  const siblings = siblingsOf(m).filter((id) => state.conv.messages.get(id).role === "user");
  if (siblings.length > 1) {
    const pos = siblings.indexOf(m.id);
    const pager = node.querySelector(".question-pager");
    pager.hidden = false;
    pager.querySelector(".q-pos").textContent = `${pos + 1} / ${siblings.length}`;
    pager.setAttribute("aria-label", `Question version ${pos + 1} of ${siblings.length}`);
    const prev = pager.querySelector(".q-prev");
    const next = pager.querySelector(".q-next");
    prev.disabled = pos === 0;
    next.disabled = pos === siblings.length - 1;
    const key = m.parent_id ?? "root";
    prev.addEventListener("click", () => actions.showSibling(key, siblings[pos - 1]));
    next.addEventListener("click", () => actions.showSibling(key, siblings[pos + 1]));
  }
  const copy = node.querySelector(".copy-question");
  copy.addEventListener("click", () => copyWithFeedback(copy, m.content));
  const edit = node.querySelector(".edit-question");
  edit.disabled = state.busy;
  edit.addEventListener("click", () => openEdit(m, node));
  return node;
}

function openEdit(m, node) {
  if (state.busy) return;
  const form = node.querySelector(".edit-form");
  const input = form.querySelector(".edit-input");
  node.classList.add("editing");
  node.querySelector(".bubble").hidden = true;
  node.querySelector(".user-tools").hidden = true;
  form.hidden = false;
  input.value = m.content;
  input.focus();
  input.setSelectionRange(input.value.length, input.value.length);
  const close = () => {
    form.hidden = true;
    node.classList.remove("editing");
    node.querySelector(".bubble").hidden = false;
    node.querySelector(".user-tools").hidden = false;
    node.querySelector(".edit-question").focus();
  };
  form.querySelector(".cancel-edit").onclick = close;
  form.onsubmit = (ev) => { ev.preventDefault(); actions.sendEdit(m, node, input.value); };
  input.onkeydown = (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) {
      ev.preventDefault();
      actions.sendEdit(m, node, input.value);
    } else if (ev.key === "Escape") { ev.preventDefault(); close(); }
  };
}

export function assistantNode(m) {
  const node = cloneTemplate("tpl-assistant-message");
  node.dataset.id = m.id;
  markdown.update(node.querySelector(".content"), m.content);

  // siblings: other answers to the same question
  const siblings = siblingsOf(m);
  const box = node.querySelector(".siblings");
  if (siblings.length > 1) {
    const pos = siblings.indexOf(m.id);
    box.classList.remove("is-empty");
    box.setAttribute("aria-label", `Answer ${pos + 1} of ${siblings.length}`);
    box.querySelector(".sibling-pos").textContent = `${pos + 1} / ${siblings.length}`;
    const prev = box.querySelector(".sibling-prev");
    const next = box.querySelector(".sibling-next");
    prev.disabled = pos === 0;
    next.disabled = pos === siblings.length - 1;
    prev.addEventListener("click", () => actions.showSibling(m.parent_id, siblings[pos - 1]));
    next.addEventListener("click", () => actions.showSibling(m.parent_id, siblings[pos + 1]));
    const pair = state.conv.comparisons.get(m.parent_id);
    if (pair && pair.winner && (m.id === pair.a || m.id === pair.b)) {
      const won = (pair.winner === "a" && m.id === pair.a) || (pair.winner === "b" && m.id === pair.b);
      const label = pair.winner === "tie" ? "tie" : pair.winner === "both_bad" ? "both bad" : won ? "your pick" : "not picked";
      box.querySelector(".sibling-pos").textContent += ` · ${label}`;
    }
  } else {
    box.querySelectorAll("button").forEach((b) => { b.disabled = true; b.tabIndex = -1; });
    box.setAttribute("aria-hidden", "true");
  }

  const copy = node.querySelector(".copy-answer");
  copy.addEventListener("click", () => copyWithFeedback(copy, m.content));
  node.querySelector(".thumb-up").addEventListener("click", () => actions.thumb(m, "up"));
  node.querySelector(".thumb-down").addEventListener("click", () => actions.thumb(m, "down"));
  node.querySelector(".flag-btn").addEventListener("click", () => actions.toggleFlagPanel(m, node));
  const stars = node.querySelector(".stars");
  stars.querySelectorAll(".star").forEach((star) => {
    const value = parseInt(star.dataset.value, 10);
    star.addEventListener("click", () => {
      const current = m.feedback && m.feedback.rating;
      actions.saveFeedback(m, { rating: current === value ? null : value });
    });
  });
  stars.addEventListener("keydown", (ev) => actions.starKeys(ev, m));
  node.querySelector(".correct").addEventListener("click", () => actions.openCorrection(m, node));
  node.querySelector(".comment-toggle").addEventListener("click", () =>
    actions.openFeedbackPanel(m, node, m.feedback && m.feedback.thumb, "comment"));
  const regen = node.querySelector(".regenerate");
  regen.disabled = state.busy;
  regen.addEventListener("click", () => actions.regenerate(m));

  node.querySelector(".cut-note").hidden = !m.cut; // stopped by the generation limit, not by the model
  const meta = []; // the version and arm come with an answer for admins only (blind arms)
  if (m.model_version) meta.push(m.model_version);
  if (m.arm) meta.push(m.arm);
  node.querySelector(".meta").textContent = meta.join(" \u00b7 ");
  paintFeedback(node, m);
  paintFlag(node, m);
  return node;
}

export function compareNode(pair) {
  const node = cloneTemplate("tpl-compare");
  node.dataset.pairId = pair.id;
  markdown.update(node.querySelector('[data-side="a"] .bubble'), state.conv.messages.get(pair.a).content);
  markdown.update(node.querySelector('[data-side="b"] .bubble'), state.conv.messages.get(pair.b).content);
  node.querySelectorAll(".vote").forEach((btn) => {
    btn.disabled = state.busy;
    btn.addEventListener("click", () => actions.vote(pair, btn.dataset.winner));
  });
  return node;
}

export function pendingNode(label) {
  const node = cloneTemplate("tpl-assistant-message");
  node.classList.add("pending");
  node.querySelector(".message-tools").remove();
  node.querySelector(".content").textContent = label || "";
  return node;
}

// The node of answer m on the page now (null when it is not shown).
export function nodeOf(m) {
  return els.messages.querySelector(`.assistant-message[data-id="${m.id}"]`);
}

// Shows m.feedback on its node (in place: focus and open panels stay as they are).
export function paintFeedback(node, m) {
  const fb = m.feedback || {};
  setPressed(node.querySelector(".thumb-up"), fb.thumb === "up");
  setPressed(node.querySelector(".thumb-down"), fb.thumb === "down");
  const stars = node.querySelectorAll(".star");
  stars.forEach((star) => {
    const value = parseInt(star.dataset.value, 10);
    star.classList.toggle("on", fb.rating != null && value <= fb.rating);
    star.setAttribute("aria-checked", String(fb.rating === value));
    // roving tabindex: one star in the tab order (the chosen one, else the first)
    star.tabIndex = value === (fb.rating || 1) ? 0 : -1;
  });
  const view = node.querySelector(".correction-view");
  view.hidden = !fb.correction;
  node.querySelector(".correction-text").textContent = fb.correction || "";
  setLabel(node.querySelector(".correct"), fb.correction ? "Edit correction" : "Correct this answer");
  setLabel(node.querySelector(".comment-toggle"), fb.comment ? "Comment \u2713" : "Comment");
}

// Shows m.flag (the user's flag on the answer: {category, label, note} or null) on its node.
export function paintFlag(node, m) {
  const flag = m.flag || null;
  const btn = node.querySelector(".flag-btn");
  setPressed(btn, !!flag);
  btn.setAttribute("aria-label", flag ? `Flagged as harmful: ${flag.label}` : "Flag as harmful");
  btn.title = flag ? `Flagged: ${flag.label}` : "Flag as harmful";
  node.classList.toggle("flagged", !!flag);
  const view = node.querySelector(".flag-view");
  view.hidden = !flag;
  view.querySelector(".flag-view-category").textContent = flag ? flag.label : "";
  const note = view.querySelector(".flag-view-note");
  note.textContent = (flag && flag.note) || "";
  note.hidden = !(flag && flag.note);
}
