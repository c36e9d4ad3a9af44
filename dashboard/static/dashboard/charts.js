// The dashboard's history: four uPlot charts by class and a timeline of the models each
// server held, re-read from /dashboard/history.json every few seconds and on a range change.
"use strict";
const SwitchyardCharts = (() => {
  const {el, secs, stamp} = Switchyard;
  const COLORS = {interactive: "#c62828", high: "#b26a00", normal: "#1565c0", background: "#5e5e5e"};
  const EVERY_MS = 10000;
  const charts = {};
  let url = null;
  let range = "1h";
  let timer = null;

  function chart(id, data, key, history, unit) {
    const node = document.getElementById(id);
    const rows = [history.minutes, ...history.classes.map((c) => data[c])];
    const width = Math.max(node.clientWidth, 240);
    node.dataset.points = String(history.minutes.length);
    node.dataset.dots = String(rows.slice(1).reduce((n, data) => n + loneAt(data).length, 0));
    if (charts[id] && charts[id].range === range) {
      charts[id].plot.setData(rows);
      if (charts[id].plot.width !== width) charts[id].plot.setSize({width, height: 170});
      return;
    }
    if (charts[id]) charts[id].plot.destroy();
    const plot = new uPlot({
      width, height: 170,
      scales: {x: {time: true}, y: {range: (u, min, max) => [0, Math.max(max || 0, 1) * 1.08]}},
      series: [{value: (u, v) => (v === null ? "–" : stamp(new Date(v * 1000)))},
        ...history.classes.map((c) => ({
          label: c, stroke: COLORS[c], width: 1.5, points: {size: 5, fill: COLORS[c], filter: lone},
          value: (u, v) => (v === null ? "–" : unit === "s" ? secs(v) : String(v)),
        }))],
      axes: [{values: (u, splits) => splits.map((v) => hhmm(new Date(v * 1000)))}, {size: 50}],
    }, rows, node);
    charts[id] = {plot, range};
  }

  function timeline(history) {
    const box = document.getElementById("timeline");
    const from = Date.parse(history.since);
    const to = Date.parse(history.at);
    const span = Math.max(to - from, 1);
    const pct = (t) => `${Math.max(Math.min((t - from) / span, 1), 0) * 100}%`;
    if (!history.timeline.length) {
      box.replaceChildren(el("p", {class: "muted"}, "No servers yet."));
      return;
    }
    box.replaceChildren(...history.timeline.map((row) => el("div", {class: "lane", "data-server": row.server},
      el("span", {class: "lane-name"}, row.server),
      el("div", {class: "track", style: `--rows:${row.rows}`}, ...row.spans.map((s) => {
        const start = Math.max(Date.parse(s.started_at), from);
        const end = s.ended_at ? Date.parse(s.ended_at) : to;
        const loaded = s.loaded_at ? Date.parse(s.loaded_at) : end;
        const what = `${s.model}: on ${secs(s.stay_s)}`
          + (s.load_s !== null ? `, loaded in ${secs(s.load_s)}` : s.failed ? ", load failed" : ", loading")
          + ` (from ${stamp(new Date(s.started_at))}`
          + (s.ended_at ? ` to ${stamp(new Date(s.ended_at))})` : ", still there)");
        const bar = el("div", {class: "span" + (s.failed ? " failed" : ""), "data-model": s.model,
          title: what, tabindex: "0", "aria-label": what,
          style: `left:${pct(start)};width:calc(${pct(end)} - ${pct(start)});--row:${s.row};`
            + `--hue:${hue(s.model)};--load:${((loaded - start) / Math.max(end - start, 1)) * 100}%`},
        el("span", {class: "span-label"}, `${s.model} ${secs(s.stay_s)}`));
        return bar;
      })))));
  }

  // A value with no neighbours (the waits of the one minute in which requests finished)
  // draws no line: it is drawn as a dot, or it would not show at all.
  const loneAt = (data) => data.flatMap((v, i) => (v !== null && data[i - 1] == null && data[i + 1] == null ? [i] : []));

  function lone(u, seriesIdx, shown) {
    if (shown) return null;  // uPlot draws every point already
    const at = loneAt(u.data[seriesIdx]);
    return at.length ? at : null;
  }

  const hhmm = (d) => `${String(d.getHours()).padStart(2, "0")}:${String(d.getMinutes()).padStart(2, "0")}`;
  const hue = (name) => [...name].reduce((h, c) => (h * 31 + c.charCodeAt(0)) % 360, 7);

  async function refresh() {
    clearTimeout(timer);
    try {
      const response = await fetch(`${url}?range=${range}`, {headers: {Accept: "application/json"}});
      if (response.ok) {
        const history = await response.json();
        chart("chart-finished", history.finished, "finished", history, "");
        chart("chart-waiting", history.waiting, "waiting", history, "");
        chart("chart-p50", history.wait_p50_s, "p50", history, "s");
        chart("chart-p95", history.wait_p95_s, "p95", history, "s");
        timeline(history);
        Switchyard.setRecentP95(history.p95_wait_15m_s);
        Switchyard.setAccuracy(history.eta_accuracy);
        document.getElementById("history-at").textContent = `as of ${stamp(new Date(history.at))}`;
        document.querySelector(".charts").dataset.loaded = range;
      }
    } catch (error) {
      // Offline: the header says so; try again at the next tick.
    }
    timer = setTimeout(refresh, EVERY_MS);
  }

  return {
    start(historyUrl) {
      url = historyUrl;
      document.getElementById("range").addEventListener("change", (e) => {
        range = e.target.value;
        refresh();
      });
      window.addEventListener("resize", () => refresh());
      refresh();
    },
  };
})();
