// Live dashboard: render the full state each websocket message carries.
"use strict";
const Switchyard = (() => {
  const el = (tag, attrs = {}, ...children) => {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    for (const c of children) node.append(c instanceof Node ? c : String(c ?? ""));
    return node;
  };
  const initial = JSON.parse(document.getElementById("initial-state").textContent);

  function progress(p) {
    if (!p) return "";
    const label = `${p.elapsed_s}s` + (p.expected_s ? ` of ~${p.expected_s}s` : "") +
      (p.estimated ? " (estimate)" : "");
    const bar = el("progress", {max: 1, "data-estimated": p.estimated});
    if (p.fraction !== null) bar.value = p.fraction;
    return el("span", {class: "load"}, bar, " ", label);
  }

  function renderOverview(state) {
    const servers = document.getElementById("servers");
    servers.replaceChildren(...state.servers.map((s) => el("div", {class: "server", "data-server": s.name},
      el("strong", {}, s.name), " ",
      el("span", {class: "badge" + (s.simulated ? " simulated" : "")}, s.simulated ? "simulated" : s.kind), " ",
      el("span", {class: "health-" + s.health}, s.health), ` · slots ${s.in_use}/${s.slots}`,
      el("ul", {}, ...s.models.map((m) => el("li", {"data-model": m.model},
        `${m.model}: ${m.state}` + (m.in_flight ? ` (${m.in_flight} in flight)` : ""), " ",
        progress(m.progress)))))));
    document.getElementById("waiting-total").textContent = `(${state.waiting_total})`;
    const rows = state.waiting.map((r, i) => el("tr", {"data-request": r.id},
      el("td", {}, i + 1), el("td", {}, el("a", {href: `/requests/${r.id}/`}, r.model)),
      el("td", {}, r.priority), el("td", {}, r.state), el("td", {}, r.server || "–"),
      el("td", {}, `${r.waited_s}s`)));
    document.querySelector("#waiting tbody").replaceChildren(...rows);
  }

  function renderRequest(r) {
    if (!r) return;
    const facts = [["state", r.state], ["model", r.model], ["priority", r.priority],
      ["server", r.server || "–"], ["position", r.position ?? "–"],
      ["ETA", r.eta_s ? `~${r.eta_s}s` : "–"], ["error", r.error || "–"]];
    document.getElementById("request").replaceChildren(...facts.flatMap(([k, v]) =>
      [el("dt", {}, k), el("dd", {id: "request-" + k.toLowerCase()}, v)]));
    document.getElementById("load").replaceChildren(r.load ? progress(r.load) : "");
    document.querySelector("#trace tbody").replaceChildren(...r.trace.map((t) => el("tr", {},
      el("td", {}, t.at), el("td", {}, t.from), el("td", {}, t.to), el("td", {}, t.server),
      el("td", {}, t.reason))));
  }

  function connect(path, onState) {
    const live = document.getElementById("live");
    const ws = new WebSocket((location.protocol === "https:" ? "wss://" : "ws://") + location.host + path);
    ws.onopen = () => { live.textContent = "live"; live.className = "live on"; };
    ws.onmessage = (e) => onState(JSON.parse(e.data).state);
    ws.onclose = () => {
      live.textContent = "reconnecting…"; live.className = "live off";
      setTimeout(() => connect(path, onState), 2000);
    };
  }

  return {
    overview(path) { renderOverview(initial); connect(path, renderOverview); },
    request(path) { renderRequest(initial); connect(path, renderRequest); },
  };
})();
