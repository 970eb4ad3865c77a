// A Server-Sent Events reader on fetch: it keeps the last event id and, after a drop,
// a server restart or a [DONE], reconnects with Last-Event-ID (EventSource cannot send
// the header on the first connect, nor tell [DONE] from a drop).

export class EventStream {
  constructor(path, { onEvent, onState, lastId = null }) {
    this.path = path;
    this.onEvent = onEvent;
    this.onState = onState ?? (() => {});
    this.lastId = lastId;
    this.controller = null;
    this.stopped = false;
    this.retry = 0;
  }

  start() {
    this.stopped = false;
    this.loop();
    return this;
  }

  stop() {
    this.stopped = true;
    this.controller?.abort();
  }

  // Drop the current connection on purpose (tests use this to check the resume).
  drop() {
    this.controller?.abort();
  }

  async loop() {
    while (!this.stopped) {
      let ended = "drop";
      try {
        ended = await this.once();
        this.retry = 0;
      } catch (error) {
        if (error?.status === 404 || error?.status === 401 || error?.status === 403) {
          this.onState("gone", error);
          return;
        }
      }
      if (this.stopped) return;
      this.onState(ended === "done" ? "done" : "reconnecting");
      const wait = Math.min(500 * 2 ** this.retry, 8000);
      this.retry += 1;
      await new Promise((resolve) => setTimeout(resolve, wait));
    }
  }

  async once() {
    this.controller = new AbortController();
    const headers = { Accept: "text/event-stream" };
    if (this.lastId !== null) headers["Last-Event-ID"] = String(this.lastId);
    const response = await fetch(this.path, {
      headers,
      credentials: "same-origin",
      signal: this.controller.signal,
    });
    if (!response.ok) {
      const error = new Error(`stream answered ${response.status}`);
      error.status = response.status;
      throw error;
    }
    this.onState("live");
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return "drop";
        buffer += value;
        let cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, cut);
          buffer = buffer.slice(cut + 2);
          if (this.frame(block) === "done") return "done";
        }
      }
    } finally {
      this.controller.abort();
    }
  }

  frame(block) {
    let id = null;
    const data = [];
    for (const line of block.split("\n")) {
      if (line.startsWith("id:")) id = line.slice(3).trim();
      else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
    }
    const text = data.join("\n");
    if (text === "[DONE]") return "done";
    if (!text) return null;
    let payload;
    try {
      payload = JSON.parse(text);
    } catch {
      return null;
    }
    if (id !== null) this.lastId = Number(id);
    this.onEvent(payload, id === null ? null : Number(id));
    return null;
  }
}
