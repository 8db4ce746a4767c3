// What every chart of DraftDeck draws with (the run charts in charts.js, the served charts in served.js):
// the palette, number formats, a y axis as wide as its longest label, and one uPlot with those.
(function () {
  "use strict";
  var COLORS = ["#2f5bd3", "#c2410c", "#15803d", "#9333ea", "#0e7490", "#b91c1c", "#a16207", "#475467"];

  function fmtY(v) {
    if (v === null || v === undefined || !isFinite(v)) return "–";
    var a = Math.abs(v);
    return a !== 0 && (a < 1e-3 || a >= 1e5) ? v.toExponential(3) : String(Number(v.toPrecision(5)));
  }

  // Axis ticks: the fewest digits that tell the ticks apart ("1e-4", "2.5e-4", not ".000e-4" cut by the
  // axis), and an axis as wide as its longest label, so a live run's new scale never clips one.
  function fmtYTick(v) {
    if (v === null || v === undefined || !isFinite(v)) return "";
    var a = Math.abs(v);
    if (a !== 0 && (a < 1e-3 || a >= 1e5)) return v.toExponential(2).replace(/\.?0+e/, "e");
    return String(Number(v.toPrecision(4)));
  }

  function yAxisSize(u, values) {
    if (!values || !values.length) return 50;
    var longest = values.reduce(function (n, t) { return Math.max(n, String(t).length); }, 0);
    return Math.max(50, Math.ceil(longest * 7.5) + 18);
  }

  function fmtTick(v) {
    var a = Math.abs(v);
    if (a >= 1e9) return (v / 1e9).toFixed(1) + "G";
    if (a >= 1e6) return (v / 1e6).toFixed(1) + "M";
    if (a >= 1e4) return (v / 1e3).toFixed(0) + "k";
    return String(v);
  }

  function fade(hex, alpha) {
    var n = parseInt(hex.slice(1), 16);
    return "rgba(" + (n >> 16) + "," + ((n >> 8) & 255) + "," + (n & 255) + "," + alpha + ")";
  }

  function empty(el, text) {
    el.replaceChildren();
    var p = document.createElement("p");
    p.className = "muted small plot-empty";
    p.textContent = text;
    el.appendChild(p);
  }

  // One uPlot in `el` (emptied first): `spec` {data, series, bands}; `o` {time, range [lo, hi] in
  // the data's x units, logy, sync, onSelect}. The band's edges are drawn, not listed: their legend
  // rows would double the legend. Returns the plot.
  function draw(el, spec, o) {
    el.replaceChildren();
    var width = Math.max(240, el.clientWidth || 600);
    var x = o.range ? { time: !!o.time, auto: false, range: o.range } : { time: !!o.time };
    var opts = {
      width: width,
      height: width < 500 ? 200 : 240,
      series: spec.series,
      bands: spec.bands || [],
      legend: { live: true },
      cursor: { drag: { x: !!o.onSelect, y: false, setScale: false } },
      scales: { x: x, y: o.logy ? { distr: 3 } : {} },
      axes: [
        { values: o.time ? undefined : (o.xValues || function (u, vals) { return vals.map(fmtTick); }) },
        { size: yAxisSize, values: function (u, vals) { return vals.map(fmtYTick); } },
      ],
      hooks: o.onSelect ? { setSelect: [o.onSelect] } : {},
    };
    if (o.sync) opts.cursor.sync = { key: o.sync.key, setSeries: false };
    var u = new uPlot(opts, spec.data, el);
    var rows = u.root.querySelectorAll(".u-legend .u-series");
    spec.series.forEach(function (s, i) { if (s.ddBandEdge && rows[i]) rows[i].classList.add("band-edge"); });
    el.setAttribute("data-points", String(spec.data[0].length));
    return u;
  }

  window.ddPlot = { COLORS: COLORS, fmtY: fmtY, fmtYTick: fmtYTick, fmtTick: fmtTick, fade: fade, empty: empty, draw: draw };
})();
