// The dashboard's live pages: code highlighted, the speedup chart drawn, and every region marked
// data-live replaced by the same region of the page fetched again, every data-poll milliseconds, for as
// long as the page says its work is live. Nothing is fetched from anywhere but this server.
"use strict";

function highlight(root) {
  if (!window.hljs) return;
  root.querySelectorAll("pre code.language-python").forEach((el) => {
    if (!el.dataset.highlighted) window.hljs.highlightElement(el);
  });
}

let chart = null;

function chartData() {
  const el = document.getElementById("chart-data");
  return el ? JSON.parse(el.textContent || "[]") : null;
}

// Along the x axis: the evaluation's number ("n") or the seconds since the work began ("t").
function along() {
  const choice = document.getElementById("chart-x");
  return choice ? choice.value : "t";
}

function datasets(points) {
  const x = along();
  const ok = points.filter((p) => p.passed);
  const bad = points.filter((p) => !p.passed);
  return [
    { type: "line", label: "best so far (lower end)", data: points.map((p) => ({ x: p[x], y: p.best_low })),
      borderColor: "#1d3557", backgroundColor: "#1d3557", stepped: "before", pointRadius: 0, spanGaps: false },
    { type: "scatter", label: "correct candidate",
      data: ok.map((p) => ({ x: p[x], y: p.speedup, low: p.low, high: p.high, s: p.strategy, n: p.n, t: p.t })),
      backgroundColor: "#2a9d4b", pointRadius: 4 },
    { type: "bar", label: "95% interval", data: ok.map((p) => ({ x: p[x], y: [p.low, p.high] })),
      backgroundColor: "rgba(42,157,75,.25)", barThickness: 6, grouped: false },
    { type: "scatter", label: "rejected", data: bad.map((p) => ({ x: p[x], y: 0, s: p.strategy, st: p.status, n: p.n, t: p.t })),
      backgroundColor: "#d1495b", pointStyle: "crossRot", pointRadius: 6, borderColor: "#d1495b" },
  ];
}

function xScale(points) {
  if (along() === "t") {
    return { type: "linear", title: { display: true, text: "seconds since the work began" }, min: 0, max: undefined,
             ticks: { stepSize: undefined, callback: (v) => v } };
  }
  // one evaluation per step, with a step of room on either side
  return { type: "linear", title: { display: true, text: "evaluation" }, min: 0, max: points.length + 1,
           ticks: { stepSize: 1, callback: (v) => (Number.isInteger(v) && v > 0 ? v : "") } };
}

function when(r) {
  return r.t == null ? `#${r.n}` : `#${r.n} at ${r.t.toFixed(0)} s`;
}

function drawChart() {
  const points = chartData();
  const canvas = document.getElementById("chart");
  if (!points || !canvas || !window.Chart) return;
  const empty = document.getElementById("chart-empty");
  if (empty) empty.hidden = points.length > 0;
  if (chart) {
    const fresh = datasets(points);
    chart.data.datasets.forEach((ds, i) => { ds.data = fresh[i].data; });
    chart.options.scales.x = xScale(points);
    chart.update("none");
    canvas.dataset.points = String(points.length);
    return;
  }
  chart = new window.Chart(canvas, {
    data: { datasets: datasets(points) },
    options: {
      animation: false, maintainAspectRatio: false, parsing: true,
      scales: {
        x: xScale(points),
        y: { title: { display: true, text: "speedup over the reference" }, beginAtZero: true },
      },
      plugins: {
        legend: { labels: { boxWidth: 12, font: { size: 11 } } },
        tooltip: { callbacks: { label: (c) => {
          const r = c.raw;
          if (c.dataset.label === "rejected") return `${when(r)} ${r.s}: ${r.st}`;
          if (c.dataset.label === "correct candidate") {
            return `${when(r)} ${r.s}: ${r.y.toFixed(2)}x (${r.low.toFixed(2)}–${r.high.toFixed(2)}x)`;
          }
          if (Array.isArray(r.y)) return `interval ${r.y[0].toFixed(2)}–${r.y[1].toFixed(2)}x`;
          return `best so far ${r.y == null ? "-" : r.y.toFixed(2) + "x"}`;
        } } },
      },
    },
  });
  canvas.dataset.points = String(points.length);
}

async function refresh() {
  const poll = Number(document.body.dataset.poll || 0);
  if (!poll) return;
  try {
    const reply = await fetch(window.location.href, { credentials: "same-origin", cache: "no-store" });
    if (reply.ok) {
      const fresh = new DOMParser().parseFromString(await reply.text(), "text/html");
      document.querySelectorAll("[data-live][id]").forEach((el) => {
        const next = fresh.getElementById(el.id);
        if (!next) return;
        if (el.dataset.key !== undefined && el.dataset.key === next.dataset.key && el.id === "best") return;
        if (el.innerHTML !== next.innerHTML) { el.innerHTML = next.innerHTML; highlight(el); }
        if (next.dataset.key !== undefined) el.dataset.key = next.dataset.key;
      });
      drawChart();
      const state = document.getElementById("live-state");
      const nextPoll = fresh.body.dataset.poll;
      if (nextPoll) {
        document.body.dataset.poll = nextPoll;
        if (state) state.textContent = "live · updated " + new Date().toLocaleTimeString();
      } else {
        delete document.body.dataset.poll;
        if (state) state.textContent = "finished · updated " + new Date().toLocaleTimeString();
      }
    }
  } catch (err) {
    const state = document.getElementById("live-state");
    if (state) state.textContent = "the daemon does not answer";
  }
  const again = Number(document.body.dataset.poll || 0);
  if (again) window.setTimeout(refresh, again);
}

document.addEventListener("DOMContentLoaded", () => {
  highlight(document);
  drawChart();
  const choice = document.getElementById("chart-x");
  if (choice) choice.addEventListener("change", drawChart);
  const poll = Number(document.body.dataset.poll || 0);
  if (poll) window.setTimeout(refresh, poll);
});
