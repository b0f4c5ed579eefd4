// The open conversation: a new chat, opening one (its messages as a tree).

import { els, narrow, setTitle } from "./dom.js";
import { closeDrawer } from "./drawer.js";
import { api } from "../http.js";
import { showError } from "./notify.js";
import { render } from "./render.js";
import { renderList } from "./sidebar.js";
import { state } from "./state.js";

export function newChat() {
  if (state.busy) return;
  state.conv = null;
  state.selected = new Map();
  if (location.hash) history.replaceState(null, "", location.pathname);
  setTitle("New chat");
  render({ scroll: "end" });
  renderList();
  if (narrow.matches) closeDrawer(false);
  els.input.focus();
}

export async function openConversation(id, keepSelection) {
  try {
    const data = await api("GET", `/api/conversations/${id}`);
    setConversation(data, keepSelection);
    renderList();
  } catch (e) {
    showError(e.message);
    newChat();
  }
}

function setConversation(data, keepSelection) {
  const messages = new Map(data.messages.map((m) => [m.id, m]));
  const children = new Map();
  for (const m of data.messages) {
    const key = m.parent_id ?? "root";
    if (!children.has(key)) children.set(key, []);
    children.get(key).push(m.id);
  }
  const comparisons = new Map(data.comparisons.map((c) => [c.prompt_message_id, c]));
  const sameConversation = state.conv && state.conv.id === data.id;
  if (!keepSelection || !sameConversation) state.selected = new Map();
  state.conv = { id: data.id, title: data.title, messages, children, comparisons };
  setTitle(data.title);
  if (location.hash !== `#/c/${data.id}`) history.replaceState(null, "", `#/c/${data.id}`);
  render({ scroll: sameConversation ? "keep" : "end" });
}
