// Sending: a new question (streamed, or two answers to compare), an edited question, a regenerated
// answer; the composer's buttons while an answer is on its way.

import { lastAnswerId } from "./branches.js";
import { updateCharCount } from "./composer.js";
import { openConversation } from "./conversation.js";
import { els, maxChars } from "./dom.js";
import { api } from "../http.js";
import { pendingNode, userNode } from "./messages.js";
import { announce, showError } from "./notify.js";
import { render, scrollToEnd } from "./render.js";
import { refreshList } from "./sidebar.js";
import { state } from "./state.js";
import { stream } from "./stream.js";

function setBusy(busy) {
  state.busy = busy;
  els.send.hidden = busy;
  els.stop.hidden = !busy;
  els.input.disabled = false;
  els.messages.querySelectorAll(".regenerate, .vote, .edit-question, .send-edit").forEach((b) => { b.disabled = busy; });
  if (!busy && els.stop.contains(document.activeElement)) els.input.focus();
  if (busy && document.activeElement === els.send) els.stop.focus();
}

async function ensureConversation() {
  if (state.conv) return state.conv.id;
  const data = await api("POST", "/api/conversations", {});
  state.conv = { id: data.id, title: data.title, messages: new Map(), children: new Map(), comparisons: new Map() };
  history.replaceState(null, "", `#/c/${data.id}`);
  return data.id;
}

export async function send(text) {
  text = text.trim();
  if (!text || state.busy) return;
  if (text.length > maxChars) { showError(`Your message is too long (${text.length} of ${maxChars} characters).`); return; }
  const parentId = lastAnswerId();
  const chosenCompare = els.compare.checked;
  const compare = chosenCompare || (state.compareRate > 0 && Math.random() < state.compareRate);
  els.compare.checked = false; // one-shot: a compare is asked for per message
  setBusy(true);
  els.input.value = "";
  updateCharCount();
  try {
    const convId = await ensureConversation();
    if (compare) {
      els.messages.querySelector(".welcome")?.remove();
      els.messages.append(userNode({ content: text }), pendingNode("Writing two answers..."));
      scrollToEnd();
      const data = await api("POST", `/api/conversations/${convId}/compare`, { content: text, parent_id: parentId });
      await openConversation(convId, true);
      state.selected.set(data.user_message.parent_id ?? "root", data.user_message.id);
      render({ scroll: "end" });
      announce("Two answers are ready: pick the better one.");
    } else {
      await stream(`/api/conversations/${convId}/messages`, { content: text, parent_id: parentId },
                   { userText: text });
    }
    await refreshList();
  } catch (e) {
    showError(e.message);
    els.input.value = text; // never lose what the user typed
    if (chosenCompare) els.compare.checked = true;
    updateCharCount();
    if (state.conv) await openConversation(state.conv.id, true);
  } finally {
    setBusy(false);
  }
}

export async function sendEdit(m, node, text) {
  text = text.trim();
  if (!text || state.busy) return;
  if (text.length > maxChars) { showError(`Your message is too long (${text.length} of ${maxChars} characters).`); return; }
  setBusy(true);
  let done = null;
  try {
    done = await stream(`/api/messages/${m.id}/edit`, { content: text },
                        { userText: text, replaceFrom: node, parentKey: m.parent_id ?? "root" });
    await refreshList();
  } catch (e) {
    showError(e.message);
    await openConversation(state.conv.id, true);
  } finally {
    setBusy(false);
  }
  if (done) els.messages.querySelector(`.user-message[data-id="${done.user_message_id}"] .edit-question`)?.focus();
}

export async function regenerate(m) {
  if (state.busy) return;
  setBusy(true);
  let done = null;
  try {
    done = await stream(`/api/messages/${m.id}/regenerate`, {}, { replacing: m });
  } catch (e) {
    showError(e.message);
    await openConversation(state.conv.id, true);
  } finally {
    setBusy(false);
  }
  // the focus stays on Regenerate (of the new answer), so the next Enter or click does the same
  if (done) els.messages.querySelector(`.assistant-message[data-id="${done.message_id}"] .regenerate`)?.focus();
}
