// The answer stream: server-sent events rendered as markdown while they arrive.

import { visiblePath } from "./branches.js";
import { updateCharCount } from "./composer.js";
import { openConversation } from "./conversation.js";
import { els } from "./dom.js";
import { ApiError, openStream } from "../http.js";
import * as markdown from "../markdown.js";
import { nodeOf, pendingNode, userNode } from "./messages.js";
import { announce } from "./notify.js";
import { render, scrollToEnd, updateScrollButton } from "./render.js";
import { state } from "./state.js";

// Streams one answer: renders it (markdown) as it arrives, then reloads the conversation.
//   opts.userText: a new question shown above the answer; opts.replacing: the answer a
//   regenerated one replaces on screen; opts.replaceFrom: the question node an edited question
//   replaces (with everything below it); opts.parentKey: where the edited question branches.
export async function stream(url, body, opts) {
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
    markdown.update(content, text);
    if (state.stick) scrollToEnd(); else updateScrollButton();
  };

  state.abort = new AbortController();
  let done = null;
  let failure = null;
  try {
    const resp = await openStream(url, body, state.abort.signal);
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
