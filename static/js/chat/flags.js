// Flagging an answer as harmful: a category menu, an optional note; changed or removed in place.

import { api } from "../http.js";
import { nodeOf, paintFlag } from "./messages.js";
import { announce } from "./notify.js";

export function toggleFlagPanel(m, node) {
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
