// Telling the user: the error toast, the screen reader's live region, copy buttons.

import { els } from "./dom.js";

const COPIED_MS = 2000;      // how long "Copied" shows

export function showError(message) {
  els.toast.textContent = message;
  els.toast.hidden = false;
  clearTimeout(showError.timer);
  showError.timer = setTimeout(() => { els.toast.hidden = true; }, 6000);
}

// The live region: new answers (and "Copied") are read out; the history on load is not.
export function announce(text) {
  els.announcer.textContent = text;
}

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

export async function copyWithFeedback(button, text) {
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
