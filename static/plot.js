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

  // The legend away from the cursor shows each series' latest value (uPlot's own shows "--" until the
  // chart is hovered, so a glance told nothing): the x series says "(latest)" then.
  function lastIndex(u, si) {
    var d = u.data[si] || [];
    for (var i = d.length - 1; i >= 0; i--) if (d[i] !== null && d[i] !== undefined) return i;
    return null;
  }

  function latestLegend(series, time) {
    var stamp = time ? uPlot.fmtDate("{YYYY}-{MM}-{DD} {HH}:{mm}:{ss}") : null;
    var xText = function (v) { return v === null || v === undefined ? "–" : time ? stamp(new Date(v * 1000)) : fmtY(v); };
    return series.map(function (s, si) {
      var own = si === 0 ? function (u, v) { return xText(v); } : (s.value || function (u, v) { return fmtY(v); });
      var value = function (u, v, sIdx, idx) {
        if (idx !== null && idx !== undefined) return own(u, v, sIdx, idx);
        if (sIdx === 0) {
          var end = u.data[0] && u.data[0].length ? u.data[0][u.data[0].length - 1] : null;
          return end === null ? "–" : xText(end) + " (latest)";
        }
        var j = lastIndex(u, sIdx);
        return j === null ? "–" : own(u, u.data[sIdx][j], sIdx, j);
      };
      return Object.assign({}, s, { value: value });
    });
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
      series: latestLegend(spec.series, !!o.time),
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
