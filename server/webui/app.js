// The chat page: conversations in localStorage, settings, the API key in sessionStorage (asked for when
// the server answers 401), one streamed answer at a time with a stop button, per-answer stats.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const STORE = "ember.conversations";
  const SETTINGS = "ember.settings";
  const KEY = "ember.apiKey";
  const state = { conversations: load(STORE, []), current: null, controller: null, info: null };

  function load(name, fallback) {
    try {
      return JSON.parse(localStorage.getItem(name)) ?? fallback;
    } catch {
      return fallback;
    }
  }
  const save = () => localStorage.setItem(STORE, JSON.stringify(state.conversations));
  const apiKey = () => sessionStorage.getItem(KEY) || "";

  function askKey() {
    return new Promise((resolve) => {
      const dialog = $("key-dialog");
      $("key-input").value = "";
      dialog.addEventListener(
        "close",
        () => {
          sessionStorage.setItem(KEY, $("key-input").value.trim());
          resolve();
        },
        { once: true }
      );
      dialog.showModal();
    });
  }

  // ---- settings -------------------------------------------------------------------------------------
  const FIELDS = ["system", "temperature", "top_p", "max_tokens"];
  function restoreSettings() {
    const saved = load(SETTINGS, {});
    for (const name of FIELDS) if (saved[name] !== undefined) $(name).value = saved[name];
    for (const name of FIELDS)
      $(name).addEventListener("change", () => {
        const out = {};
        for (const f of FIELDS) out[f] = $(f).value;
        localStorage.setItem(SETTINGS, JSON.stringify(out));
      });
  }
  function requestBody(messages) {
    const system = $("system").value.trim();
    const body = { messages: system ? [{ role: "system", content: system }, ...messages] : messages };
    for (const [name, parse] of [["temperature", parseFloat], ["top_p", parseFloat], ["max_tokens", parseInt]]) {
      const value = parse($(name).value);
      if (!Number.isNaN(value)) body[name] = value;
    }
    return body;
  }

  // ---- conversations --------------------------------------------------------------------------------
  function newConversation() {
    const conversation = { id: Date.now().toString(36), title: "New chat", messages: [] };
    state.conversations.unshift(conversation);
    state.current = conversation;
    save();
    renderAll();
  }
  function renderList() {
    const list = $("conversations");
    list.replaceChildren();
    for (const conversation of state.conversations) {
      const item = EmberRender.text("li", conversation === state.current ? "active" : "", conversation.title);
      item.addEventListener("click", () => {
        if (state.controller) return;
        state.current = conversation;
        renderAll();
      });
      const remove = EmberRender.text("button", "delete", "×");
      remove.type = "button";
      remove.title = "Delete";
      remove.addEventListener("click", (event) => {
        event.stopPropagation();
        state.conversations = state.conversations.filter((c) => c !== conversation);
        if (state.current === conversation) state.current = state.conversations[0] || null;
        save();
        if (!state.current) newConversation();
        else renderAll();
      });
      item.appendChild(remove);
      list.appendChild(item);
    }
  }
  function messageNode(message) {
    const node = EmberRender.text("article", `message ${message.role}`);
    if (message.role === "user") node.appendChild(EmberRender.text("div", "content", message.content));
    else EmberRender.answerInto(node, message);
    return node;
  }
  function renderAll() {
    renderList();
    const box = $("messages");
    box.replaceChildren(...state.current.messages.map(messageNode));
    box.scrollTop = box.scrollHeight;
  }

  // ---- sending ------------------------------------------------------------------------------------
  function busy(on) {
    $("send").hidden = on;
    $("stop").hidden = !on;
    $("input").disabled = on;
  }
  function history(conversation) {
    return conversation.messages
      .filter((m) => !m.error || m.content)
      .map((m) => ({ role: m.role, content: m.content || "" }));
  }

  async function send(text) {
    const conversation = state.current;
    conversation.messages.push({ role: "user", content: text });
    if (conversation.title === "New chat") conversation.title = text.slice(0, 40);
    const answer = { role: "assistant", content: "", reasoning: "", toolCalls: [] };
    const body = requestBody(history(conversation));
    conversation.messages.push(answer);
    renderAll();
    const node = $("messages").lastElementChild;
    const started = performance.now();
    let firstAt = null;
    let pending = false;
    const paint = () => {
      if (pending) return;
      pending = true;
      requestAnimationFrame(() => {
        pending = false;
        EmberRender.answerInto(node, answer);
        $("messages").scrollTop = $("messages").scrollHeight;
      });
    };
    state.controller = new AbortController();
    busy(true);
    try {
      const { usage, finish } = await EmberApi.streamChat(body, apiKey(), state.controller.signal, {
        onFirstToken: () => (firstAt = performance.now()),
        onProgress: (done, total) => {
          answer.progress = `Reading the prompt: ${done} / ${total} tokens`;
          paint();
        },
        onDelta: (delta) => {
          delete answer.progress;
          answer.content += delta.content;
          answer.reasoning += delta.reasoning;
          for (const call of delta.toolCalls) {
            const slot = (answer.toolCalls[call.index || 0] ||= { name: "", arguments: "" });
            if (call.function && call.function.name) slot.name += call.function.name;
            if (call.function && call.function.arguments) slot.arguments += call.function.arguments;
          }
          paint();
        },
      });
      answer.stats = stats(usage, started, firstAt, finish);
    } catch (error) {
      if (error instanceof EmberApi.AuthError) {
        conversation.messages.splice(-2, 2);
        sessionStorage.removeItem(KEY);
        await askKey();
        state.controller = null;
        busy(false);
        renderAll();
        return send(text);
      }
      answer.error = error.name === "AbortError" ? "Stopped." : `Error: ${error.message}`;
    } finally {
      delete answer.progress;
      state.controller = null;
      busy(false);
      save();
      EmberRender.answerInto(node, answer);
      renderList();
    }
  }

  function stats(usage, started, firstAt, finish) {
    if (!usage) return "";
    const ttft = firstAt ? (firstAt - started) / 1000 : null;
    const decode = firstAt ? (performance.now() - firstAt) / 1000 : null;
    const rate = decode && usage.completion_tokens > 1 ? (usage.completion_tokens - 1) / decode : null;
    return [
      `${usage.completion_tokens} tokens`,
      ttft !== null ? `TTFT ${ttft.toFixed(2)} s` : null,
      rate !== null ? `${rate.toFixed(1)} tok/s` : null,
      finish === "length" ? "cut at max tokens" : null,
    ]
      .filter(Boolean)
      .join(" · ");
  }

  // ---- start --------------------------------------------------------------------------------------
  async function connect() {
    for (;;) {
      try {
        state.info = await EmberApi.info(apiKey());
        $("model-name").textContent = state.info.model;
        $("context-length").textContent = `context ${state.info.max_context_length} tokens`;
        $("status").textContent = "";
        return;
      } catch (error) {
        if (error instanceof EmberApi.AuthError) await askKey();
        else {
          $("status").textContent = `server not ready (${error.message}); retrying…`;
          await new Promise((r) => setTimeout(r, 2000));
        }
      }
    }
  }

  restoreSettings();
  state.current = state.conversations[0] || null;
  if (!state.current) newConversation();
  else renderAll();
  $("new-chat").addEventListener("click", () => state.controller || newConversation());
  $("stop").addEventListener("click", () => state.controller && state.controller.abort());
  $("forget-key").addEventListener("click", () => sessionStorage.removeItem(KEY));
  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    const text = $("input").value.trim();
    if (!text || state.controller) return;
    $("input").value = "";
    send(text);
  });
  $("input").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) {
      event.preventDefault();
      $("composer").requestSubmit();
    }
  });
  connect();
})();
