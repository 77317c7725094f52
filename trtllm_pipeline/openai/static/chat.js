// The chat page of the OpenAI front: one conversation with the served model through
// /v1/chat/completions, streamed. No library, no build step; same-origin requests only.
// Everything the model or the server says is put in the page as text (textContent), never as HTML.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const conversation = $("conversation");
  const form = $("composer");
  const prompt = $("prompt");
  const sendButton = $("send");
  const stopButton = $("stop");
  const stats = $("stats");
  const history = []; // what the next request sends: the turns so far (answers without their reasoning)
  let model = null;
  let controller = null; // the request in flight: aborting it closes the stream, and the server frees it

  const JSON_HEADERS = { "Content-Type": "application/json", Accept: "application/json" };

  function element(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  // One scroll a frame, however many pieces arrive in it: reading scrollHeight lays the page out, and once per piece
  // of a long fast answer that layout was most of the page's work
  let scrollQueued = false;
  function scrollDown() {
    if (scrollQueued) return;
    scrollQueued = true;
    requestAnimationFrame(() => {
      scrollQueued = false;
      conversation.scrollTop = conversation.scrollHeight;
    });
  }

  function message(role, text) {
    const node = element("div", `message ${role}`);
    node.dataset.role = role;
    node.appendChild(element("div", "who", { user: "You", assistant: "Model", error: "Error" }[role]));
    const body = element("div", "text", text);
    node.appendChild(body);
    conversation.appendChild(node);
    scrollDown();
    return node;
  }

  function showError(text) {
    return message("error", text);
  }

  // An OpenAI-shaped error body ({"error": {"message"}}) as one line; anything else as what it was.
  function errorText(status, body) {
    const said = body && body.error && (body.error.message || body.error);
    return `${status ? `HTTP ${status}: ` : ""}${typeof said === "string" ? said : JSON.stringify(body)}`;
  }

  async function responseError(response) {
    const text = await response.text();
    try {
      return errorText(response.status, JSON.parse(text));
    } catch (_) {
      return `HTTP ${response.status}: ${text.slice(0, 300) || response.statusText || "no body"}`;
    }
  }

  async function loadModel() {
    try {
      const response = await fetch("v1/models", { headers: { Accept: "application/json" } });
      if (!response.ok) throw new Error(await responseError(response));
      model = (await response.json()).data[0].id;
      $("model").textContent = model;
    } catch (e) {
      $("model").textContent = "no model";
      showError(`cannot list the served model: ${e.message}`);
    }
  }

  function number(id, parse) {
    const value = $(id).value.trim();
    return value === "" ? undefined : parse(value);
  }

  function requestBody() {
    const messages = [];
    const system = $("system").value.trim();
    if (system) messages.push({ role: "system", content: system });
    const body = { model, messages: messages.concat(history), stream: true, stream_options: { include_usage: true } };
    const temperature = number("temperature", Number);
    const maxTokens = number("max-tokens", Number);
    if (temperature !== undefined) body.temperature = temperature;
    if (maxTokens !== undefined) body.max_tokens = maxTokens;
    return body;
  }

  // One answer as it streams in: a collapsible reasoning part (reasoning_content deltas) and the answer.
  class Answer {
    constructor() {
      this.node = message("assistant", "");
      this.text = this.node.querySelector(".text");
      this.reasoning = null;
      this.content = "";
      this.started = false; // a character other than a newline shown
      this.pieces = 0;
    }

    arrived() {
      this.pieces += 1;
      this.node.dataset.pieces = String(this.pieces);
    }

    think(piece) {
      if (!this.reasoning) {
        const details = element("details", "reasoning");
        details.open = true;
        details.appendChild(element("summary", null, "Reasoning"));
        details.appendChild(element("div", "reasoning-text"));
        this.node.insertBefore(details, this.text);
        this.reasoning = details;
      }
      // each piece appended as a text node: rewriting the whole text per piece made a long answer quadratic, and
      // the page fell behind the stream
      this.reasoning.querySelector(".reasoning-text").appendChild(document.createTextNode(piece));
    }

    say(piece) {
      if (this.reasoning && !this.content) this.reasoning.open = false; // the answer began: fold the reasoning
      this.content += piece;
      const shown = this.started ? piece : piece.replace(/^\n+/, ""); // R1 puts blank lines after </think>
      if (shown) {
        this.started = true;
        this.text.appendChild(document.createTextNode(shown));
      }
    }

    end(state) {
      this.node.dataset.state = state;
      if (state !== "done") this.node.appendChild(element("div", "note", state));
    }
  }

  // Server-sent events off the response body: yields each `data:` payload ("[DONE]" included). A read of data
  // already received resolves as a microtask, so while the page is behind the stream this loop would keep the
  // browser from handling anything else (Stop among it) until it caught up: it gives the event loop a turn every
  // frame's worth of work (a click on Stop then aborts the request, and the next read fails), between events as well
  // as between reads (one read of a stream the page fell behind on holds hundreds of events: a clean clone's test run,
  // 2026-12-07, had its Stop click wait past WebDriver's 30 s script timeout).
  async function* events(response, signal) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    let turn = performance.now();
    const breathe = async () => {
      if (performance.now() - turn <= 16) return;
      await new Promise((resolve) => setTimeout(resolve, 0));
      turn = performance.now();
      if (signal && signal.aborted) throw new DOMException("stopped", "AbortError");
    };
    for (;;) {
      await breathe();
      const { value, done } = await reader.read();
      buffer += decoder.decode(value || new Uint8Array(), { stream: !done });
      const parts = buffer.split(/\r?\n\r?\n/);
      buffer = done ? "" : parts.pop();
      for (const part of parts) {
        const data = part.split(/\r?\n/).filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart());
        if (data.length) yield data.join("\n");
        await breathe();
      }
      if (done) return;
    }
  }

  function parseEvent(data) {
    try {
      return JSON.parse(data);
    } catch (_) {
      throw new Error(`the server sent a malformed event: ${data.slice(0, 200)}`);
    }
  }

  function showStats(timing, tokens, state) {
    const ttft = timing.first === null ? null : timing.first - timing.start;
    const seconds = timing.first === null ? 0 : (timing.end - timing.first) / 1000;
    const speed = tokens > 1 && seconds > 0 ? (tokens - 1) / seconds : null;
    stats.dataset.ttftMs = ttft === null ? "" : ttft.toFixed(0);
    stats.dataset.tokens = tokens === null ? "" : String(tokens);
    stats.dataset.tokensPerSecond = speed === null ? "" : speed.toFixed(1);
    stats.dataset.state = state;
    const parts = [`TTFT ${ttft === null ? "–" : `${ttft.toFixed(0)} ms`}`];
    if (speed !== null) parts.push(`${speed.toFixed(1)} tokens/s`);
    if (tokens !== null) parts.push(`${tokens} tokens`);
    if (state !== "done") parts.push(state);
    stats.textContent = `Last answer: ${parts.join(" · ")}`;
  }

  function busy(on) {
    sendButton.disabled = on;
    stopButton.disabled = !on;
    document.body.dataset.busy = on ? "true" : "false";
  }

  async function ask(text) {
    if (!model) await loadModel();
    if (!model) return;
    const asked = message("user", text);
    history.push({ role: "user", content: text });
    const timing = { start: performance.now(), first: null, end: null };
    let answer = null;
    let tokens = null;
    controller = new AbortController();
    busy(true);
    try {
      const response = await fetch("v1/chat/completions", {
        method: "POST", headers: JSON_HEADERS, body: JSON.stringify(requestBody()), signal: controller.signal,
      });
      if (!response.ok) throw new Error(await responseError(response));
      answer = new Answer();
      for await (const data of events(response, controller.signal)) {
        if (data === "[DONE]") break;
        const chunk = parseEvent(data);
        if (chunk.error) throw new Error(errorText(null, chunk));
        if (chunk.usage) tokens = chunk.usage.completion_tokens;
        const delta = (chunk.choices && chunk.choices[0] && chunk.choices[0].delta) || {};
        if (delta.reasoning_content || delta.content) {
          if (timing.first === null) timing.first = performance.now();
          if (delta.reasoning_content) answer.think(delta.reasoning_content);
          if (delta.content) answer.say(delta.content);
          answer.arrived();
          scrollDown();
        }
      }
      timing.end = performance.now();
      answer.end("done");
      history.push({ role: "assistant", content: answer.content });
      showStats(timing, tokens, "done");
    } catch (e) {
      timing.end = performance.now();
      if (!asked.isConnected) {
        // "New chat" while it streamed: the conversation it belonged to is gone
      } else if (e.name === "AbortError") {
        if (answer) answer.end("stopped");
        if (answer && answer.content) history.push({ role: "assistant", content: answer.content });
        else history.pop(); // nothing came back: the question is not part of the conversation
        showStats(timing, null, "stopped");
      } else {
        if (answer) answer.end("failed");
        history.pop();
        showError(e instanceof TypeError ? `cannot reach the server: ${e.message}` : e.message);
        showStats(timing, tokens, "failed");
      }
    } finally {
      controller = null;
      busy(false);
      prompt.focus();
    }
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const text = prompt.value.trim();
    if (!text || controller) return;
    prompt.value = "";
    ask(text);
  });
  prompt.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      form.requestSubmit();
    }
  });
  stopButton.addEventListener("click", () => {
    if (controller) controller.abort();
  });
  $("clear").addEventListener("click", () => {
    if (controller) controller.abort();
    history.length = 0;
    conversation.replaceChildren();
    stats.textContent = "";
  });

  busy(false);
  loadModel();
})();
