// The caption overlay: shows each word (or, for a kana-only line, each mora) at the moment the
// feed says it is heard, clears after the line, and shows nothing stale after a lost connection.
"use strict";

(function () {
  const q = new URLSearchParams(window.location.search);
  const num = (name, dflt, lo, hi) => {
    const v = parseFloat(q.get(name));
    return Number.isFinite(v) ? Math.min(hi, Math.max(lo, v)) : dflt;
  };
  // a value that goes into CSS must stay one value: no ; { } < > or url(
  const safe = (v) => v !== null && v !== "" && !/[;{}<>\\]|url\(/i.test(v);
  const root = document.documentElement.style;
  const cssVars = {
    font: "--font", color: "--color", outline: "--outline", bg: "--bg", align: "--align",
    weight: "--weight", width: "--width",
  };
  for (const [param, name] of Object.entries(cssVars)) {
    if (safe(q.get(param))) root.setProperty(name, q.get(param));
  }
  if (q.has("size")) root.setProperty("--size", num("size", 56, 8, 400) + "px");
  if (q.has("outline_width")) root.setProperty("--outline-width", num("outline_width", 4, 0, 40) + "px");
  if (q.has("padding")) root.setProperty("--padding", num("padding", 24, 0, 1000) + "px");
  const fadeMs = num("fade", 600, 0, 10000);
  root.setProperty("--fade", fadeMs + "ms");
  const holdMs = num("hold", 1500, 0, 60000);
  const maxLines = Math.round(num("max_lines", 2, 1, 20));
  const mode = ["word", "mora", "auto"].includes(q.get("mode")) ? q.get("mode") : "auto";
  const position = ["top", "middle", "bottom"].includes(q.get("position")) ? q.get("position") : "bottom";
  document.body.dataset.position = position;
  const userCss = q.get("css");
  if (userCss && /^[A-Za-z0-9][A-Za-z0-9_.-]*\.css$/.test(userCss)) {
    document.getElementById("user-css").href = "/overlay/user/" + userCss;
  }

  const box = document.getElementById("box");
  const caption = document.getElementById("caption");
  const mouth = document.getElementById("mouth");
  const mouthShape = document.getElementById("mouth-shape");
  const visemeEl = document.getElementById("viseme");
  if (q.get("mouth") === "1") mouth.hidden = false;
  box.classList.add("empty");

  // what the tests and a curious streamer can read: every shown word / mora and its lag
  const state = { log: [], lines: {}, current: null, messages: 0 };
  window.__irodori = state;
  let timers = []; // [line id, timeout id] of morae / words waiting for their time
  let clearTimer = null;

  function clearAll() {
    for (const [, t] of timers) clearTimeout(t);
    timers = [];
    clearTimeout(clearTimer);
    caption.textContent = "";
    box.classList.remove("fading");
    box.classList.add("empty");
    state.current = null;
  }

  function lineCount() {
    const tops = new Set();
    for (const span of caption.children) tops.add(span.offsetTop);
    return tops.size;
  }

  function trim() {
    while (caption.children.length > 1 && lineCount() > maxLines) caption.removeChild(caption.firstChild);
  }

  function show(lineId, text, cls, t, index) {
    if (state.current !== lineId) return;
    const span = document.createElement("span");
    span.className = cls;
    span.textContent = text;
    caption.appendChild(span);
    box.classList.remove("empty", "fading");
    trim();
    const shown = performance.now();
    const entry = { id: lineId, index: index, text: text, kind: cls === "w" ? "word" : "mora",
      t: t, target: feed.toPage(t), shown: shown, lag: shown - feed.toPage(t) };
    state.log.push(entry);
    requestAnimationFrame((frame) => { entry.painted = frame; });
  }

  function at(lineId, t, fn) {
    const delay = feed.toPage(t) - performance.now();
    if (delay <= 2) {
      fn();
      return;
    }
    timers.push([lineId, setTimeout(fn, delay)]);
  }

  function startLine(line) {
    clearAll();
    state.current = line.id;
    state.lines[line.id] = { text: line.text, kanaOnly: false };
  }

  function onWord(msg) {
    if (state.current !== msg.id) startLine({ id: msg.id, text: "" }); // joined mid-line
    const line = state.lines[msg.id];
    const byMora = mode === "mora" || (mode === "auto" && line.kanaOnly);
    const morae = (msg.moras || []).filter((m) => m.text);
    if (byMora && morae.length) {
      for (const m of morae) at(msg.id, m.t, () => show(msg.id, m.text, "m", m.t, msg.index));
    } else if (msg.text) {
      at(msg.id, msg.t, () => show(msg.id, msg.text, "w", msg.t, msg.index));
    }
  }

  function endLine(msg) {
    if (state.current !== msg.id) return;
    if (msg.outcome !== "played") {
      // cut short: what was not heard is never shown
      for (const [id, t] of timers) if (id === msg.id) clearTimeout(t);
      timers = timers.filter(([id]) => id !== msg.id);
    }
    clearTimeout(clearTimer);
    clearTimer = setTimeout(() => {
      box.classList.add("fading");
      clearTimer = setTimeout(clearAll, fadeMs);
    }, holdMs);
  }

  function onMessage(msg) {
    state.messages += 1;
    switch (msg.type) {
      case "hello":
        clearAll();
        break;
      case "line_started":
        startLine(msg.line);
        break;
      case "line_timing":
        if (state.lines[msg.id]) state.lines[msg.id].kanaOnly = !!msg.kana_only;
        break;
      case "word":
        onWord(msg);
        break;
      case "line_finished":
        endLine(msg);
        break;
      case "mouth":
        mouthShape.style.transform = "scaleY(" + Math.max(0.08, msg.level) + ")";
        break;
      case "viseme":
        visemeEl.textContent = msg.viseme === "closed" ? "" : msg.viseme;
        break;
      case "closed":
        clearAll();
        break;
    }
  }

  const feed = new IrodoriFeed({
    key: q.get("key"),
    transport: q.get("transport") || "auto",
    onMessage: onMessage,
    onState: (s) => {
      document.body.dataset.state = s;
      if (s !== "connected") clearAll(); // nothing stale while away
    },
  });
  state.feed = feed;
  feed.start();
})();
