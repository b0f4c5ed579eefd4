// The chat page's elements, and what the server wrote into the page (limits, the reason chips);
// small helpers that change them.

// the reason chips, as the server defines them (webapp/core/validation.py)
export const REASONS_UP = JSON.parse(document.body.dataset.reasonsUp || "[]");
export const REASONS_DOWN = JSON.parse(document.body.dataset.reasonsDown || "[]");

export const maxChars = parseInt(document.body.dataset.maxChars || "4000", 10);
export const narrow = window.matchMedia("(max-width: 720px)");
export const reducedMotion = window.matchMedia("(prefers-reduced-motion: reduce)");

const $ = (id) => document.getElementById(id);
export const els = {
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

// The open conversation's title, in the header and the browser's tab.
export function setTitle(title) {
  els.title.textContent = title;
  document.title = title === "New chat" ? "Chat" : `${title} · Chat`;
}

export function cloneTemplate(id) {
  return $(id).content.firstElementChild.cloneNode(true);
}

export function setPressed(btn, on) {
  btn.classList.toggle("on", on);
  btn.setAttribute("aria-pressed", String(on));
}

// The text of a button that also holds an icon.
export function setLabel(button, text) {
  for (const child of Array.from(button.childNodes)) if (child.nodeType === Node.TEXT_NODE) child.remove();
  button.append(text);
}
