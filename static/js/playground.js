// The deployment page's playground: sends the conversation as OpenAI's chat body to the page's
// own relay (session and CSRF token, no API key) and shows the answer as its chunks stream in.
(function () {
  "use strict";
  const form = document.getElementById("chat-form");
  if (!form) return;
  const log = document.getElementById("chat-log");
  const messageField = document.getElementById("chat-message");
  const maxTokensField = document.getElementById("chat-max-tokens");
  const send = document.getElementById("chat-send");
  const token = form.querySelector("input[name=csrfmiddlewaretoken]").value;
  const messages = [];

  function bubble(role, text) {
    const item = document.createElement("div");
    item.className = "chat-message chat-" + role;
    const who = document.createElement("strong");
    who.textContent = role === "user" ? "You" : role === "assistant" ? "Model" : "Error";
    const body = document.createElement("span");
    body.className = "chat-text";
    body.textContent = text;
    item.append(who, document.createTextNode(" "), body);
    log.append(item);
    return body;
  }

  async function answer(response, body) {
    if (!response.ok) {
      let message = "HTTP " + response.status;
      try { message = (await response.json()).error.message; } catch (ignored) { /* not JSON */ }
      throw new Error(message);
    }
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffered = "";
    let text = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffered += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffered.indexOf("\n\n")) >= 0) {
        const event = buffered.slice(0, end);
        buffered = buffered.slice(end + 2);
        if (!event.startsWith("data: ")) continue;
        const payload = event.slice(6);
        if (payload === "[DONE]") return text;
        const chunk = JSON.parse(payload);
        if (chunk.error) throw new Error(chunk.error.message);
        for (const choice of chunk.choices || []) {
          text += (choice.delta && choice.delta.content) || "";
        }
        body.textContent = text;
      }
    }
    return text;
  }

  form.addEventListener("submit", async function (event) {
    event.preventDefault();
    const content = messageField.value.trim();
    if (!content) return;
    messages.push({ role: "user", content: content });
    bubble("user", content);
    messageField.value = "";
    send.disabled = true;
    const body = bubble("assistant", "");
    try {
      const response = await fetch(form.action, {
        method: "POST",
        credentials: "same-origin",
        headers: { "Content-Type": "application/json", "X-CSRFToken": token },
        body: JSON.stringify({ messages: messages, stream: true, max_tokens: Number(maxTokensField.value) || 128 }),
      });
      messages.push({ role: "assistant", content: await answer(response, body) });
    } catch (error) {
      messages.pop();
      body.parentElement.className = "chat-message chat-error";
      body.textContent = error.message;
    } finally {
      send.disabled = false;
    }
  });
})();
