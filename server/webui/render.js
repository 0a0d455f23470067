// Rendering model output: markdown (marked) -> HTML sanitized by DOMPurify (no script, no event handler
// attribute, no javascript: URL survives), then code blocks highlighted (highlight.js) with a copy button.
// Model text is never inserted as HTML without going through sanitize().
"use strict";

const EmberRender = (() => {
  marked.setOptions({ gfm: true, breaks: false });

  function sanitize(html) {
    return DOMPurify.sanitize(html, { USE_PROFILES: { html: true }, FORBID_TAGS: ["style", "form", "input"] });
  }

  function addCopyButtons(root) {
    for (const pre of root.querySelectorAll("pre")) {
      const code = pre.querySelector("code");
      if (!code || pre.querySelector(".copy")) continue;
      if (!code.classList.contains("hljs")) hljs.highlightElement(code);
      const button = document.createElement("button");
      button.type = "button";
      button.className = "copy";
      button.textContent = "Copy";
      button.addEventListener("click", async () => {
        try {
          await navigator.clipboard.writeText(code.textContent);
          button.textContent = "Copied";
        } catch {
          button.textContent = "Copy failed";
        }
        setTimeout(() => (button.textContent = "Copy"), 1500);
      });
      pre.appendChild(button);
    }
  }

  // markdown text -> sanitized, highlighted DOM inside `element`
  function markdownInto(element, text) {
    element.innerHTML = sanitize(marked.parse(text || ""));
    addCopyButtons(element);
  }

  function text(tag, className, content) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (content !== undefined) node.textContent = content;
    return node;
  }

  // one assistant answer: reasoning (folded), content (markdown), tool calls, stats
  function answerInto(element, answer) {
    element.replaceChildren();
    if (answer.reasoning) {
      const details = text("details", "reasoning");
      details.appendChild(text("summary", null, answer.content ? "Reasoning" : "Reasoning…"));
      details.appendChild(text("div", "reasoning-text", answer.reasoning));
      element.appendChild(details);
    }
    const body = text("div", "content");
    markdownInto(body, answer.content);
    element.appendChild(body);
    for (const call of answer.toolCalls || []) {
      const details = text("details", "tool-call");
      details.open = true;
      details.appendChild(text("summary", null, `Tool call: ${call.name || "?"}`));
      details.appendChild(text("pre", null, call.arguments || ""));
      element.appendChild(details);
    }
    if (answer.progress) element.appendChild(text("div", "progress", answer.progress));
    if (answer.stats) element.appendChild(text("div", "stats", answer.stats));
    if (answer.error) element.appendChild(text("div", "error", answer.error));
  }

  return { sanitize, markdownInto, answerInto, text };
})();
