// The session and the account: register, sign in (a dialog), sign out.

import { els, narrow } from "./dom.js";
import { closeDrawer } from "./drawer.js";
import { api, setCsrfToken } from "../http.js";
import { announce, showError } from "./notify.js";
import { state } from "./state.js";

export async function loadSession() {
  const data = await api("GET", "/api/session");
  setCsrfToken(data.csrf_token);
  state.compareRate = data.compare_rate || 0;
  showAccount(data.username, data.is_admin);
  // Arms are blind: only an admin is told the version and arm (the badge stays hidden for everyone else).
  if (data.is_admin) {
    const arm = data.arm ? ` · ${data.arm}` : "";
    els.badge.textContent = data.model_version ? `Model ${data.model_version}${arm}` : "No model yet";
    els.badgeBox.hidden = false;
  }
}

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
    if (data.csrf_token) setCsrfToken(data.csrf_token);  // signing in starts a new CSRF token
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

export function bindAccount() {
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
