// Markdown for the chat page, rendered by markdown-it (static/vendor/markdown-it) so that no raw
// HTML ever passes through:
//   - html: false: any HTML in the text is escaped and shows as text;
//   - markdown-it's own link check refuses javascript:, vbscript:, file: and data: URLs;
//   - links open in a new tab with rel="noopener noreferrer nofollow";
//   - images become links to them (an answer cannot make the page load anything);
//   - table alignment becomes a class (markdown-it writes inline styles, which the CSP forbids);
//   - fenced and indented code blocks get a header with their language and a copy button.
// update() re-renders a growing (streamed) answer into its element, touching only the nodes that
// changed: finished paragraphs and code blocks stay the same DOM nodes, so nothing flickers.
// markdown-it itself is the vendored UMD build (window.markdownit), loaded before the chat modules.

const md = window.markdownit({ html: false, linkify: true, breaks: true, typographer: false });
const escape = md.utils.escapeHtml;

const renderToken = (tokens, idx, options, env, self) => self.renderToken(tokens, idx, options);
const linkOpen = md.renderer.rules.link_open || renderToken;
md.renderer.rules.link_open = (tokens, idx, options, env, self) => {
  tokens[idx].attrSet("target", "_blank");
  tokens[idx].attrSet("rel", "noopener noreferrer nofollow");
  return linkOpen(tokens, idx, options, env, self);
};

// An image becomes a link to it: the page never loads anything an answer names.
md.renderer.rules.image = (tokens, idx, options, env, self) => {
  const token = tokens[idx];
  const src = token.attrGet("src") || "";
  const alt = self.renderInlineAsText(token.children || [], options, env) || src;
  let depth = 0; // inside a link already ([![alt](src)](href)): its text only, no nested link
  for (let i = 0; i < idx; i++) depth += tokens[i].type === "link_open" ? 1 : tokens[i].type === "link_close" ? -1 : 0;
  if (depth > 0 || !/^https?:\/\//i.test(src)) return escape(alt);
  return `<a href="${escape(src)}" class="image-link" target="_blank" rel="noopener noreferrer nofollow">${escape(alt)}</a>`;
};

md.core.ruler.push("align_classes", (state) => {
  for (const token of state.tokens) {
    if ((token.type !== "th_open" && token.type !== "td_open") || !token.attrs) continue;
    const style = token.attrGet("style") || "";
    token.attrs = token.attrs.filter(([name]) => name !== "style");
    const align = /text-align:\s*(left|right|center)/.exec(style);
    if (align) token.attrJoin("class", `align-${align[1]}`);
  }
});

function codeBlock(inner) {
  return (tokens, idx, options, env, self) => {
    const info = tokens[idx].info ? md.utils.unescapeAll(tokens[idx].info).trim().split(/\s+/)[0] : "";
    return `<div class="code-block"><div class="code-head"><span class="code-lang">${escape(info || "code")}</span>`
      + `<button type="button" class="code-copy" aria-label="Copy code">Copy</button></div>`
      + inner(tokens, idx, options, env, self) + "</div>\n";
  };
}
md.renderer.rules.fence = codeBlock(md.renderer.rules.fence);
md.renderer.rules.code_block = codeBlock(md.renderer.rules.code_block);

export function html(text) {
  return md.render(text || "");
}

// Makes target's children equal to source's, keeping every node that is already right.
function morph(target, source) {
  const wanted = Array.from(source.childNodes);
  for (let i = 0; i < wanted.length; i++) {
    const want = wanted[i];
    const have = target.childNodes[i];
    if (!have) { target.append(want); continue; }
    if (have.isEqualNode(want)) continue;
    if (have.nodeType === want.nodeType && have.nodeName === want.nodeName) {
      if (have.nodeType === Node.TEXT_NODE) { have.nodeValue = want.nodeValue; continue; }
      if (have.nodeType === Node.ELEMENT_NODE) {
        for (const { name } of Array.from(have.attributes)) if (!want.hasAttribute(name)) have.removeAttribute(name);
        for (const { name, value } of Array.from(want.attributes)) {
          if (have.getAttribute(name) !== value) have.setAttribute(name, value);
        }
        morph(have, want);
        continue;
      }
    }
    have.replaceWith(want);
  }
  while (target.childNodes.length > wanted.length) target.lastChild.remove();
}

// Renders markdown into el (replacing what it showed), changing only what differs.
export function update(el, text) {
  const fresh = document.createElement("div");
  fresh.innerHTML = html(text);
  morph(el, fresh);
}
