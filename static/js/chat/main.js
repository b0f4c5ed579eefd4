// Chat page: conversations (grouped by date, rename, delete), streamed answers rendered as
// markdown, regenerate and edit-and-resend (sibling branches the user pages between), copy,
// feedback and compare; a drawer for the conversation list on small screens.
// Text the user wrote goes into the page through textContent. Model answers are rendered by
// static/js/markdown.js (markdown-it with raw HTML off), never as raw HTML.
// The entry module: binds the page's controls, loads the session and the conversation list.

import { bindAccount, loadSession } from "./account.js";
import { bindActions } from "./actions.js";
import { updateCharCount } from "./composer.js";
import { newChat, openConversation } from "./conversation.js";
import { els, narrow } from "./dom.js";
import { closeDrawer, openDrawer } from "./drawer.js";
import { openCorrection, openFeedbackPanel, saveFeedback, starKeys, thumb, vote } from "./feedback.js";
import { toggleFlagPanel } from "./flags.js";
import { ApiError } from "../http.js";
import { copyWithFeedback, showError } from "./notify.js";
import { atBottom, scrollToEnd, showSibling, updateScrollButton } from "./render.js";
import { regenerate, send, sendEdit } from "./send.js";
import { refreshList } from "./sidebar.js";
import { state } from "./state.js";

const SUGGESTIONS = ["How do I cook rice?", "Any tips to start running?", "How can I save money?",
                     "How do I fix a bug in my code?"];

function bind() {
  els.form.addEventListener("submit", (ev) => { ev.preventDefault(); send(els.input.value); });
  els.input.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) { ev.preventDefault(); send(els.input.value); }
  });
  els.input.addEventListener("input", updateCharCount);
  els.stop.addEventListener("click", () => { if (state.abort) state.abort.abort(); });
  els.newChat.addEventListener("click", newChat);
  els.headerNew.addEventListener("click", newChat);
  els.menu.addEventListener("click", openDrawer);
  els.drawerClose.addEventListener("click", () => closeDrawer());
  els.backdrop.addEventListener("click", () => closeDrawer());
  document.addEventListener("keydown", (ev) => {
    if (ev.key === "Escape" && document.body.classList.contains("drawer-open")) { ev.preventDefault(); closeDrawer(); }
  });
  narrow.addEventListener("change", () => { if (!narrow.matches) closeDrawer(false); });
  els.messages.addEventListener("scroll", () => {
    state.stick = atBottom();
    updateScrollButton();
  }, { passive: true });
  els.scrollDown.addEventListener("click", () => { scrollToEnd(true); els.input.focus({ preventScroll: true }); });
  // copy buttons of code blocks (inside rendered markdown, so one listener for all)
  els.messages.addEventListener("click", (ev) => {
    const button = ev.target.closest(".code-copy");
    if (!button) return;
    const code = button.closest(".code-block").querySelector("pre code");
    copyWithFeedback(button, code ? code.textContent.replace(/\n$/, "") : "");
  });
  window.addEventListener("hashchange", routeFromHash);
  for (const text of SUGGESTIONS) {
    const b = document.createElement("button");
    b.type = "button";
    b.className = "chip suggestion";
    b.textContent = text;
    b.addEventListener("click", () => send(text));
    els.suggestions.append(b);
  }
}

function routeFromHash() {
  const match = /^#\/c\/(\d+)$/.exec(location.hash);
  if (match) {
    const id = parseInt(match[1], 10);
    if (!state.conv || state.conv.id !== id) openConversation(id, false);
  }
}

async function start() {
  // what the controls of the conversation's nodes and of the list do (see actions.js)
  bindActions({ newChat, openCorrection, openFeedbackPanel, regenerate, saveFeedback, sendEdit, showSibling, starKeys,
                thumb, toggleFlagPanel, vote });
  bind();
  bindAccount();
  updateCharCount();
  try {
    await loadSession();
    await refreshList();
    routeFromHash();
  } catch (e) {
    if (e instanceof ApiError && e.status === 429) {
      // e.g. too many new visitors from this address: say so where it stays readable, offer to sign in
      els.sessionProblemText.textContent = e.message;
      els.sessionProblem.hidden = false;
    } else {
      showError(`Could not reach the server: ${e.message}`);
    }
  }
  document.body.classList.add("ready");
  els.input.focus();
}

start();
