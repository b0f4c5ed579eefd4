// Chat page: conversations (grouped by date, rename, delete), streamed answers rendered as
// markdown, regenerate and edit-and-resend (sibling branches the user pages between), copy,
// feedback and compare; a drawer for the conversation list on small screens.
// Text the user wrote goes into the page through textContent. Model answers are rendered by
// ChatMarkdown (static/js/markdown.js: markdown-it with raw HTML off), never as raw HTML.
"use strict";

(() => {
  // the reason chips, as the server defines them (webapp/core/validation.py)
  const REASONS_UP = JSON.parse(document.body.dataset.reasonsUp || "[]");
  const REASONS_DOWN = JSON.parse(document.body.dataset.reasonsDown || "[]");
  const SUGGESTIONS = ["How do I cook rice?", "Any tips to start running?", "How can I save money?",
                       "How do I fix a bug in my code?"];
  const NEAR_BOTTOM_PX = 80;   // closer than this to the end counts as "at the bottom"
  const COPIED_MS = 2000;      // how long "Copied" shows

  const $ = (id) => document.getElementById(id);
  const els = {
    list: $("conversation-list"), empty: $("sidebar-empty"), newChat: $("new-chat"), title: $("chat-title"),
    messages: $("messages"), welcome: $("welcome"), suggestions: $("suggestions"), form: $("composer"),
    input: $("composer-input"), send: $("send-button"), stop: $("stop-button"), compare: $("compare-toggle"),
    toast: $("toast"), badge: $("model-badge"), charCount: $("char-count"), announcer: $("announcer"),
    sidebar: $("sidebar"), main: $("chat-main"), menu: $("menu-button"), drawerClose: $("drawer-close"),
    backdrop: $("drawer-backdrop"), headerNew: $("header-new-chat"), scrollDown: $("scroll-down"),
    badgeBox: $("sidebar-footer"),
    accountStatus: $("account-status"), signIn: $("sign-in-button"), register: $("register-button"),
    signOut: $("sign-out-button"), accountDialog: $("account-dialog"), accountForm: $("account-form"),
    accountTitle: $("account-dialog-title"), accountExplain: $("account-explain"), accountUser: $("account-username"),
    accountPassword: $("account-password"), accountError: $("account-error"), accountSubmit: $("account-submit"),
    accountCancel: $("account-cancel"), accountSwitch: $("account-switch"), usernameRules: $("account-username-rules"),
    passwordRules: $("account-password-rules"), sessionProblem: $("session-problem"),
    sessionProblemText: $("session-problem-text"), sessionProblemSignIn: $("session-problem-sign-in"),
  };
  const maxChars = parseInt(document.body.dataset.maxChars || "4000", 10);
  const narrow = window.matchMedia("(max-width: 720px)");
  const reducedMotion = window.matchMedia("(prefers-reduced-motion: reduce)");

  const state = {
    // the page's own token (works before /api/session answers, e.g. to sign in when it refuses)
    csrf: (document.querySelector('meta[name="csrf-token"]') || {}).content || null,
    compareRate: 0,        // share of questions answered side by side while an experiment runs
    conversations: [],
    conv: null,            // {id, title, messages: Map, children: Map, comparisons: Map}
    selected: new Map(),   // parentKey -> chosen child id (which sibling is shown)
    busy: false,
    abort: null,
    stick: true,           // keep the newest text in view while it streams (false once the user scrolls up)
    renaming: null,        // id of the conversation whose title is being edited
  };

  // ------------------------------------------------------------------ HTTP

  class ApiError extends Error {
    constructor(message, status) { super(message); this.status = status; }
  }

  async function api(method, url, body) {
    const opts = { method, headers: { "Accept": "application/json" }, credentials: "same-origin" };
    if (method !== "GET") opts.headers["X-CSRFToken"] = state.csrf;
    if (body !== undefined) {
      opts.headers["Content-Type"] = "application/json";
      opts.body = JSON.stringify(body);
    }
    const resp = await fetch(url, opts);
    let data = null;
    try { data = await resp.json(); } catch (e) { /* empty body */ }
    if (!resp.ok) throw new ApiError((data && data.error) || `Request failed (${resp.status})`, resp.status);
    return data;
  }

  function showError(message) {
    els.toast.textContent = message;
    els.toast.hidden = false;
    clearTimeout(showError.timer);
    showError.timer = setTimeout(() => { els.toast.hidden = true; }, 6000);
  }

  // The live region: new answers (and "Copied") are read out; the history on load is not.
  function announce(text) {
    els.announcer.textContent = text;
  }

  function cloneTemplate(id) {
    return $(id).content.firstElementChild.cloneNode(true);
  }

  // ------------------------------------------------------------------ copy

  async function copyText(text) {
    if (navigator.clipboard && window.isSecureContext) {
      await navigator.clipboard.writeText(text);
      return;
    }
    const helper = document.createElement("textarea");  // older browsers, plain http on a LAN address
    helper.value = text;
    helper.setAttribute("readonly", "");
    helper.className = "clipboard-helper";
    document.body.append(helper);
    helper.select();
    const ok = document.execCommand("copy");
    helper.remove();
    if (!ok) throw new Error("copy refused");
  }

  async function copyWithFeedback(button, text) {
    try {
      await copyText(text);
    } catch (e) {
      showError("Could not copy to the clipboard.");
      return;
    }
    button.classList.add("copied");
    const tip = button.querySelector(".copy-tip");
    if (tip) tip.hidden = false; else button.textContent = "Copied";
    announce("Copied to the clipboard.");
    clearTimeout(button.copiedTimer);
    button.copiedTimer = setTimeout(() => {
      button.classList.remove("copied");
      if (tip) tip.hidden = true; else button.textContent = "Copy";
    }, COPIED_MS);
  }

  // ------------------------------------------------------------------ conversations

  async function loadSession() {
    const data = await api("GET", "/api/session");
    state.csrf = data.csrf_token;
    state.compareRate = data.compare_rate || 0;
    showAccount(data.username, data.is_admin);
    // Arms are blind: only an admin is told the version and arm (the badge stays hidden for everyone else).
    if (data.is_admin) {
      const arm = data.arm ? ` · ${data.arm}` : "";
      els.badge.textContent = data.model_version ? `Model ${data.model_version}${arm}` : "No model yet";
      els.badgeBox.hidden = false;
    }
  }

  async function refreshList() {
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

  function renderList() {
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
      if (state.conv && state.conv.id === c.id) newChat();
      await refreshList();
      announce(`Deleted ${c.title}.`);
    } catch (e) { showError(e.message); }
  }

  function setTitle(title) {
    els.title.textContent = title;
    document.title = title === "New chat" ? "Chat" : `${title} · Chat`;
  }

  function newChat() {
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

  async function openConversation(id, keepSelection) {
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

  // ------------------------------------------------------------------ the visible path

  function defaultChild(parentKey, ids) {
    const pair = state.conv.comparisons.get(parentKey);
    if (pair && pair.winner) return pair.winner === "b" ? pair.b : pair.a;
    return ids[ids.length - 1];
  }

  function chosenChild(parentKey) {
    const ids = state.conv.children.get(parentKey) || [];
    if (!ids.length) return null;
    const chosen = state.selected.get(parentKey);
    return ids.includes(chosen) ? chosen : defaultChild(parentKey, ids);
  }

  function visiblePath() {
    const path = [];
    if (!state.conv) return path;
    let key = "root";
    for (;;) {
      const id = chosenChild(key);
      if (id == null) break;
      path.push(state.conv.messages.get(id));
      key = id;
    }
    return path;
  }

  function lastAnswerId() {
    const path = visiblePath();
    for (let i = path.length - 1; i >= 0; i--) if (path[i].role === "assistant") return path[i].id;
    return null;
  }

  function siblingsOf(m) {
    return state.conv.children.get(m.parent_id ?? "root") || [m.id];
  }

  // ------------------------------------------------------------------ rendering

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
  function render({ scroll = "keep" } = {}) {
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

  function atBottom() {
    const box = els.messages;
    return box.scrollHeight - box.scrollTop - box.clientHeight < NEAR_BOTTOM_PX;
  }

  function scrollToEnd(smooth) {
    els.messages.scrollTo({ top: els.messages.scrollHeight, behavior: smooth && !reducedMotion.matches ? "smooth" : "auto" });
    state.stick = true;
    updateScrollButton();
  }

  function updateScrollButton() {
    els.scrollDown.hidden = atBottom();
  }

  function userNode(m) {
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
      prev.addEventListener("click", () => showSibling(key, siblings[pos - 1]));
      next.addEventListener("click", () => showSibling(key, siblings[pos + 1]));
    }
    const copy = node.querySelector(".copy-question");
    copy.addEventListener("click", () => copyWithFeedback(copy, m.content));
    const edit = node.querySelector(".edit-question");
    edit.disabled = state.busy;
    edit.addEventListener("click", () => openEdit(m, node));
    return node;
  }

  // Pages to another sibling (answer or question variant); not while an answer streams in.
  function showSibling(parentKey, id) {
    if (state.busy) return;
    state.selected.set(parentKey, id);
    render();
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
    form.onsubmit = (ev) => { ev.preventDefault(); sendEdit(m, node, input.value); };
    input.onkeydown = (ev) => {
      if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) { ev.preventDefault(); sendEdit(m, node, input.value); }
      else if (ev.key === "Escape") { ev.preventDefault(); close(); }
    };
  }

  function assistantNode(m) {
    const node = cloneTemplate("tpl-assistant-message");
    node.dataset.id = m.id;
    ChatMarkdown.update(node.querySelector(".content"), m.content);

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
      prev.addEventListener("click", () => showSibling(m.parent_id, siblings[pos - 1]));
      next.addEventListener("click", () => showSibling(m.parent_id, siblings[pos + 1]));
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
    node.querySelector(".thumb-up").addEventListener("click", () => thumb(m, "up"));
    node.querySelector(".thumb-down").addEventListener("click", () => thumb(m, "down"));
    node.querySelector(".flag-btn").addEventListener("click", () => toggleFlagPanel(m, node));
    const stars = node.querySelector(".stars");
    stars.querySelectorAll(".star").forEach((star) => {
      const value = parseInt(star.dataset.value, 10);
      star.addEventListener("click", () => {
        const current = m.feedback && m.feedback.rating;
        saveFeedback(m, { rating: current === value ? null : value });
      });
    });
    stars.addEventListener("keydown", (ev) => starKeys(ev, m));
    node.querySelector(".correct").addEventListener("click", () => openCorrection(m, node));
    node.querySelector(".comment-toggle").addEventListener("click", () =>
      openFeedbackPanel(m, node, m.feedback && m.feedback.thumb, "comment"));
    const regen = node.querySelector(".regenerate");
    regen.disabled = state.busy;
    regen.addEventListener("click", () => regenerate(m));

    const meta = []; // the version and arm come with an answer for admins only (blind arms)
    if (m.model_version) meta.push(m.model_version);
    if (m.arm) meta.push(m.arm);
    node.querySelector(".meta").textContent = meta.join(" \u00b7 ");
    paintFeedback(node, m);
    paintFlag(node, m);
    return node;
  }

  // Shows m.feedback on its node (in place: focus and open panels stay as they are).
  function paintFeedback(node, m) {
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

  // The text of a button that also holds an icon.
  function setLabel(button, text) {
    for (const child of Array.from(button.childNodes)) if (child.nodeType === Node.TEXT_NODE) child.remove();
    button.append(text);
  }

  function nodeOf(m) {
    return els.messages.querySelector(`.assistant-message[data-id="${m.id}"]`);
  }

  function setPressed(btn, on) {
    btn.classList.toggle("on", on);
    btn.setAttribute("aria-pressed", String(on));
  }

  // Radio-group keys: arrows move the rating (and the focus) by one star, Home/End to 1/5.
  function starKeys(ev, m) {
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

  function compareNode(pair) {
    const node = cloneTemplate("tpl-compare");
    node.dataset.pairId = pair.id;
    ChatMarkdown.update(node.querySelector('[data-side="a"] .bubble'), state.conv.messages.get(pair.a).content);
    ChatMarkdown.update(node.querySelector('[data-side="b"] .bubble'), state.conv.messages.get(pair.b).content);
    node.querySelectorAll(".vote").forEach((btn) => {
      btn.disabled = state.busy;
      btn.addEventListener("click", () => vote(pair, btn.dataset.winner));
    });
    return node;
  }

  // ------------------------------------------------------------------ feedback

  // Shows the change at once, then stores it; one message's saves go out one after the other,
  // so the last click wins. A failed save reloads what the server has.
  function saveFeedback(m, changes) {
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

  async function thumb(m, value) {
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
  function openFeedbackPanel(m, node, thumbValue, opener) {
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

  // ------------------------------------------------------------------ flags

  // Shows m.flag (the user's flag on the answer: {category, label, note} or null) on its node.
  function paintFlag(node, m) {
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

  function toggleFlagPanel(m, node) {
    const panel = node.querySelector(".flag-panel");
    if (panel.hidden) openFlagPanel(m, node); else closeFlagPanel(node);
  }

  function closeFlagPanel(node, focusButton = true) {
    node.querySelector(".flag-panel").hidden = true;
    const btn = node.querySelector(".flag-btn");
    btn.setAttribute("aria-expanded", "false");
    if (focusButton) btn.focus();
  }

  // The category menu (a radio group: arrows move, Space/Enter/click choose), an optional note,
  // then "Flag answer" / "Remove flag" (when flagged) / "Cancel"; Escape cancels.
  function openFlagPanel(m, node) {
    const panel = node.querySelector(".flag-panel");
    const choices = Array.from(panel.querySelectorAll(".flag-choice"));
    const error = panel.querySelector(".flag-error");
    const note = panel.querySelector(".flag-note-input");
    const save = panel.querySelector(".save-flag");
    const remove = panel.querySelector(".remove-flag");
    let chosen = m.flag ? m.flag.category : null;
    const paintChoices = () => {
      choices.forEach((c, i) => {
        const on = c.dataset.value === chosen;
        c.classList.toggle("on", on);
        c.setAttribute("aria-checked", String(on));
        // roving tabindex: the chosen category (else the first) is the one in the tab order
        c.tabIndex = on || (!chosen && i === 0) ? 0 : -1;
      });
    };
    const showFlagError = (text) => { error.textContent = text; error.hidden = !text; };
    choices.forEach((c, i) => {
      c.onclick = () => { chosen = c.dataset.value; paintChoices(); showFlagError(""); };
      c.onkeydown = (ev) => {
        const moves = { ArrowRight: i + 1, ArrowDown: i + 1, ArrowLeft: i - 1, ArrowUp: i - 1,
                        Home: 0, End: choices.length - 1 };
        if (!(ev.key in moves)) return;
        ev.preventDefault();
        const next = choices[(moves[ev.key] + choices.length) % choices.length];
        chosen = next.dataset.value;
        paintChoices();
        next.focus();
      };
    });
    note.value = (m.flag && m.flag.note) || "";
    save.textContent = m.flag ? "Update flag" : "Flag answer";
    remove.hidden = !m.flag;
    showFlagError("");
    paintChoices();
    panel.hidden = false;
    node.querySelector(".flag-btn").setAttribute("aria-expanded", "true");
    (choices.find((c) => c.tabIndex === 0) || choices[0]).focus();

    const busy = (on) => { save.disabled = on; remove.disabled = on; };
    save.onclick = async () => {
      if (!chosen) { showFlagError("Choose what is wrong with this answer."); return; }
      busy(true);
      try {
        const data = await api("POST", `/api/messages/${m.id}/flag`, { category: chosen, note: note.value });
        m.flag = data.flag;
        const target = nodeOf(m) || node; // re-rendered meanwhile: the node on the page now
        paintFlag(target, m);
        closeFlagPanel(target);
        announce(`Answer flagged: ${m.flag.label}.`);
      } catch (e) {
        showFlagError(`Could not flag the answer: ${e.message}`);
      } finally { busy(false); }
    };
    remove.onclick = async () => {
      busy(true);
      try {
        await api("DELETE", `/api/messages/${m.id}/flag`);
        m.flag = null;
        const target = nodeOf(m) || node;
        paintFlag(target, m);
        closeFlagPanel(target);
        announce("Flag removed.");
      } catch (e) {
        showFlagError(`Could not remove the flag: ${e.message}`);
      } finally { busy(false); }
    };
    panel.querySelector(".cancel-flag").onclick = () => closeFlagPanel(node);
    panel.onkeydown = (ev) => { if (ev.key === "Escape") { ev.preventDefault(); closeFlagPanel(node); } };
  }

  function openCorrection(m, node) {
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

  async function vote(pair, winner) {
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

  // ------------------------------------------------------------------ sending and streaming

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

  async function send(text) {
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

  async function sendEdit(m, node, text) {
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

  function pendingNode(label) {
    const node = cloneTemplate("tpl-assistant-message");
    node.classList.add("pending");
    node.querySelector(".message-tools").remove();
    node.querySelector(".content").textContent = label || "";
    return node;
  }

  async function regenerate(m) {
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

  // Streams one answer: renders it (markdown) as it arrives, then reloads the conversation.
  //   opts.userText: a new question shown above the answer; opts.replacing: the answer a
  //   regenerated one replaces on screen; opts.replaceFrom: the question node an edited question
  //   replaces (with everything below it); opts.parentKey: where the edited question branches.
  async function stream(url, body, opts) {
    const convId = state.conv.id;
    const live = pendingNode("");
    live.classList.add("streaming");
    live.setAttribute("aria-busy", "true");
    const content = live.querySelector(".content");
    if (opts.replacing) {
      const old = nodeOf(opts.replacing);
      if (old) {
        const tools = old.querySelector(".message-tools");
        // keep the answer's height and its action row in place until the new text arrives
        live.append(tools.cloneNode(true));
        live.querySelectorAll(".message-tools button").forEach((b) => { b.disabled = true; });
        live.querySelector(".message-tools").setAttribute("aria-hidden", "true");
        old.replaceWith(live);
      } else {
        els.messages.append(live);
      }
    } else if (opts.replaceFrom) {
      while (opts.replaceFrom.nextSibling) opts.replaceFrom.nextSibling.remove();
      opts.replaceFrom.replaceWith(userNode({ content: opts.userText }));
      els.messages.append(live);
    } else {
      els.messages.querySelector(".welcome")?.remove();
      els.messages.append(userNode({ content: opts.userText }), live);
    }
    if (!opts.replacing) scrollToEnd();
    else updateScrollButton();

    let text = "";
    let frame = 0;
    const paint = () => {
      frame = 0;
      ChatMarkdown.update(content, text);
      if (state.stick) scrollToEnd(); else updateScrollButton();
    };

    state.abort = new AbortController();
    let done = null;
    let failure = null;
    try {
      const resp = await fetch(url, {
        method: "POST", credentials: "same-origin", signal: state.abort.signal,
        headers: { "Content-Type": "application/json", "Accept": "text/event-stream", "X-CSRFToken": state.csrf },
        body: JSON.stringify(body),
      });
      if (!resp.ok) {
        let data = null;
        try { data = await resp.json(); } catch (e) { /* not JSON */ }
        throw new ApiError((data && data.error) || `Request failed (${resp.status})`);
      }
      const reader = resp.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const { value, done: end } = await reader.read();
        if (end) break;
        buffer += decoder.decode(value, { stream: true });
        let sep;
        while ((sep = buffer.indexOf("\n\n")) >= 0) {
          const raw = buffer.slice(0, sep);
          buffer = buffer.slice(sep + 2);
          const event = parseEvent(raw);
          if (!event) continue;
          if (event.type === "token") {
            text += event.data.text;
            if (!frame) frame = requestAnimationFrame(paint); // at most one render per frame
          } else if (event.type === "rail") {
            // the safety rail blocked the answer: the bubble shows the refusal (or empties for a new attempt)
            text = event.data.text || "";
            if (!frame) frame = requestAnimationFrame(paint);
          } else if (event.type === "done") done = event.data;
          else if (event.type === "error") failure = event.data.error;
        }
      }
    } catch (e) {
      if (e.name !== "AbortError") throw e;
    } finally {
      state.abort = null;
      if (frame) { cancelAnimationFrame(frame); paint(); }
    }
    if (failure) throw new ApiError(failure);
    const stick = state.stick;
    if (done) {
      await openConversation(convId, true);
      if (opts.parentKey !== undefined) state.selected.set(opts.parentKey, done.user_message_id);
      state.selected.set(done.user_message_id, done.message_id);
      render({ scroll: stick ? "end" : "keep" });
      announce(`Answer: ${done.content}`);
      return done;
    } else {
      // stopped: the server keeps the partial answer; give it a moment to store it
      await new Promise((r) => setTimeout(r, 400));
      await openConversation(convId, true);
      if (opts.userText && !opts.replaceFrom
          && !visiblePath().some((m) => m.role === "user" && m.content === opts.userText.trim())) {
        els.input.value = opts.userText; // nothing was kept: give the text back
        updateCharCount();
      }
      return null;
    }
  }

  function parseEvent(raw) {
    let type = "message";
    const data = [];
    for (const line of raw.split("\n")) {
      if (line.startsWith("event:")) type = line.slice(6).trim();
      else if (line.startsWith("data:")) data.push(line.slice(5).trimStart());
    }
    if (!data.length) return null;
    try { return { type, data: JSON.parse(data.join("\n")) }; } catch (e) { return null; }
  }

  // ------------------------------------------------------------------ account (register, sign in, sign out)

  function showAccount(username, isAdmin) {
    const signedIn = Boolean(username);
    els.accountStatus.textContent = signedIn ? `Signed in as ${isAdmin ? "admin " : ""}${username}` : "Not signed in";
    els.signIn.hidden = signedIn;
    els.register.hidden = signedIn;
    els.signOut.hidden = !signedIn;
  }

  function openAccountDialog(mode) {
    const register = mode === "register";
    els.accountDialog.dataset.mode = mode;
    els.accountTitle.textContent = register ? "Create an account" : "Sign in";
    els.accountExplain.textContent = register
      ? "Your conversations in this browser become your account's: sign in on any device to see them."
      : "Sign in to see your account's conversations. Chats you had here without signing in are not moved into it.";
    els.accountSubmit.textContent = register ? "Create account" : "Sign in";
    els.accountSwitch.textContent = register ? "Already have an account? Sign in" : "No account yet? Create one";
    els.accountPassword.autocomplete = register ? "new-password" : "current-password";
    els.usernameRules.hidden = !register;
    els.passwordRules.hidden = !register;
    els.accountError.hidden = true;
    els.accountError.textContent = "";
    if (!els.accountDialog.open) {
      els.accountDialog.returnFocus = document.activeElement;
      if (narrow.matches) closeDrawer(false);
      els.accountDialog.showModal();
    }
    els.accountUser.focus();
  }

  async function submitAccount() {
    const register = els.accountDialog.dataset.mode === "register";
    const body = { username: els.accountUser.value.trim(), password: els.accountPassword.value };
    els.accountSubmit.disabled = true;
    try {
      const data = await api("POST", register ? "/api/account/register" : "/api/account/login", body);
      els.accountPassword.value = "";
      if (data.csrf_token) state.csrf = data.csrf_token;  // signing in starts a new CSRF token
      if (register) {  // the same user, now with an account: nothing else on the page changes
        els.accountDialog.close();
        showAccount(data.username, false);
        announce(`Account created. You are signed in as ${data.username}.`);
        return;
      }
      window.location.assign("/");  // another user's conversations: start the page over
    } catch (e) {
      els.accountError.textContent = e.message;
      els.accountError.hidden = false;
    } finally {
      els.accountSubmit.disabled = false;
    }
  }

  async function signOut() {
    try {
      await api("POST", "/api/account/logout");
      window.location.assign("/");
    } catch (e) {
      showError(e.message);
    }
  }

  function bindAccount() {
    els.signIn.addEventListener("click", () => openAccountDialog("login"));
    els.register.addEventListener("click", () => openAccountDialog("register"));
    els.sessionProblemSignIn.addEventListener("click", () => openAccountDialog("login"));
    els.signOut.addEventListener("click", signOut);
    els.accountSwitch.addEventListener("click", () =>
      openAccountDialog(els.accountDialog.dataset.mode === "register" ? "login" : "register"));
    els.accountCancel.addEventListener("click", () => els.accountDialog.close());
    els.accountForm.addEventListener("submit", (ev) => { ev.preventDefault(); submitAccount(); });
    els.accountDialog.addEventListener("close", () => {
      const back = els.accountDialog.returnFocus;
      if (back && document.contains(back) && back.offsetParent !== null) back.focus();
    });
  }

  // ------------------------------------------------------------------ drawer (small screens)

  function openDrawer() {
    document.body.classList.add("drawer-open");
    els.menu.setAttribute("aria-expanded", "true");
    els.backdrop.hidden = false;
    els.main.inert = true; // focus stays in the drawer; the page behind is out of reach
    const current = els.list.querySelector(".conversation-item.active .conversation-link");
    (current || els.drawerClose).focus();
  }

  function closeDrawer(returnFocus = true) {
    if (!document.body.classList.contains("drawer-open")) return;
    document.body.classList.remove("drawer-open");
    els.menu.setAttribute("aria-expanded", "false");
    els.backdrop.hidden = true;
    els.main.inert = false;
    if (returnFocus) els.menu.focus();
  }

  // ------------------------------------------------------------------ composer

  function updateCharCount() {
    const n = els.input.value.length;
    els.charCount.textContent = n > maxChars * 0.8 ? `${n} / ${maxChars}` : "";
    els.charCount.classList.toggle("over", n > maxChars);
    // CSSOM (element.style), unlike a style attribute, is not inline style to the CSP
    els.input.style.height = "auto";
    els.input.style.height = Math.min(els.input.scrollHeight, 200) + "px";
  }

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
})();
