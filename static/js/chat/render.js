// Draws the visible path into #messages, keeping the focus and the scroll position; pages between
// sibling branches.

import { visiblePath } from "./branches.js";
import { els, reducedMotion } from "./dom.js";
import { assistantNode, compareNode, userNode } from "./messages.js";
import { state } from "./state.js";

const NEAR_BOTTOM_PX = 80;   // closer than this to the end counts as "at the bottom"

// Which control had the focus (message position + data-key), so a re-render can give it back.
function focusKey() {
  const el = document.activeElement;
  if (!el || !els.messages.contains(el) || !el.dataset.key) return null;
  const article = el.closest(".message");
  const index = Array.prototype.indexOf.call(els.messages.querySelectorAll(".message"), article);
  return index >= 0 ? { index, key: el.dataset.key } : null;
}

const FOCUS_FALLBACK = { "sibling-prev": "sibling-next", "sibling-next": "sibling-prev", "q-prev": "q-next",
                         "q-next": "q-prev" };

function restoreFocus(saved) {
  if (!saved) return;
  const article = els.messages.querySelectorAll(".message")[saved.index];
  if (!article) return;
  for (const key of [saved.key, FOCUS_FALLBACK[saved.key]]) {
    const el = key && article.querySelector(`[data-key="${key}"]`);
    if (el && !el.disabled) { el.focus({ preventScroll: true }); return; }
  }
}

// scroll: "end" shows the newest message; "keep" leaves the view where it is.
export function render({ scroll = "keep" } = {}) {
  const saved = focusKey();
  const top = els.messages.scrollTop;
  const path = visiblePath();
  els.messages.replaceChildren();
  if (!path.length) {
    els.messages.append(els.welcome);
  }
  for (const m of path) {
    if (m.role === "user") {
      els.messages.append(userNode(m));
      const pair = state.conv.comparisons.get(m.id);
      if (pair && !pair.winner) {
        els.messages.append(compareNode(pair));
        break; // the conversation continues once the user has picked an answer
      }
    } else {
      els.messages.append(assistantNode(m));
    }
  }
  if (scroll === "end") scrollToEnd(); else els.messages.scrollTop = top;
  restoreFocus(saved);
  updateScrollButton();
}

export function atBottom() {
  const box = els.messages;
  return box.scrollHeight - box.scrollTop - box.clientHeight < NEAR_BOTTOM_PX;
}

export function scrollToEnd(smooth) {
  els.messages.scrollTo({ top: els.messages.scrollHeight, behavior: smooth && !reducedMotion.matches ? "smooth" : "auto" });
  state.stick = true;
  updateScrollButton();
}

export function updateScrollButton() {
  els.scrollDown.hidden = atBottom();
}

// Pages to another sibling (answer or question variant); not while an answer streams in.
export function showSibling(parentKey, id) {
  if (state.busy) return;
  state.selected.set(parentKey, id);
  render();
}
