// The studio: try a line, preview readings and edit the user dictionary, manage the phrase
// cache, watch the running Speaker. Calls /studio/api/... and the VOICEVOX dictionary routes.
"use strict";

(function () {
  const q = new URLSearchParams(window.location.search);
  const key = q.get("key") || "";
  const $ = (id) => document.getElementById(id);
  const state = { info: null, lastWav: null, dictChanges: 0 };
  window.__studio = state;

  async function api(method, path, body, raw) {
    const headers = {};
    if (key) headers.Authorization = "Bearer " + key;
    let data;
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      data = JSON.stringify(body);
    }
    const r = await fetch(path, { method: method, headers: headers, body: data, cache: "no-store" });
    if (!r.ok) {
      let detail = r.status + " " + r.statusText;
      try {
        const j = await r.json();
        detail = typeof j.detail === "string" ? j.detail : JSON.stringify(j.detail);
      } catch (e) { /* not JSON */ }
      throw new Error(detail);
    }
    if (raw) return r;
    return r.status === 204 ? null : r.json();
  }

  function say(el, text, error) {
    el.textContent = text;
    el.className = error ? "error" : "";
  }

  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined) e.textContent = text;
    if (cls) e.className = cls;
    return e;
  }

  // -- try a line ------------------------------------------------------------------------------
  function controls() {
    const out = {};
    for (const c of state.info.controls) out[c.name] = parseFloat($("ctl-" + c.name).value);
    return out;
  }

  function buildControls() {
    const box = $("controls");
    for (const c of state.info.controls) {
      const label = el("label", c.name + (c.unit ? " (" + c.unit + ")" : ""));
      label.title = c.doc;
      const input = el("input");
      input.type = "range";
      input.id = "ctl-" + c.name;
      input.min = c.min; input.max = c.name.endsWith("silence") ? 3 : c.max; input.step = c.step;
      input.value = c.default;
      const shown = el("output", String(c.default));
      input.oninput = () => { shown.textContent = input.value; };
      box.append(label, input, shown);
    }
    const select = $("try-voice");
    for (const v of state.info.voices) {
      const o = el("option", v.label);
      o.value = v.id;
      select.append(o);
    }
  }

  async function speak() {
    const info = $("try-info");
    say(info, "rendering…");
    try {
      const body = Object.assign({ text: $("try-text").value, voice: $("try-voice").value }, controls());
      const r = await api("POST", "/studio/api/speak", body, true);
      const blob = await r.blob();
      const samples = parseInt(r.headers.get("X-Audio-Samples"), 10);
      const rate = parseInt(r.headers.get("X-Sample-Rate"), 10);
      state.lastWav = { bytes: blob.size, samples: samples, rate: rate };
      const audio = $("try-audio");
      audio.src = URL.createObjectURL(blob);
      say(info, (samples / rate).toFixed(2) + " s");
      audio.play().catch(() => {}); // autoplay may be refused: the controls are there
    } catch (e) {
      say(info, e.message, true);
    }
  }

  async function sayOnStream() {
    const info = $("try-info");
    try {
      const body = Object.assign({ text: $("try-text").value, voice: $("try-voice").value }, controls());
      const r = await api("POST", "/studio/api/speaker/say", body);
      say(info, "queued #" + r.id);
    } catch (e) {
      say(info, e.message, true);
    }
  }

  // -- readings and the dictionary -------------------------------------------------------------
  async function preview() {
    try {
      const r = await api("POST", "/studio/api/reading", { text: $("reading-text").value });
      $("reading-before").textContent = r.spoken_without_dictionary;
      $("reading-after").textContent = r.spoken;
    } catch (e) {
      say($("reading-after"), e.message, true);
    }
  }

  async function loadDict() {
    const body = $("dict-words").querySelector("tbody");
    body.textContent = "";
    if (!state.info.dictionary) {
      body.append(el("tr", "no user dictionary here"));
      return;
    }
    const words = await api("GET", "/user_dict");
    for (const [uuid, w] of Object.entries(words)) {
      const tr = el("tr");
      const del = el("button", "remove", "small");
      del.onclick = async () => {
        await api("DELETE", "/user_dict_word/" + encodeURIComponent(uuid));
        state.dictChanges += 1;
        await loadDict();
        await preview();
      };
      const cell = el("td");
      cell.append(del);
      tr.append(el("td", w.surface), el("td", w.pronunciation), el("td", String(w.accent_type)), cell);
      body.append(tr);
    }
  }

  async function addWord() {
    const p = new URLSearchParams({
      surface: $("dict-surface").value, pronunciation: $("dict-pron").value,
      accent_type: $("dict-accent").value || "0",
    });
    try {
      await api("POST", "/user_dict_word?" + p.toString());
      state.dictChanges += 1;
      await loadDict();
      await preview();
    } catch (e) {
      say($("reading-after"), e.message, true);
    }
  }

  // -- the phrase cache ------------------------------------------------------------------------
  async function loadCache() {
    const body = $("cache-list").querySelector("tbody");
    body.textContent = "";
    if (!state.info.cache) {
      $("cache-info").textContent = "no phrase cache here";
      return;
    }
    const r = await api("GET", "/studio/api/cache?limit=100");
    $("cache-info").textContent = r.stats.entries + " entries, " + r.stats.audio_seconds.toFixed(1) + " s";
    for (const e of r.entries) {
      const tr = el("tr");
      tr.dataset.key = e.key;
      const play = el("button", "play", "small play");
      play.onclick = () => {
        const audio = $("cache-audio");
        audio.src = "/studio/api/cache/" + e.key + "/audio" + (key ? "?key=" + encodeURIComponent(key) : "");
        audio.play().catch(() => {});
      };
      const del = el("button", "remove", "small");
      del.onclick = async () => {
        await api("DELETE", "/studio/api/cache/" + e.key);
        await loadCache();
      };
      const cell = el("td");
      cell.append(play, " ", del);
      tr.append(el("td", e.text), el("td", e.seconds.toFixed(2)), el("td", String(e.hits)), el("td", e.source), cell);
      body.append(tr);
    }
  }

  async function prebuild() {
    const lines = $("cache-lines").value.split("\n").map((s) => s.trim()).filter((s) => s);
    $("cache-info").textContent = "rendering " + lines.length + " lines…";
    try {
      const body = Object.assign({ lines: lines, voice: $("try-voice").value }, controls());
      const r = await api("POST", "/studio/api/cache/prebuild", body);
      await loadCache();
      $("cache-info").textContent += " — " + r.summary;
    } catch (e) {
      say($("cache-info"), e.message, true);
    }
  }

  // -- the running Speaker ---------------------------------------------------------------------
  function describe(line) {
    let s = "#" + line.id + " [" + line.lane + "] " + line.text;
    if (line.spoken && line.spoken !== line.text) s += "  →  " + line.spoken;
    if (line.outcome) s += "  (" + line.outcome + ")";
    return s;
  }

  async function loadSpeaker() {
    const snap = await api("GET", "/studio/api/speaker");
    $("speaker-info").textContent = snap.speaker ? "" : "no Speaker runs here (serve --play OUTPUT)";
    $("speaker-current").textContent = snap.current ? describe(snap.current) : "—";
    for (const [id, lines] of [["speaker-queue", snap.queue], ["speaker-recent", snap.recent]]) {
      const list = $(id);
      list.textContent = "";
      for (const line of lines) list.append(el("li", describe(line)));
    }
  }

  let refresh = null;
  function soon() { // many events in a burst: one refresh
    if (refresh === null) refresh = setTimeout(() => { refresh = null; loadSpeaker(); }, 100);
  }

  async function main() {
    state.info = await api("GET", "/studio/api/info");
    buildControls();
    $("try-speak").onclick = speak;
    $("try-say").onclick = sayOnStream;
    $("try-say").disabled = !state.info.speaker;
    $("speaker-skip").onclick = () => api("POST", "/studio/api/speaker/skip");
    $("speaker-interrupt").onclick = () => api("POST", "/studio/api/speaker/interrupt");
    $("reading-go").onclick = preview;
    $("dict-add").onclick = addWord;
    $("cache-prebuild").onclick = prebuild;
    await Promise.all([preview(), loadDict(), loadCache(), loadSpeaker()]);
    const feed = new IrodoriFeed({
      key: key,
      onMessage: (m) => { if (m.type.startsWith("line_") || m.type === "hello") soon(); },
      onState: (s) => { $("status").textContent = s; },
    });
    feed.start();
    state.ready = true;
  }

  main().catch((e) => { $("status").textContent = "error: " + e.message; });
})();
