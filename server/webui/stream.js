// The server calls the page makes: /v1/info, and a streamed /v1/chat/completions read as SSE. Comments
// (": prefill 512/4096") report prompt progress; aborting the AbortController ends the HTTP request,
// which makes the server abort the generation and free its KV.
"use strict";

const EmberApi = (() => {
  class AuthError extends Error {}

  function headers(key) {
    const out = { "Content-Type": "application/json" };
    if (key) out.Authorization = `Bearer ${key}`;
    return out;
  }

  async function info(key) {
    const reply = await fetch("/v1/info", { headers: headers(key) });
    if (reply.status === 401) throw new AuthError("API key needed");
    if (!reply.ok) throw new Error(`/v1/info: ${reply.status}`);
    return reply.json();
  }

  async function errorText(reply) {
    try {
      const body = await reply.json();
      return body.error && body.error.message ? body.error.message : JSON.stringify(body);
    } catch {
      return `HTTP ${reply.status}`;
    }
  }

  // handlers: onDelta({content, reasoning, toolCalls}), onProgress(done, total), onFirstToken()
  async function streamChat(body, key, signal, handlers) {
    const reply = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: headers(key),
      body: JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true } }),
      signal,
    });
    if (reply.status === 401) throw new AuthError(await errorText(reply));
    if (!reply.ok) throw new Error(await errorText(reply));
    const reader = reply.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    let usage = null;
    let finish = null;
    let first = true;
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        for (const line of block.split("\n")) {
          const progress = /^: prefill (\d+)\/(\d+)/.exec(line);
          if (progress) handlers.onProgress(Number(progress[1]), Number(progress[2]));
          if (!line.startsWith("data: ")) continue;
          const data = line.slice(6);
          if (data === "[DONE]") continue;
          const chunk = JSON.parse(data);
          if (chunk.error) throw new Error(chunk.error.message || "generation failed");
          if (chunk.usage) usage = chunk.usage;
          const choice = chunk.choices && chunk.choices[0];
          if (!choice) continue;
          if (choice.finish_reason) finish = choice.finish_reason;
          const delta = choice.delta || {};
          const reasoning = delta.reasoning_content || "";
          if (first && (delta.content || reasoning || delta.tool_calls)) {
            first = false;
            handlers.onFirstToken();
          }
          handlers.onDelta({ content: delta.content || "", reasoning, toolCalls: delta.tool_calls || [] });
        }
      }
    }
    return { usage, finish };
  }

  return { AuthError, info, streamChat };
})();
