// The irodori-speaker event feed in a page: a WebSocket to /feed (Server-Sent Events from
// /feed/sse when WebSockets fail), reconnecting, with the feed's playback clock mapped onto
// the page's own (performance.now()). The schema: docs/overlay.md. No dependencies.
"use strict";

class IrodoriFeed {
  // opts: {key, transport: "auto" | "ws" | "sse", onMessage(msg), onState("connected" | "disconnected")}
  constructor(opts) {
    this.key = opts.key || "";
    this.transport = opts.transport || "auto";
    this.onMessage = opts.onMessage || (() => {});
    this.onState = opts.onState || (() => {});
    this.offset = null; // feed clock (s) minus page clock (s)
    this.bestRtt = Infinity;
    this.wsFailures = 0;
    this.retryMs = 250;
    this.conn = null;
    this.pingTimer = null;
    this.pings = 0;
  }

  url(path, ws) {
    const base = new URL(path, window.location.href);
    if (this.key) base.searchParams.set("key", this.key);
    if (ws) base.protocol = base.protocol === "https:" ? "wss:" : "ws:";
    return base.toString();
  }

  start() {
    const useSse = this.transport === "sse" || (this.transport === "auto" && this.wsFailures >= 2);
    if (useSse || typeof WebSocket === "undefined") this.openSse();
    else this.openWs();
  }

  // the page time (ms, performance.now()) at which the feed's clock reads t (s)
  toPage(t) {
    return (t - (this.offset === null ? 0 : this.offset)) * 1000;
  }

  clockSample(sentMs, clock, receivedMs) {
    const rtt = receivedMs - sentMs;
    // the best of the recent answers: the shortest round trip bounds the error by rtt / 2
    if (rtt <= this.bestRtt * 1.5 || this.offset === null) {
      this.bestRtt = Math.min(this.bestRtt, rtt);
      this.offset = clock - (sentMs + receivedMs) / 2000;
    }
  }

  handle(text) {
    let msg;
    try {
      msg = JSON.parse(text);
    } catch (e) {
      return;
    }
    if (msg.type === "hello") {
      if (msg.schema !== 1) console.warn("irodori feed schema", msg.schema, "(this page knows 1)");
      this.bestRtt = Infinity;
      this.offset = msg.clock - performance.now() / 1000; // until the first pong
      this.retryMs = 250;
    } else if (msg.type === "pong") {
      this.clockSample(msg.sent, msg.clock, performance.now());
      return;
    }
    this.onMessage(msg);
  }

  schedulePings(send) {
    clearTimeout(this.pingTimer);
    const tick = () => {
      send();
      this.pings += 1;
      this.pingTimer = setTimeout(tick, this.pings < 8 ? 250 : 5000);
    };
    this.pings = 0;
    tick();
  }

  openWs() {
    let opened = false;
    const ws = new WebSocket(this.url("/feed", true));
    this.conn = ws;
    ws.onopen = () => {
      opened = true;
      this.wsFailures = 0;
      this.onState("connected");
      this.schedulePings(() => {
        if (ws.readyState === 1) ws.send(JSON.stringify({ type: "ping", sent: performance.now() }));
      });
    };
    ws.onmessage = (ev) => this.handle(ev.data);
    ws.onclose = () => {
      if (!opened) this.wsFailures += 1;
      this.lost(ws);
    };
  }

  openSse() {
    const es = new EventSource(this.url("/feed/sse", false));
    this.conn = es;
    es.onopen = () => {
      this.onState("connected");
      this.schedulePings(async () => {
        const sent = performance.now();
        try {
          const r = await fetch(this.url("/feed/clock", false), { cache: "no-store" });
          const body = await r.json();
          this.clockSample(sent, body.clock, performance.now());
        } catch (e) {
          /* the stream's own error handler reconnects */
        }
      });
    };
    es.onmessage = (ev) => this.handle(ev.data);
    es.onerror = () => {
      es.close(); // reconnect ourselves, with our own back-off and a fresh hello
      this.lost(es);
    };
  }

  lost(conn) {
    if (this.conn !== conn) return;
    this.conn = null;
    clearTimeout(this.pingTimer);
    this.onState("disconnected");
    setTimeout(() => this.start(), this.retryMs);
    this.retryMs = Math.min(this.retryMs * 2, 3000);
  }
}

window.IrodoriFeed = IrodoriFeed;
