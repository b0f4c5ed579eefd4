// The sidebar's conversation list: grouped by date, renamed in place, deleted. Deleting the open
// conversation starts a new chat through actions.js (conversation.js draws this list).

import { actions } from "./actions.js";
import { cloneTemplate, els, narrow, setTitle } from "./dom.js";
import { closeDrawer } from "./drawer.js";
import { api } from "../http.js";
import { announce, showError } from "./notify.js";
import { state } from "./state.js";

export async function refreshList() {
  const data = await api("GET", "/api/conversations");
  state.conversations = data.conversations;
  renderList();
}

// "Today", "Yesterday", "Previous 7 days", "Previous 30 days", then "March 2025" (local calendar days).
function dateGroup(iso, now) {
  const when = new Date(iso);
  const day = (d) => new Date(d.getFullYear(), d.getMonth(), d.getDate());
  const days = Math.round((day(now) - day(when)) / 86400000);
  if (days <= 0) return "Today";
  if (days === 1) return "Yesterday";
  if (days <= 7) return "Previous 7 days";
  if (days <= 30) return "Previous 30 days";
  return when.toLocaleDateString("en-US", { month: "long", year: "numeric" });
}

export function renderList() {
  if (state.renaming) return; // the list is drawn again once the title is saved
  const focusedKey = listFocusKey();
  els.list.replaceChildren();
  const now = new Date();
  let group = null;
  let label = null;
  for (const c of state.conversations) {
    const name = dateGroup(c.updated_at || c.created_at, now);
    if (name !== label) {
      label = name;
      group = document.createElement("section");
      group.className = "conversation-group";
      const heading = document.createElement("h2");
      heading.className = "group-label";
      heading.textContent = name;
      const list = document.createElement("ul");
      list.className = "conversation-list";
      group.append(heading, list);
      els.list.append(group);
    }
    group.querySelector("ul").append(conversationItem(c));
  }
  els.empty.hidden = state.conversations.length > 0;
  if (focusedKey) {
    const el = els.list.querySelector(`.conversation-item[data-id="${focusedKey.id}"] .${focusedKey.cls}`);
    if (el) el.focus();
  }
}

function listFocusKey() {
  const el = document.activeElement;
  const item = el && el.closest && el.closest(".conversation-item");
  if (!item || !els.list.contains(item)) return null;
  const cls = ["conversation-link", "rename-conversation", "delete-conversation"].find((k) => el.classList.contains(k));
  return cls ? { id: item.dataset.id, cls } : null;
}

function conversationItem(c) {
  const li = cloneTemplate("tpl-conversation-item");
  const active = state.conv && state.conv.id === c.id;
  li.classList.toggle("active", Boolean(active));
  li.dataset.id = c.id;
  const open = li.querySelector(".conversation-link");
  open.href = `#/c/${c.id}`;
  open.textContent = c.title;
  open.title = c.title;
  if (active) open.setAttribute("aria-current", "page");
  open.addEventListener("click", () => { if (narrow.matches) closeDrawer(false); });
  const rename = li.querySelector(".rename-conversation");
  rename.setAttribute("aria-label", `Rename conversation ${c.title}`);
  rename.addEventListener("click", () => startRename(c, li));
  const del = li.querySelector(".delete-conversation");
  del.setAttribute("aria-label", `Delete conversation ${c.title}`);
  del.addEventListener("click", (ev) => { ev.preventDefault(); deleteConversation(c); });
  return li;
}

function startRename(c, li) {
  state.renaming = c.id;
  const link = li.querySelector(".conversation-link");
  const input = document.createElement("input");
  input.type = "text";
  input.className = "rename-input";
  input.value = c.title;
  input.maxLength = 200;
  input.setAttribute("aria-label", "Conversation title");
  link.replaceWith(input);
  li.classList.add("renaming");
  input.focus();
  input.select();
  let finished = false;
  const finish = async (save) => {
    if (finished) return;
    finished = true;
    state.renaming = null;
    const title = input.value.trim();
    if (save && title && title !== c.title) {
      try {
        const data = await api("PATCH", `/api/conversations/${c.id}`, { title });
        c.title = data.title;
        if (state.conv && state.conv.id === c.id) setTitle(data.title);
        announce(`Renamed to ${data.title}.`);
      } catch (e) { showError(e.message); }
    }
    renderList();
    const again = els.list.querySelector(`.conversation-item[data-id="${c.id}"] .rename-conversation`);
    if (again && (document.activeElement === document.body || !document.activeElement)) again.focus();
  };
  input.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter") { ev.preventDefault(); finish(true); }
    else if (ev.key === "Escape") { ev.preventDefault(); ev.stopPropagation(); finish(false); }
  });
  input.addEventListener("blur", () => finish(true));
}

async function deleteConversation(c) {
  if (!window.confirm(`Delete "${c.title}"? This cannot be undone.`)) return;
  try {
    await api("DELETE", `/api/conversations/${c.id}`);
    if (state.conv && state.conv.id === c.id) actions.newChat();
    await refreshList();
    announce(`Deleted ${c.title}.`);
  } catch (e) { showError(e.message); }
}
