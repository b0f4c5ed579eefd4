// Chat page: conversations, streamed answers, regenerate/siblings, feedback and compare.
// All user and model text goes into the page through textContent, never as HTML.
"use strict";

(() => {
  const REASONS_UP = ["helpful", "polite", "concise", "accurate", "on-topic"];
  const REASONS_DOWN = ["rude", "off-topic", "too long", "too short", "wrong", "unhelpful", "repetitive"];
  const SUGGESTIONS = ["How do I cook rice?", "Any tips to start running?", "How can I save money?",
                       "How do I fix a bug in my code?"];

  const $ = (id) => document.getElementById(id);
  const els = {
    list: $("conversation-list"), empty: $("sidebar-empty"), newChat: $("new-chat"), title: $("chat-title"),
    messages: $("messages"), welcome: $("welcome"), suggestions: $("suggestions"), form: $("composer"),
    input: $("composer-input"), send: $("send-button"), stop: $("stop-button"), compare: $("compare-toggle"),
    toast: $("toast"), badge: $("model-badge"), charCount: $("char-count"),
  };
  const maxChars = parseInt(document.body.dataset.maxChars || "4000", 10);

  const state = {
    csrf: null,
    compareRate: 0,        // share of questions answered side by side while an experiment runs
    conversations: [],
    conv: null,            // {id, title, messages: Map, children: Map, comparisons: Map}
    selected: new Map(),   // parentKey -> chosen child id (which sibling is shown)
    busy: false,
    abort: null,
  };

  // ------------------------------------------------------------------ HTTP

  class ApiError extends Error {}

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
    if (!resp.ok) throw new ApiError((data && data.error) || `Request failed (${resp.status})`);
    return data;
  }

  function showError(message) {
    els.toast.textContent = message;
    els.toast.hidden = false;
    clearTimeout(showError.timer);
    showError.timer = setTimeout(() => { els.toast.hidden = true; }, 6000);
  }

  // ------------------------------------------------------------------ conversations

  async function loadSession() {
    const data = await api("GET", "/api/session");
    state.csrf = data.csrf_token;
    state.compareRate = data.compare_rate || 0;
    const arm = data.arm ? ` · ${data.arm}` : "";
    els.badge.textContent = data.model_version ? `Model ${data.model_version}${arm}` : "Model loading...";
  }

  async function refreshList() {
    const data = await api("GET", "/api/conversations");
    state.conversations = data.conversations;
    renderList();
  }

  function renderList() {
    els.list.replaceChildren();
    for (const c of state.conversations) {
      const li = document.createElement("li");
      li.className = "conversation-item" + (state.conv && state.conv.id === c.id ? " active" : "");
      li.dataset.id = c.id;
      const open = document.createElement("a");
      open.href = `#/c/${c.id}`;
      open.className = "conversation-link";
      open.textContent = c.title;
      open.title = c.title;
      const del = document.createElement("button");
      del.type = "button";
      del.className = "icon-btn delete-conversation";
      del.setAttribute("aria-label", `Delete conversation ${c.title}`);
      del.textContent = "\u00d7";
      del.addEventListener("click", (ev) => { ev.preventDefault(); deleteConversation(c); });
      li.append(open, del);
      els.list.append(li);
    }
    els.empty.hidden = state.conversations.length > 0;
  }

  async function deleteConversation(c) {
    if (!window.confirm(`Delete "${c.title}"? This cannot be undone.`)) return;
    try {
      await api("DELETE", `/api/conversations/${c.id}`);
      if (state.conv && state.conv.id === c.id) newChat();
      await refreshList();
    } catch (e) { showError(e.message); }
  }

  function newChat() {
    state.conv = null;
    state.selected = new Map();
    if (location.hash) history.replaceState(null, "", location.pathname);
    els.title.textContent = "New chat";
    render();
    renderList();
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
    if (!keepSelection || !state.conv || state.conv.id !== data.id) state.selected = new Map();
    state.conv = { id: data.id, title: data.title, messages, children, comparisons };
    els.title.textContent = data.title;
    document.title = `${data.title} · Chat`;
    if (location.hash !== `#/c/${data.id}`) history.replaceState(null, "", `#/c/${data.id}`);
    render();
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

  // ------------------------------------------------------------------ rendering

  function render() {
    const path = visiblePath();
    els.messages.replaceChildren();
    if (!path.length) {
      els.messages.append(els.welcome);
      return;
    }
    for (const m of path) {
      if (m.role === "user") {
        els.messages.append(userNode(m.content));
        const pair = state.conv.comparisons.get(m.id);
        if (pair && !pair.winner) {
          els.messages.append(compareNode(pair));
          break; // the conversation continues once the user has picked an answer
        }
      } else {
        els.messages.append(assistantNode(m));
      }
    }
    scrollToEnd();
  }

  function scrollToEnd() { els.messages.scrollTop = els.messages.scrollHeight; }

  function userNode(text) {
    const node = $("tpl-user-message").content.firstElementChild.cloneNode(true);
    node.querySelector(".bubble").textContent = text;
    return node;
  }

  function assistantNode(m) {
    const node = $("tpl-assistant-message").content.firstElementChild.cloneNode(true);
    node.dataset.id = m.id;
    node.querySelector(".content").textContent = m.content;
    const fb = m.feedback || {};

    // siblings: other answers to the same question
    const siblings = state.conv.children.get(m.parent_id) || [m.id];
    if (siblings.length > 1) {
      const pos = siblings.indexOf(m.id);
      const box = node.querySelector(".siblings");
      box.hidden = false;
      box.querySelector(".sibling-pos").textContent = `${pos + 1} / ${siblings.length}`;
      const prev = box.querySelector(".sibling-prev");
      const next = box.querySelector(".sibling-next");
      prev.disabled = pos === 0;
      next.disabled = pos === siblings.length - 1;
      prev.addEventListener("click", () => { state.selected.set(m.parent_id, siblings[pos - 1]); render(); });
      next.addEventListener("click", () => { state.selected.set(m.parent_id, siblings[pos + 1]); render(); });
      const pair = state.conv.comparisons.get(m.parent_id);
      if (pair && pair.winner && (m.id === pair.a || m.id === pair.b)) {
        const won = (pair.winner === "a" && m.id === pair.a) || (pair.winner === "b" && m.id === pair.b);
        const label = { tie: "rated a tie", both_bad: "both rated bad" }[pair.winner] || (won ? "your pick" : "not picked");
        box.querySelector(".sibling-pos").textContent += ` · ${label}`;
      }
    }

    // thumbs
    const up = node.querySelector(".thumb-up");
    const down = node.querySelector(".thumb-down");
    setPressed(up, fb.thumb === "up");
    setPressed(down, fb.thumb === "down");
    up.addEventListener("click", () => thumb(m, node, "up"));
    down.addEventListener("click", () => thumb(m, node, "down"));

    // stars
    node.querySelectorAll(".star").forEach((star) => {
      const value = parseInt(star.dataset.value, 10);
      star.classList.toggle("on", fb.rating != null && value <= fb.rating);
      star.setAttribute("aria-checked", String(fb.rating === value));
      star.setAttribute("role", "radio");
      star.addEventListener("click", () => saveFeedback(m, { rating: fb.rating === value ? null : value }));
    });

    // correction
    if (fb.correction) {
      node.querySelector(".correction-view").hidden = false;
      node.querySelector(".correction-text").textContent = fb.correction;
      node.querySelector(".correct").textContent = "\u270e Edit correction";
    }
    node.querySelector(".correct").addEventListener("click", () => openCorrection(m, node));
    node.querySelector(".comment-toggle").addEventListener("click", () => openFeedbackPanel(m, node, fb.thumb));
    if (fb.comment) node.querySelector(".comment-toggle").textContent = "Comment \u2713";
    node.querySelector(".regenerate").addEventListener("click", () => regenerate(m));

    const meta = [];
    if (m.model_version) meta.push(m.model_version);
    if (m.arm) meta.push(m.arm);
    node.querySelector(".meta").textContent = meta.join(" \u00b7 ");
    return node;
  }

  function setPressed(btn, on) {
    btn.classList.toggle("on", on);
    btn.setAttribute("aria-pressed", String(on));
  }

  function compareNode(pair) {
    const node = $("tpl-compare").content.firstElementChild.cloneNode(true);
    node.dataset.pairId = pair.id;
    node.querySelector('[data-side="a"] .bubble').textContent = state.conv.messages.get(pair.a).content;
    node.querySelector('[data-side="b"] .bubble').textContent = state.conv.messages.get(pair.b).content;
    node.querySelectorAll(".vote").forEach((btn) =>
      btn.addEventListener("click", () => vote(pair, btn.dataset.winner)));
    return node;
  }

  // ------------------------------------------------------------------ feedback

  async function saveFeedback(m, changes) {
    try {
      const data = await api("POST", `/api/messages/${m.id}/feedback`, changes);
      m.feedback = data.feedback;
      render();
      return true;
    } catch (e) {
      showError(e.message);
      return false;
    }
  }

  async function thumb(m, node, value) {
    const current = m.feedback && m.feedback.thumb;
    const next = current === value ? null : value;
    const changes = { thumb: next };
    if (next !== current) changes.reasons = []; // reasons belong to the old thumb
    if (await saveFeedback(m, changes) && next) {
      const fresh = els.messages.querySelector(`.assistant-message[data-id="${m.id}"]`);
      if (fresh) openFeedbackPanel(m, fresh, next);
    }
  }

  function openFeedbackPanel(m, node, thumbValue) {
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
    panel.querySelector(".save-feedback").onclick = () =>
      saveFeedback(m, { reasons: Array.from(chosen), comment: comment.value });
    panel.querySelector(".cancel-feedback").onclick = () => { panel.hidden = true; };
    comment.focus();
  }

  function openCorrection(m, node) {
    const editor = node.querySelector(".correction-editor");
    const input = editor.querySelector(".correction-input");
    input.value = (m.feedback && m.feedback.correction) || m.content;
    editor.hidden = false;
    input.focus();
    editor.querySelector(".save-correction").onclick = () => {
      const text = input.value.trim();
      if (!text) { showError("The correction is empty."); return; }
      saveFeedback(m, { correction: text });
    };
    editor.querySelector(".cancel-correction").onclick = () => { editor.hidden = true; };
  }

  async function vote(pair, winner) {
    try {
      const data = await api("POST", `/api/pairs/${pair.id}/vote`, { winner });
      state.conv.comparisons.set(pair.prompt_message_id, data.pair);
      state.selected.set(pair.prompt_message_id, data.continue_from);
      render();
    } catch (e) { showError(e.message); }
  }

  // ------------------------------------------------------------------ sending and streaming

  function setBusy(busy) {
    state.busy = busy;
    els.send.hidden = busy;
    els.stop.hidden = !busy;
    els.input.disabled = false;
    els.messages.querySelectorAll(".regenerate, .vote").forEach((b) => { b.disabled = busy; });
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
    const compare = els.compare.checked || (state.compareRate > 0 && Math.random() < state.compareRate);
    setBusy(true);
    els.input.value = "";
    updateCharCount();
    try {
      const convId = await ensureConversation();
      if (compare) {
        els.messages.querySelector(".welcome")?.remove();
        els.messages.append(userNode(text), pendingNode("Writing two answers..."));
        scrollToEnd();
        const data = await api("POST", `/api/conversations/${convId}/compare`, { content: text, parent_id: parentId });
        await openConversation(convId, true);
        state.selected.set(data.user_message.parent_id ?? "root", data.user_message.id);
        render();
      } else {
        await stream(`/api/conversations/${convId}/messages`, { content: text, parent_id: parentId }, text);
      }
      await refreshList();
    } catch (e) {
      showError(e.message);
      els.input.value = text; // never lose what the user typed
      updateCharCount();
      if (state.conv) await openConversation(state.conv.id, true);
    } finally {
      setBusy(false);
    }
  }

  function pendingNode(label) {
    const node = $("tpl-assistant-message").content.firstElementChild.cloneNode(true);
    node.classList.add("pending");
    node.querySelector(".message-tools").remove();
    node.querySelector(".content").textContent = label || "";
    return node;
  }

  async function regenerate(m) {
    if (state.busy) return;
    setBusy(true);
    try {
      await stream(`/api/messages/${m.id}/regenerate`, {}, null, m);
    } catch (e) {
      showError(e.message);
      await openConversation(state.conv.id, true);
    } finally {
      setBusy(false);
    }
  }

  // Streams one answer: shows it token by token, then reloads the conversation from the server.
  async function stream(url, body, userText, replacing) {
    const convId = state.conv.id;
    const live = pendingNode("");
    live.classList.add("streaming");
    const content = live.querySelector(".content");
    if (replacing) {
      const old = els.messages.querySelector(`.assistant-message[data-id="${replacing.id}"]`);
      if (old) old.replaceWith(live); else els.messages.append(live);
    } else {
      els.messages.querySelector(".welcome")?.remove();
      els.messages.append(userNode(userText), live);
    }
    scrollToEnd();

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
          if (event.type === "token") { content.textContent += event.data.text; scrollToEnd(); }
          else if (event.type === "done") done = event.data;
          else if (event.type === "error") failure = event.data.error;
        }
      }
    } catch (e) {
      if (e.name !== "AbortError") throw e;
    } finally {
      state.abort = null;
    }
    if (failure) throw new ApiError(failure);
    if (done) {
      await openConversation(convId, true);
      state.selected.set(done.user_message_id, done.message_id);
      render();
    } else {
      // stopped: the server keeps the partial answer; give it a moment to store it
      await new Promise((r) => setTimeout(r, 400));
      await openConversation(convId, true);
      if (userText && !visiblePath().some((m) => m.role === "user" && m.content === userText.trim())) {
        els.input.value = userText; // nothing was kept: give the text back
        updateCharCount();
      }
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

  // ------------------------------------------------------------------ composer

  function updateCharCount() {
    const n = els.input.value.length;
    els.charCount.textContent = n > maxChars * 0.8 ? `${n} / ${maxChars}` : "";
    els.charCount.classList.toggle("over", n > maxChars);
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
    try {
      await loadSession();
      await refreshList();
      routeFromHash();
    } catch (e) {
      showError(`Could not reach the server: ${e.message}`);
    }
    document.body.classList.add("ready");
    els.input.focus();
  }

  start();
})();
