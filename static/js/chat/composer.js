// The composer's character count (shown near and over the limit) and its height, which follows the text.

import { els, maxChars } from "./dom.js";

export function updateCharCount() {
  const n = els.input.value.length;
  els.charCount.textContent = n > maxChars * 0.8 ? `${n} / ${maxChars}` : "";
  els.charCount.classList.toggle("over", n > maxChars);
  // CSSOM (element.style), unlike a style attribute, is not inline style to the CSP
  els.input.style.height = "auto";
  els.input.style.height = Math.min(els.input.scrollHeight, 200) + "px";
}
