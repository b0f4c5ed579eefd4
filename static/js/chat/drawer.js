// The conversation list as a drawer on small screens.

import { els } from "./dom.js";

export function openDrawer() {
  document.body.classList.add("drawer-open");
  els.menu.setAttribute("aria-expanded", "true");
  els.backdrop.hidden = false;
  els.main.inert = true; // focus stays in the drawer; the page behind is out of reach
  const current = els.list.querySelector(".conversation-item.active .conversation-link");
  (current || els.drawerClose).focus();
}

export function closeDrawer(returnFocus = true) {
  if (!document.body.classList.contains("drawer-open")) return;
  document.body.classList.remove("drawer-open");
  els.menu.setAttribute("aria-expanded", "false");
  els.backdrop.hidden = true;
  els.main.inert = false;
  if (returnFocus) els.menu.focus();
}
