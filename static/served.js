// Served drafters: served τ over time and p_i per position, beside the run's eval and held-out walk,
// for every [data-served] section (the run page's Served section, an endpoint's page). Data: GET
// /serving/<id>/data (bucketed in SQL like the run charts), again every refresh interval unless zoomed.
(function () {
  "use strict";
  if (typeof uPlot === "undefined" || !window.ddPlot) return;
  var P = window.ddPlot, C = P.COLORS;
  var REFRESH_MS = 15000;
  var seen = { loads: 0, data: {} };  // what tests and people can read back
  window.ddServed = seen;

  function flat(n, v) { var out = new Array(n); for (var i = 0; i < n; i++) out[i] = v; return out; }

  function line(label, color, dash) {
    return { label: label, stroke: color, width: 2, dash: dash || [], spanGaps: true, value: function (u, v) { return P.fmtY(v); } };
  }

  function tauSpec(d) {
    var s = d.series[0];
    if (!s.x.length) return null;
    var n = s.x.length, sglang = d.kind === "sglang";
    var data = [s.x.map(function (ms) { return ms / 1000; }), s.y, s.max, s.min];
    var series = [{ label: "time" }, line(sglang ? "served accept length (SGLang, last interval)" : "served τ incl. bonus", C[0])];
    series.push({ label: "max", stroke: P.fade(C[0], 0.25), width: 1, spanGaps: true, ddBandEdge: true });
    series.push({ label: "min", stroke: P.fade(C[0], 0.25), width: 1, spanGaps: true, ddBandEdge: true });
    [["eval_tau", "eval τ (real decoding" + (d.eval_job ? ", job " + d.eval_job : "") + ")", C[1], [6, 4]],
     ["target_tau", "held-out walk, by the target", C[2], [2, 3]]].forEach(function (ref) {
      if (d[ref[0]] === null || d[ref[0]] === undefined) return;
      data.push(flat(n, d[ref[0]]));
      var s = line(ref[1], ref[2], ref[3]);
      s.points = { show: false };  // a level to compare with, not measurements
      series.push(s);
    });
    return { data: data, series: series, bands: [{ series: [2, 3], fill: P.fade(C[0], 0.12) }] };
  }

  function posSpec(d) {
    var p = d.positions, k = Math.max(p.served.length, p.eval.length, p.walked.length);
    if (!k) return null;
    var xs = [], i;
    for (i = 0; i < k; i++) xs.push(i);
    var data = [xs], series = [{ label: "position i" }];
    [["served", "served (" + p.served_drafts.toLocaleString() + " drafts)", C[0]],
     ["eval", "eval, real decoding (" + p.eval_steps.toLocaleString() + " steps)", C[1]],
     ["walked", "held-out walk, by the data" + (p.walked_step !== null ? " (step " + p.walked_step.toLocaleString() + ")" : ""), C[2]]].forEach(function (src) {
      if (!p[src[0]].length) return;
      data.push(xs.map(function (j) { var v = p[src[0]][j]; return v === undefined ? null : v; }));
      var s = line(src[1], src[2]);
      s.points = { show: true, size: 7 };
      series.push(s);
    });
    return data.length > 1 ? { data: data, series: series } : null;
  }

  function section(el) {
    var id = el.getAttribute("data-served");
    var tauEl = el.querySelector("[data-plot=tau]"), posEl = el.querySelector("[data-plot=pos]");
    var note = el.querySelector("[data-served-state]");
    var range = null, plots = {}, timer = null;

    function onSelect(u) {
      if (u.select.width < 4) return;
      var lo = u.posToVal(u.select.left, "x"), hi = u.posToVal(u.select.left + u.select.width, "x");
      u.setSelect({ left: 0, width: 0, top: 0, height: 0 }, false);
      if (hi <= lo) return;
      range = { lo: Math.floor(lo * 1000), hi: Math.ceil(hi * 1000) };
      load();
    }

    function put(name, target, spec, opts, emptyText) {
      if (plots[name]) { plots[name].destroy(); delete plots[name]; }
      if (!spec) { P.empty(target, emptyText); return; }
      plots[name] = P.draw(target, spec, opts);
    }

    function load() {
      var q = new URLSearchParams({ budget: String(Math.max(50, Math.min(2000, tauEl.clientWidth || 600))) });
      if (range) { q.set("lo", range.lo); q.set("hi", range.hi); }
      return fetch("/serving/" + id + "/data?" + q, { headers: { accept: "application/json" } }).then(function (r) {
        if (!r.ok) return r.json().then(function (e) { throw new Error(e.detail || r.statusText); });
        return r.json();
      }).then(function (d) {
        seen.loads += 1;
        seen.data[id] = d;
        put("tau", tauEl, tauSpec(d), { time: true, range: range ? [range.lo / 1000, range.hi / 1000] : null, onSelect: onSelect },
          "No window yet: a window needs two good scrapes with drafts between them.");
        put("pos", posEl, posSpec(d), { xValues: function (u, vals) { return vals.map(function (v) { return Number.isInteger(v) ? String(v) : ""; }); } },
          "No per-position counts yet.");
        var notes = d.series[0].level ? " · read from hourly sums; zoom in for every window" : "";
        var p = d.positions, k = p.served.length, own = p.eval.length || p.walked.length;
        if (k && own && k !== own) {  // one of the served_tau_low alert's likely causes, seen directly
          notes += " · the server drafts " + k + " tokens a step where the drafter proposes " + own +
            " (vLLM: num_speculative_tokens = B - 1)";
        }
        if (note) note.textContent = (range
          ? "zoomed: " + new Date(range.lo).toLocaleTimeString() + " – " + new Date(range.hi).toLocaleTimeString() + "; p_i over this range · double-click to reset"
          : "drag across the τ chart to zoom; p_i over the newest windows, as the table") + notes;
      }).catch(function (err) { if (note) note.textContent = "could not load the served charts: " + err.message; });
    }

    tauEl.addEventListener("dblclick", function () { range = null; load(); });
    timer = setInterval(function () { if (!range && !document.hidden) load(); }, REFRESH_MS);
    var resize = null;
    window.addEventListener("resize", function () { clearTimeout(resize); resize = setTimeout(load, 200); });
    load();
    return timer;
  }

  document.querySelectorAll("[data-served]").forEach(section);
})();
