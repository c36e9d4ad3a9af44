// Live dashboard: each websocket message carries the full state, and the page is redrawn
// from it. Between messages a one-second tick moves clocks and estimated load bars along.
"use strict";
const Switchyard = (() => {
  const el = (tag, attrs = {}, ...children) => {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      if (v !== null && v !== undefined && v !== false) node.setAttribute(k, v);
    }
    for (const c of children) {
      if (c !== null && c !== undefined && c !== "") node.append(c instanceof Node ? c : String(c));
    }
    return node;
  };
  const initial = JSON.parse(document.getElementById("initial-state").textContent);

  // The server's clock, as this browser sees it: state.at is when the state was read.
  let skewMs = 0;
  const syncClock = (at) => { if (at) skewMs = Date.now() - Date.parse(at); };
  const serverNow = () => Date.now() - skewMs;

  // Under a tenth of a second in ms: a tiny model's run is not "0.0 s".
  const secs = (s) => (s === null || s === undefined ? "–"
    : s > 0 && s < 0.1 ? `${Math.round(s * 1000)} ms` : s < 60 ? `${s.toFixed(1)} s`
    : `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`);
  // One time format everywhere: ISO-like, in this browser's zone, the zone shown.
  const pad = (n) => String(n).padStart(2, "0");
  const zone = (d) => (new Intl.DateTimeFormat("en", {timeZoneName: "short"})
    .formatToParts(d).find((p) => p.type === "timeZoneName") || {value: ""}).value;
  const stamp = (d) => `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} `
    + `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())} ${zone(d)}`;
  const clock = (iso) => (iso ? el("time", {datetime: iso}, stamp(new Date(iso))) : "–");
  // A clock that counts up from `iso` (server time) on every tick; never below 0 (a row
  // stamped by another machine's clock, or read just before it was stamped).
  const elapsed = (iso) => secs(Math.max(0, (serverNow() - Date.parse(iso)) / 1000));
  const since = (iso, cls = "since") => el("span", {class: cls, "data-since": iso},
    iso ? elapsed(iso) : "–");
  const eta = (s) => (s === null || s === undefined ? el("span", {class: "muted"}, "unknown")
    : el("span", {class: "eta"}, s > 0 ? `~${secs(s)} ` : "any moment ",
      el("span", {class: "tag estimate"}, "estimate")));
  // Why a request waits: the policy's reason when it gives one, else what its state says.
  const STATE_REASONS = {pending: "not routed yet", needs_loading: "its model is loading",
    ready: "waiting for a free slot"};
  const reason = (r) => el("span", {class: "reason"}, r.reason || STATE_REASONS[r.state] || "–");
  const pill = (state) => el("span", {class: `pill state-${state}`}, state.replace("_", " "));

  function progress(p) {
    if (!p) return null;
    const bar = el("progress", {max: 1});
    if (p.fraction !== null) bar.value = p.fraction;
    const label = el("span", {class: "load-label"});
    const node = el("span", {
      class: "load", "data-started": p.started_at, "data-expected": p.expected_s,
      "data-estimated": p.estimated ? "true" : "false", "data-unloading": p.unloading,
    }, bar, " ", label, p.estimated ? el("span", {class: "tag estimate"}, "estimate") : null);
    if (p.fraction !== null && !p.estimated) node.dataset.fraction = p.fraction;
    tickLoad(node);
    return node;
  }

  // Redraw one load bar for the current time; only estimated bars move on their own.
  function tickLoad(node) {
    const elapsed = Math.max((serverNow() - Date.parse(node.dataset.started)) / 1000, 0);
    const label = node.querySelector(".load-label");
    if (node.dataset.unloading) {  // not begun: the bar stays indeterminate
      label.textContent = `unloading ${node.dataset.unloading} first, ${secs(elapsed)} so far `;
      return;
    }
    const expected = node.dataset.expected ? Number(node.dataset.expected) : null;
    const bar = node.querySelector("progress");
    const estimated = node.dataset.estimated === "true";
    // A load that runs past its estimate says so, not "99%" (the server gave no fraction).
    const over = expected && elapsed > expected;
    if (estimated && expected) bar.value = Math.min(elapsed / expected, 0.99);
    const pct = bar.hasAttribute("value") && !(estimated && over)
      ? ` · ${Math.round(bar.value * 100)}%` : "";
    const of = !expected ? ""
      : over ? `, past the ~${secs(expected)} expected` : ` of ~${secs(expected)}`;
    label.textContent = `loading ${secs(elapsed)}${of}${pct} `;
  }

  function tickUntil(node) {
    const left = (Date.parse(node.dataset.until) - serverNow()) / 1000;
    node.textContent = left > 0 ? `${secs(left)} left` : "ended, waiting for a probe";
  }

  function tick() {
    document.querySelectorAll("[data-since]").forEach((node) => {
      node.textContent = elapsed(node.dataset.since);
    });
    document.querySelectorAll("[data-until]").forEach(tickUntil);
    document.querySelectorAll(".load[data-started]").forEach(tickLoad);
  }

  function status(s) {
    const node = el("span", {class: `status status-${s.status}`}, s.status);
    if (s.status === "cooldown" && s.cooldown_until) {
      const left = el("span", {"data-until": s.cooldown_until});
      tickUntil(left);
      node.append(" until ", clock(s.cooldown_until), " (", left, ")");
    }
    return node;
  }

  function serverCard(s) {
    const kind = s.simulated
      ? el("span", {class: "badge simulated", title: "in-process demo server, not real hardware"}, "simulated")
      : el("span", {class: "badge"}, s.kind_label);
    const models = s.models.length
      ? el("ul", {class: "models"}, ...s.models.map((m) => el("li", {"data-model": m.model},
        el("span", {class: "model-name"}, m.model), " ", pill(m.state),
        m.pinned ? el("span", {class: "tag"}, "pinned") : null,
        m.keep_loaded_hours ? el("span", {class: "tag", title: "kept loaded " +
          m.keep_loaded_hours + " (SWITCHYARD_TIME_ZONE)"}, "kept loaded") : null,
        m.restore ? el("span", {class: "tag", title: "loaded back on an idle server for the " +
          "interactive work that used it; gives way to any request"}, "restore") : null,
        m.outside ? el("span", {class: "tag", title: "loaded on the server by someone else, " +
          "not through Switchyard; Switchyard uses it"}, "loaded outside") : null,
        m.in_flight || m.slots ? el("span", {class: "muted"}, ` ${m.in_flight}` +
          (m.slots ? `/${m.slots}` : "") + " in flight") : null,
        m.progress ? el("div", {}, progress(m.progress)) : null,
        m.error ? el("div", {class: "error"}, m.error) : null)))
      : el("p", {class: "muted"}, "no model loaded");
    // What an operator asked of this server and what it waits for.
    const intents = s.intents.length
      ? el("ul", {class: "intents"}, ...s.intents.map((i) => el("li", {"data-intent": i.id},
        el("span", {class: "tag", title: `asked by ${i.requested_by}`}, "operator"),
        ` ${i.action}${i.model ? " " + i.model : ""}: `, el("span", {class: "muted"}, i.reason))))
      : null;
    const slots = el("span", {class: "slots"}, `slots ${s.in_use}/${s.slots}`,
      el("meter", {min: 0, max: s.slots, value: s.in_use}));
    return el("article", {class: `server server-${s.status}` + (s.simulated ? " is-simulated" : ""),
      "data-server": s.name},
      el("header", {}, el("strong", {}, s.name), " ", kind, " ", status(s), " ", slots),
      s.last_error ? el("div", {class: "error"}, s.last_error) : null,
      models, intents);
  }

  const requestLink = (r) => el("a", {class: "request-link", href: `/requests/${r.id}/`},
    r.id.slice(0, 8));

  function fillTable(id, rows, emptyText, columns) {
    const body = document.querySelector(`#${id} tbody`);
    if (!rows.length) {
      const span = document.querySelectorAll(`#${id} thead th`).length;
      body.replaceChildren(el("tr", {class: "empty"}, el("td", {colspan: span}, emptyText)));
      return;
    }
    body.replaceChildren(...rows.map((r) => el("tr", {"data-request": r.id ?? null},
      ...columns(r).map((c) => el("td", {}, c)))));
  }

  // Nothing schedules without a live worker, and a worker whose passes fail plans nothing
  // new: said above everything, since every wait below is then explained by it.
  function renderWorkers(w) {
    const alert = document.getElementById("workers-alert");
    const said = [];
    if (w && w.live === 0) {
      said.push(el("p", {}, el("strong", {}, "No worker is running"),
        w.last_heartbeat ? ` (the last heartbeat was at ${stamp(new Date(w.last_heartbeat))})` : "",
        ": requests are taken, but none is routed, loaded or sent until one starts ",
        "(python manage.py run_scheduler)."));
    }
    for (const f of (w && w.failing) || []) {
      said.push(el("p", {}, el("strong", {}, `Worker ${f.id} on ${f.host} cannot plan`),
        ` since ${stamp(new Date(f.since))}: ${f.error}. It serves what it runs and tries `,
        "again; its log has the traceback."));
    }
    // Redrawn only when it says something new: an alert is read out each time it changes.
    const text = said.map((p) => p.textContent).join("\n");
    if (alert.dataset.said === text) return;
    alert.dataset.said = text;
    alert.replaceChildren(...said);
    alert.hidden = said.length === 0;
  }

  function renderOverview(state) {
    syncClock(state.at);
    renderWorkers(state.workers);
    const servers = document.getElementById("servers");
    if (state.servers.length) servers.replaceChildren(...state.servers.map(serverCard));
    else servers.replaceChildren(el("p", {class: "muted"}, "No servers yet: add one in the admin."));
    const more = state.waiting_total > state.waiting.length
      ? ` (showing the first ${state.waiting.length})` : "";
    document.getElementById("waiting-total").textContent = `${state.waiting_total}${more}`;
    fillTable("waiting", state.waiting, "Nobody is waiting.", (r) => [
      r.position, requestLink(r), r.model, r.priority, r.caller || "–", pill(r.state), r.server || "–",
      since(r.created_at), eta(r.eta_s), reason(r)]);
    lastClasses = state.classes || [];
    renderClasses();

    fillTable("running", state.running, "Nothing is running.", (r) => [
      requestLink(r), r.model, r.priority, r.caller || "–", r.server || "–", since(r.started_at),
      eta(r.eta_s)]);
    fillTable("recent", state.recent, "Nothing has finished yet.", (r) => [
      requestLink(r), r.model, r.priority, r.caller || "–", pill(r.state), r.server || "–",
      clock(r.finished_at),
      secs(r.waited_s), secs(r.took_s), r.error ? el("span", {class: "error"}, r.error) : ""]);
  }

  // The p95 waits come with the history (every few seconds), the counts with each push.
  let lastClasses = [];
  let recentP95 = {};
  function renderClasses() {
    if (!document.getElementById("classes")) return;
    fillTable("classes", lastClasses, "", (c) => [c.class, c.waiting, c.processing,
      c.oldest_wait_s === null ? "–" : secs(c.oldest_wait_s), secs(recentP95[c.class] ?? null),
      c.max_wait_s ? secs(c.max_wait_s) : "–", c.max_queue || "no limit of its own"]);
  }

  function accuracyText(a) {
    if (!a.checked) return "ETA accuracy (last hour): no request given an ETA has started yet.";
    const sent = a.checked === 1 ? "request was" : "requests were";
    return `ETA accuracy (last hour): ${Math.round(a.share_within * 100)}% of ${a.checked} `
      + `${sent} sent within ±20% of the ETA first given; median error ${secs(a.median_error_s)}.`;
  }

  function renderRequest(r) {
    const box = document.getElementById("request");
    if (!r) {
      box.replaceChildren(el("p", {class: "error"}, "This request no longer exists."));
      return;
    }
    syncClock(r.at);
    const waiting = r.position !== null;
    const first = r.eta_first;
    const facts = [
      ["state", pill(r.state)],
      ["position", waiting ? `${r.position} of ${r.waiting_total} waiting` : "–"],
      [waiting ? "sent in" : "ends in", waiting || r.state === "processing" ? eta(r.eta_s) : "–"],
      ["why", waiting ? reason(r) : "–"],
      ["first ETA", first ? `${secs(first.given_s)} at place ${first.position}`
        + (first.error_s === null ? "" : `, off by ${secs(Math.abs(first.error_s))}`
          + (first.error_s > 0 ? " (later)" : " (sooner)")) : "–"],
      ["model", r.model], ["priority", r.priority], ["caller", r.caller || "–"],
      ["server", r.server || "not routed yet"],
      ["waited", waiting ? since(r.created_at) : secs(r.waited_s)],
      ["took", r.state === "processing" ? since(r.started_at) : secs(r.took_s)],
      ["created", clock(r.created_at)], ["finished", clock(r.finished_at)],
      ["attempts", r.attempts],
    ];
    if (r.error) facts.push(["error", el("span", {class: "error"}, r.error)]);
    if (r.watch_url) facts.push(["watch link", el("a", {href: r.watch_url}, "the caller's page")]);
    box.replaceChildren(el("dl", {class: "facts"}, ...facts.flatMap(([k, v]) =>
      [el("dt", {}, k), el("dd", {id: "request-" + k.toLowerCase().replace(" ", "-")}, v)])));
    document.getElementById("load").replaceChildren(
      r.load ? el("p", {}, "Its model is loading: ", progress(r.load)) : "");
    document.getElementById("answer").replaceChildren(
      r.answer ? el("blockquote", {}, r.answer) : "");
    // Each step also as the time since the request arrived, to the millisecond: most of a
    // request's steps fall within one second of the clock.
    const arrived = new Date(r.created_at);
    fillTable("trace", r.trace, "No state changes yet.", (t) => [
      clock(t.at), `+${((new Date(t.at) - arrived) / 1000).toFixed(3)} s`,
      (t.from || "·").replace("_", " "), pill(t.to),
      t.server || "–", t.reason]);
  }

  // Disconnected, the page greys out and says since when: its figures are stale.
  let lostAt = null;
  function offline(text) {
    const live = document.getElementById("live");
    lostAt = lostAt || new Date();
    document.body.classList.add("disconnected");
    live.className = "live off";
    live.replaceChildren(`${text} since ${stamp(lostAt)}`);
  }

  function connect(path, onState, onChunk) {
    const live = document.getElementById("live");
    const ws = new WebSocket((location.protocol === "https:" ? "wss://" : "ws://") + location.host + path);
    ws.onopen = () => {
      lostAt = null;
      document.body.classList.remove("disconnected");
      live.textContent = "live"; live.className = "live on";
    };
    ws.onmessage = (e) => {
      const message = JSON.parse(e.data);
      if (message.type === "chunk") { if (onChunk) onChunk(message.text, message.at); } else onState(message.state);
    };
    ws.onclose = (e) => {
      if (e.code === 4403) {
        offline("signed out");
        return;
      }
      offline("disconnected, reconnecting");
      setTimeout(() => connect(path, onState, onChunk), 2000);
    };
  }

  function start(path, render, onChunk) {
    render(initial);
    connect(path, render, onChunk);
    setInterval(tick, 1000);
  }

  return {
    overview(path) { start(path, renderOverview); },
    request(path) { start(path, renderRequest); },
    watch(path, render, onChunk) { start(path, render, onChunk); },
    el, secs, stamp, clock, pill, progress, eta, since, syncClock,
    setRecentP95(values) { recentP95 = values; renderClasses(); },
    setAccuracy(a) { document.getElementById("eta-accuracy").textContent = accuracyText(a); },
  };
})();
