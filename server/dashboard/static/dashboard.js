// hacfed dashboard: polls /api/state every 2 s and redraws. Everything shown is set with
// textContent, never parsed as markup: participant ids, codes and errors come from other organizations.
"use strict";
(function () {
  const POLL_MS = 2000;
  const PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"];
  const PARTS = ["rollout", "training", "eval", "exchange", "coordinator"];
  const charts = {};

  function el(id) { return document.getElementById(id); }
  function fmt(v, digits) { return v === null || v === undefined ? "-" : Number(v).toFixed(digits); }
  function cell(row, text, cls) {
    const td = document.createElement("td");
    td.textContent = text;
    if (cls) td.className = cls;
    row.appendChild(td);
    return td;
  }
  function fillTable(id, rows, render) {
    const body = el(id).querySelector("tbody");
    const fresh = document.createElement("tbody");
    for (const r of rows) { const tr = document.createElement("tr"); render(tr, r); fresh.appendChild(tr); }
    body.replaceWith(fresh);
  }

  function drawRound(round, runId) {
    el("run-id").textContent = runId ? "run " + runId : "";
    const cur = round.current;
    if (!cur) { el("round-text").textContent = "no round opened yet"; return; }
    const done = round.done ? " — federation finished" : "";
    el("round-text").textContent = "round " + cur.id + " (" + round.closed + " of " + round.total +
      " closed): " + cur.state + (cur.close_reason ? " (" + cur.close_reason + ")" : "") + done;
    const bar = el("round-progress");
    bar.max = Math.max(cur.deadline_s, 1e-9);
    bar.value = Math.min(cur.elapsed_s, cur.deadline_s);
    el("round-detail").textContent = fmt(cur.elapsed_s, 1) + " s of the " + fmt(cur.deadline_s, 0) +
      " s deadline" + (cur.state === "OPEN" ? ", " + fmt(cur.remaining_s, 0) + " s left" : "") +
      "; submitted: " + cur.submitted.length + (cur.expected ? " of " + cur.expected : "") +
      (cur.submitted.length ? " (" + cur.submitted.join(", ") + ")" : "") +
      (cur.extensions ? "; deadline extended " + cur.extensions + "x" : "");
  }

  function drawSplit(times) {
    const n = times.rounds.length;
    if (!n) { el("round-split").textContent = ""; return; }
    const i = n - 1;
    el("round-split").textContent = "last timed round " + times.rounds[i] + ": " + fmt(times.wall[i], 1) + " s = " +
      PARTS.map(function (p) { return p + " " + fmt(times[p][i], 1); }).join(" + ") +
      (times.slowest[i] ? " (slowest: " + times.slowest[i] + ")" : "");
  }

  // The staleness of the samples of a lab's latest update (max_staleness >= 1); empty when there is none.
  function staleness(p) {
    if (p.stale_max === null || p.stale_max === undefined) return "";
    return "max " + p.stale_max + ", mean " + fmt(p.stale_mean, 2) + " (step " + p.stale_step + ")";
  }

  // How its partners' samples act on a lab, from its latest step report (learner.py).
  function partnerUse(p) {
    if (p.partner_grad === null && p.partner_context === null) return "";
    return (p.partner_grad === null ? "" : fmt(100 * p.partner_grad, 0) + " % with gradient") +
      (p.partner_context === null ? "" : (p.partner_grad === null ? "" : ", ") +
       fmt(100 * p.partner_context, 0) + " % as hints");
  }

  function trust(p) {
    const names = Object.keys(p.trust || {});
    return names.map(function (n) { return n + " " + fmt(p.trust[n], 2); }).join(", ") +
      (p.trust_more ? " (+" + p.trust_more + " more)" : "");
  }

  function drawParticipants(list) {
    fillTable("participants", list, function (tr, p) {
      tr.dataset.participant = p.id;
      cell(tr, p.id);
      cell(tr, p.connected ? "yes" : (p.joined ? "no (seen " + fmt(p.last_seen_s, 0) + " s ago)" : "not joined"),
           p.connected ? "yes" : "no");
      cell(tr, p.fingerprint || (p.registered ? "?" : "not registered"));
      cell(tr, String(p.strikes), p.strikes ? "num bad" : "num");
      cell(tr, p.quarantined ? "yes (round " + p.quarantined_round + ")" : "no", p.quarantined ? "bad" : "no");
      cell(tr, p.submitted_this_round ? "submitted" : "-");
      cell(tr, p.last_round === null ? "-" : String(p.last_round), "num pace-round");
      cell(tr, p.behind === null ? "-" : String(p.behind), p.behind > 1 ? "num bad pace-behind" : "num pace-behind");
      cell(tr, p.waiting_s !== null ? "waiting " + fmt(p.waiting_s, 1) + " s" :
               (p.idle_last_s === null ? "-" : fmt(p.idle_last_s, 1) + " s"), "num pace-idle");
      cell(tr, p.idle_s === null ? "-" : fmt(p.idle_s, 1) + " s" +
               (p.idle_share === null ? "" : " (" + fmt(100 * p.idle_share, 0) + " %)"), "num pace-idle-total");
      cell(tr, staleness(p), "num pace-stale");
      cell(tr, String(p.accepted), "num");
      cell(tr, String(p.rejected), p.rejected ? "num bad" : "num");
      cell(tr, fmt(p.reward, 2), "num");
      cell(tr, fmt(p.truncated, 2), p.truncated > 0.1 ? "num bad" : "num");
      cell(tr, fmt(p.capability, 2), "num");
      cell(tr, fmt(p.kl_start, 3), "num learner-kl");
      cell(tr, fmt(p.form_share, 2), p.form_share !== null && p.form_share < 0.5 ? "num bad learner-form" :
           "num learner-form");
      cell(tr, partnerUse(p), "learner-partners");
      cell(tr, trust(p), "learner-trust");
    });
  }

  // One line per lab whose responses are mostly cut at the budget (the warning hacfed-client prints).
  function drawWarnings(list) {
    const box = el("warnings");
    box.replaceChildren();
    for (const p of list) {
      if (!p.truncation_warning) continue;
      const li = document.createElement("li");
      li.textContent = p.truncation_warning;
      li.dataset.participant = p.id;
      box.appendChild(li);
    }
  }

  function drawCounts(c) {
    el("counts-text").textContent = "accepted " + c.accepted + ", rejected " + c.rejected +
      (c.rejected ? " (" + Object.keys(c.codes).map(function (k) { return k + " x" + c.codes[k]; }).join(", ") + ")" : "");
    const rows = c.by_lab.length ? c.by_lab : [{ id: "-", code: "no rejections", n: 0 }];
    fillTable("codes", rows, function (tr, r) {
      cell(tr, r.id === null ? "(unauthenticated)" : r.id);
      cell(tr, r.code);
      cell(tr, String(r.n), "num");
    });
  }

  function chart(id, names, xs, ys, yLabel, range) {
    const key = id + "|" + names.join(",");
    const data = [xs].concat(ys);
    const holder = el(id);
    if (charts[id] && charts[id].key === key) { charts[id].plot.setData(data); return; }
    if (charts[id]) charts[id].plot.destroy();
    const series = [{ label: "round" }].concat(names.map(function (n, i) {
      return { label: n, stroke: PALETTE[i % PALETTE.length], width: 2, spanGaps: true,
               points: { show: true, size: 5 } };
    }));
    const opts = { width: 640, height: 240, series: series,
                   scales: { x: { time: false }, y: range ? { range: range } : {} },
                   axes: [{ label: "round", incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500] }, { label: yLabel }] };
    charts[id] = { key: key, plot: new uPlot(opts, data, holder) };
    holder.dataset.series = String(names.length);
  }

  function drawCharts(curves, times) {
    const labs = curves.labs;
    const pick = function (m) { return labs.map(function (l) { return curves[m][l]; }); };
    chart("chart-reward", labs, curves.rounds, pick("reward"), "mean reward", [0, 1]);
    chart("chart-capability", labs, curves.rounds, pick("capability"), "P̂", [0, 1]);
    chart("chart-eval", labs, curves.rounds, pick("eval_accuracy"), "accuracy", [0, 1]);
    chart("chart-times", PARTS, times.rounds, PARTS.map(function (p) { return times[p]; }), "seconds", null);
    for (const id of ["chart-reward", "chart-capability", "chart-eval"]) el(id).dataset.points = String(curves.rounds.length);
    el("chart-times").dataset.points = String(times.rounds.length);
  }

  function draw(s) {
    const err = el("error");
    err.hidden = !s.error;
    err.textContent = s.error || "";
    if (!s.round) return;
    drawRound(s.round, s.run_id);
    drawParticipants(s.participants);
    drawWarnings(s.participants);
    drawCounts(s.counts);
    drawCharts(s.curves, s.times);
    drawSplit(s.times);
    el("updated").textContent = "updated " + new Date(s.now * 1000).toLocaleTimeString();
    document.body.dataset.round = s.round.current ? String(s.round.current.id) : "";
  }

  function poll() {
    fetch("/api/state", { cache: "no-store" })
      .then(function (r) { if (!r.ok) throw new Error("HTTP " + r.status); return r.json(); })
      .then(draw)
      .catch(function (e) { const err = el("error"); err.hidden = false; err.textContent = "poll failed: " + e.message; })
      .finally(function () { setTimeout(poll, POLL_MS); });
  }
  poll();
})();
