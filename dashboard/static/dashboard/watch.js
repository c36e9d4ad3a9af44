// The watch page: one request, live. State pushes redraw it; a streamed answer's text is
// appended as it comes, until the final state brings the whole answer.
"use strict";
const SwitchyardWatch = (() => {
  const {el, secs, clock, pill, progress, eta, since, syncClock} = Switchyard;
  const REASONS = {pending: "It is being placed on a server.",
    needs_loading: "Its model is being loaded.", ready: "It waits for a free slot."};
  const ENDS = {completed: "Done", failed: "Failed", expired: "Expired: it waited too long",
    cancelled: "Cancelled"};
  let streamed = "";
  // Where `streamed` begins in the answer (null before any text). A page opened while a
  // streamed answer is being written gets what follows, then the start it missed from the
  // caller's relay; until that comes (or, without one, until the end) it shows "…" first.
  let from = null;

  function confidence(a) {
    if (!a || a.checked < 5) return "too few requests lately to say how good estimates are";
    return `${Math.round(a.share_within * 10)} in 10 estimates of the last hour were within 20%`;
  }

  function now(r) {
    if (r.final) {
      const took = r.finished_at && r.created_at
        ? secs((Date.parse(r.finished_at) - Date.parse(r.created_at)) / 1000) : "–";
      return el("div", {class: `now final-${r.state}`, "data-state": r.state},
        el("div", {class: "big", id: "watch-headline"}, ENDS[r.state] || r.state),
        el("div", {class: "sub"}, `finished `, clock(r.finished_at), ` · ${took} in all`),
        r.error ? el("div", {class: "error why"}, r.error) : null);
    }
    if (r.state === "processing") {
      return el("div", {class: "now", "data-state": r.state},
        el("div", {class: "big", id: "watch-headline"}, "Being answered"),
        el("div", {class: "sub"}, "running for ", since(r.started_at), left(r.eta_s)));
    }
    return el("div", {class: "now", "data-state": r.state},
      el("div", {class: "big", id: "watch-headline"},
        r.position ? `Place ${r.position} of ${r.waiting_total}` : "Waiting"),
      el("div", {class: "sub", id: "watch-eta"}, "sent to a server in ", eta(r.eta_s),
        el("br"), el("span", {id: "watch-confidence"}, confidence(r.eta_accuracy))),
      el("div", {class: "why", id: "watch-reason"}, r.reason || REASONS[r.state] || ""),
      el("div", {class: "sub"}, "waiting for ", since(r.created_at)));
  }

  // Past its expected run, it ends "any moment": "about 0.0 s left" reads as wrong.
  const left = (s) => (s === null || s === undefined ? ""
    : el("span", {}, s > 0 ? ` · about ${secs(s)} left ` : " · should end any moment ",
      el("span", {class: "tag estimate"}, "estimate")));

  function render(r) {
    if (!r) return;
    syncClock(r.at);
    document.getElementById("watch-model").textContent = `· ${r.model}`;
    document.getElementById("watch-now").replaceChildren(now(r));
    document.getElementById("watch-load").replaceChildren(
      r.load ? el("p", {}, "Its model is loading:", el("br"), progress(r.load)) : "");
    if (r.answer) { streamed = r.answer; from = 0; }
    showAnswer();
    if (r.final && !r.answer && r.state === "completed") {
      document.getElementById("watch-answer").textContent = streamed || "(no text)";
    }
    document.getElementById("watch-steps").replaceChildren(...r.trace.map((t) =>
      el("li", {}, clock(t.at), " ", pill(t.to), " ", t.reason)));
  }

  function showAnswer() {
    const answer = document.getElementById("watch-answer");
    const joinedLate = from > 0 && streamed;
    const text = joinedLate ? `…${streamed}` : streamed;
    if (answer.textContent !== text) answer.textContent = text;
    document.getElementById("watch-answer-note").textContent = joinedLate
      ? "This page opened while the answer was being written: its start shows once it ends."
      : "";
  }

  // A piece of the answer that begins `at` characters in: after what the page has, or
  // (the start it asked for) before it; what both hold is shown once.
  function chunk(text, at) {
    const end = from === null ? null : from + streamed.length;
    if (at === undefined || at === null) at = end === null ? 0 : end;
    if (from === null) {
      from = at; streamed = text;
    } else if (at <= from) {
      const over = at + text.length - from;  // how far it reaches into what the page has
      streamed = text + (over >= 0 ? streamed.slice(over) : streamed);
      from = at;
    } else {
      streamed += at <= end ? text.slice(end - at) : text;  // past the end: a piece was lost
    }
    showAnswer();
  }

  return {start(path) { Switchyard.watch(path, render, chunk); }, chunk};
})();
