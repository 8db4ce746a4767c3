// Run pages: uPlot charts of a run's (or several runs') metrics, fed by GET /runs/data (bucketed in SQL:
// a min/max band and the bucket's last value as the line) and the page's ONE SSE stream (GET /runs/stream).
// No inline scripts (CSP): the page hands its configuration over in #charts[data-config].
(function () {
  "use strict";
  var root = document.getElementById("charts");
  if (!root || typeof uPlot === "undefined" || !window.ddPlot) return;
  var cfg = JSON.parse(root.getAttribute("data-config"));
  var P = window.ddPlot, COLORS = P.COLORS, fmtY = P.fmtY, fade = P.fade;
  var DASHES = [[], [6, 4], [2, 3], [10, 3, 2, 3]];
  var state = { axis: "step", logy: false, smooth: 0, band: true, range: null };
  var store = {};      // "job|name" -> {x: [], y: [], min: [], max: [], steps: last step}
  var plots = {};      // chart id -> uPlot
  var stream = null;
  var cursor = null;
  var requestNo = 0;
  var sync = uPlot.sync("run-charts");
  // What tests and people can read back: arrivals over the stream and their latency from the write.
  var live = { arrivals: 0, latencies: [], requests: [] };
  window.ddCharts = live;

  function names() {
    var all = [];
    cfg.charts.forEach(function (c) { c.series.forEach(function (s) { if (all.indexOf(s[0]) < 0) all.push(s[0]); }); });
    return all;
  }

  function qs(extra) {
    var p = new URLSearchParams();
    cfg.jobs.forEach(function (j) { p.append("jobs", j); });
    names().forEach(function (n) { p.append("names", n); });
    Object.keys(extra || {}).forEach(function (k) { if (extra[k] !== null && extra[k] !== undefined) p.set(k, extra[k]); });
    return p.toString();
  }

  function budget() {
    var w = root.querySelector(".plot").clientWidth || 600;
    return Math.max(50, Math.min(cfg.budget_max, Math.round(w)));
  }

  function load() {
    var no = ++requestNo;
    var args = { x: state.axis, budget: budget() };
    if (state.range) { args.lo = state.range.lo; args.hi = state.range.hi; }
    var url = "/runs/data?" + qs(args);
    live.requests.push(url);
    setState(state.range ? "loading the zoomed range…" : "loading…");
    return fetch(url, { headers: { accept: "application/json" } }).then(function (r) {
      if (!r.ok) return r.json().then(function (e) { throw new Error(e.detail || r.statusText); });
      return r.json();
    }).then(function (data) {
      if (no !== requestNo) return;  // a newer request (zoom, axis) superseded this one
      store = {};
      data.series.forEach(function (s) {
        store[s.job + "|" + s.name] = { x: s.x, y: s.y, min: s.min, max: s.max, level: s.level, last: {} };
      });
      if (!stream) cursor = data.cursor;  // an open stream keeps its own cursor
      drawAll();
      setState(state.range ? "zoomed: " + fmtX(state.range.lo) + " – " + fmtX(state.range.hi) + levelNote() : "drag across a chart to zoom" + levelNote());
      if (cfg.live && !stream && root.getAttribute("data-stream") === "live") openStream();
    }).catch(function (err) { setState("could not load the charts: " + err.message); });
  }

  function levelNote() {
    var lv = 0;
    Object.keys(store).forEach(function (k) { lv = Math.max(lv, store[k].level || 0); });
    return lv ? " · read from rollups of " + Math.pow(8, lv).toLocaleString() + " steps; zoom in for raw points" : "";
  }

  function setState(text) { document.getElementById("chart-state").textContent = text; }

  function fmtX(v) {
    if (state.axis === "time") return new Date(v).toLocaleTimeString();
    return Math.round(v).toLocaleString();
  }

  // Debiased EMA (TensorBoard's): s_t = a*s + (1-a)*y over the points shown; gaps stay gaps.
  function ema(ys, a) {
    if (!a) return ys;
    var out = new Array(ys.length), num = 0, den = 0;
    for (var i = 0; i < ys.length; i++) {
      var y = ys[i];
      if (y === null || y === undefined || !isFinite(y)) { out[i] = null; continue; }
      num = a * num + (1 - a) * y;
      den = a * den + (1 - a);
      out[i] = num / den;
    }
    return out;
  }

  function logSafe(ys) {
    if (!state.logy) return ys;
    return ys.map(function (v) { return v !== null && v > 0 ? v : null; });
  }

  function colorOf(runIdx, seriesIdx) {
    return cfg.jobs.length > 1 ? COLORS[runIdx % COLORS.length] : COLORS[seriesIdx % COLORS.length];
  }

  function build(chart) {
    var tables = [], series = [{ label: state.axis }], bands = [], col = 1;
    cfg.jobs.forEach(function (job, ri) {
      chart.series.forEach(function (pair, si) {
        var s = store[job + "|" + pair[0]];
        if (!s || !s.x.length) return;
        // each series of a chart its own dash, so a line of nearly the same values as another
        // (train and held-out accuracy) shows through its gaps instead of hiding under it
        var color = colorOf(ri, si), dash = DASHES[si % DASHES.length];
        var label = (cfg.jobs.length > 1 ? "run " + job + " · " : "") + pair[1];
        var line = logSafe(ema(s.y, state.smooth));
        var cols = [s.x, line];
        series.push({ label: label, stroke: color, width: 2, dash: dash, spanGaps: true, value: function (u, v) { return fmtY(v); } });
        col += 1;
        if (state.smooth) {
          cols.push(logSafe(s.y));
          series.push({ label: label + " (raw)", stroke: fade(color, 0.3), width: 1, spanGaps: true, value: function (u, v) { return fmtY(v); } });
          col += 1;
        }
        if (state.band) {
          cols.push(logSafe(s.max), logSafe(s.min));
          series.push({ label: label + " max", stroke: fade(color, 0.25), width: 1, spanGaps: true, ddBandEdge: true, value: function (u, v) { return fmtY(v); } });
          series.push({ label: label + " min", stroke: fade(color, 0.25), width: 1, spanGaps: true, ddBandEdge: true, value: function (u, v) { return fmtY(v); } });
          bands.push({ series: [col, col + 1], fill: fade(color, 0.12) });
          col += 2;
        }
        tables.push(cols);
      });
    });
    if (chart.id === "tau" && state.axis === "step") {
      var marks = cfg.markers.filter(function (m) { return m.tau !== null; }).sort(function (a, b) { return a.step - b.step; });
      if (marks.length) {
        tables.push([marks.map(function (m) { return m.step; }), marks.map(function (m) { return m.tau; })]);
        series.push({ label: "real τ (eval)", stroke: "#111827", fill: "#f59e0b", width: 0, paths: function () { return null; },
          points: { show: true, size: 11, width: 2, stroke: "#111827", fill: "#f59e0b" }, value: function (u, v) { return fmtY(v); } });
      }
    }
    if (!tables.length) return null;
    var data = tables.length === 1 ? tables[0] : uPlot.join(tables);
    return { data: data, series: series, bands: bands };
  }

  function drawAll() {
    cfg.charts.forEach(function (chart) { draw(chart); });
    updateLatest();
  }

  function draw(chart) {
    var el = document.getElementById("plot-" + chart.id);
    if (!el) return;
    var spec = build(chart);
    if (plots[chart.id]) { plots[chart.id].destroy(); delete plots[chart.id]; }
    if (!spec) { P.empty(el, "No points yet."); return; }
    var time = state.axis === "time", range = null;
    if (time) spec.data = [spec.data[0].map(function (ms) { return ms / 1000; })].concat(spec.data.slice(1));
    if (state.range) range = time ? [state.range.lo / 1000, state.range.hi / 1000] : [state.range.lo, state.range.hi];
    plots[chart.id] = P.draw(el, spec, { time: time, range: range, logy: state.logy, sync: sync, onSelect: onSelect });
  }

  function onSelect(u) {
    if (u.select.width < 4) return;
    var lo = u.posToVal(u.select.left, "x"), hi = u.posToVal(u.select.left + u.select.width, "x");
    u.setSelect({ left: 0, width: 0, top: 0, height: 0 }, false);
    if (state.axis === "time") { lo *= 1000; hi *= 1000; }
    lo = Math.floor(lo); hi = Math.ceil(hi);
    if (hi <= lo) return;
    state.range = { lo: lo, hi: hi };
    document.getElementById("zoom-reset").disabled = false;
    load();
  }

  function updateLatest() {
    root.querySelectorAll("[data-latest]").forEach(function (td) {
      var s = store[td.getAttribute("data-latest")];
      if (s && s.y.length) td.textContent = fmtY(s.y[s.y.length - 1]);
    });
  }

  // -- live: the page's one stream ------------------------------------------------------------
  var pending = false;
  function openStream() {
    stream = new EventSource("/runs/stream?" + qs(cursor));
    root.setAttribute("data-stream", "open");
    cfg.jobs.forEach(function (job) { stream.addEventListener("m" + job, onPoints); });
    stream.addEventListener("runs", function (ev) {
      JSON.parse(ev.data).forEach(function (r) {
        document.querySelectorAll("#run-status[data-job='" + r.job + "'], [data-status-of='" + r.job + "']").forEach(function (el) {
          el.textContent = r.status;
          el.className = "status status-" + r.status;
        });
      });
    });
    stream.addEventListener("end", function () {
      stream.close();
      root.setAttribute("data-stream", "ended");
    });
  }

  // New points of one run. The query and the stream may overlap by a few points (the cursor is read
  // before the query runs): a point at or before a series' last x is already drawn.
  function onPoints(ev) {
    var now = Date.now();
    JSON.parse(ev.data).forEach(function (p) {
      var key = p.job + "|" + p.name;
      var x = state.axis === "step" ? p.step : state.axis === "tokens" ? p.tokens : p.time;
      if (x === null || x === undefined) return;
      var s = store[key];
      if (!s) s = store[key] = { x: [], y: [], min: [], max: [], level: 0 };
      if (s.x.length && x <= s.x[s.x.length - 1]) return;
      s.x.push(x); s.y.push(p.y); s.min.push(p.y); s.max.push(p.y);
      live.arrivals += 1;
      live.latencies.push(now - p.time);
    });
    if (!pending) {
      pending = true;
      requestAnimationFrame(function () { pending = false; drawAll(); });
    }
  }

  Object.defineProperty(live, "points", { get: function () {
    var out = {};
    Object.keys(store).forEach(function (k) { out[k] = store[k].x.length; });
    return out;
  } });
  live.series = function (key) { return store[key]; };
  live.plots = plots;

  // -- controls ---------------------------------------------------------------------------------
  document.getElementById("x-axis").addEventListener("change", function (e) {
    state.axis = e.target.value;
    state.range = null;
    document.getElementById("zoom-reset").disabled = true;
    load();
  });
  document.getElementById("log-y").addEventListener("change", function (e) { state.logy = e.target.checked; drawAll(); });
  document.getElementById("band").addEventListener("change", function (e) { state.band = e.target.checked; drawAll(); });
  document.getElementById("smooth").addEventListener("input", function (e) {
    state.smooth = Number(e.target.value);
    document.getElementById("smooth-value").textContent = state.smooth.toFixed(2);
    drawAll();
  });
  document.getElementById("zoom-reset").addEventListener("click", function (e) {
    state.range = null;
    e.target.disabled = true;
    load();
  });
  var resizeTimer = null;
  window.addEventListener("resize", function () {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(drawAll, 150);
  });

  load();
})();
