// Dataset pages: token tooltips, the "as DFlash trains on it" toggle, uPlot charts.
// No inline scripts anywhere (CSP): everything is wired here, by event delegation so that htmx swaps keep working.
(function () {
  "use strict";
  var ANCHORS_KEY = "dd-show-anchors";

  function tip() { return document.getElementById("tok-tip"); }

  function row(key, value, cls) {
    var r = document.createElement("div");
    r.className = "tip-row";
    var k = document.createElement("span");
    k.className = "tip-key";
    k.textContent = key;
    var v = document.createElement("span");
    v.className = cls || "";
    v.textContent = value; // textContent: sample text is never parsed as HTML
    r.appendChild(k);
    r.appendChild(v);
    return r;
  }

  function showTip(chip, x, y) {
    var t = tip();
    if (!t) return;
    var mask = chip.getAttribute("data-m");
    t.replaceChildren(
      row("position", chip.getAttribute("data-p")),
      row("id", chip.getAttribute("data-id")),
      row("text", JSON.stringify(chip.getAttribute("data-t") || ""), "tip-text"),
      row("mask", mask + (mask === "1" ? " (trained)" : " (context)")),
    );
    if (chip.classList.contains("anchor")) t.appendChild(row("anchor", "valid DFlash block start"));
    t.hidden = false;
    var w = t.offsetWidth, h = t.offsetHeight;
    var left = Math.min(x + 12, window.innerWidth - w - 8);
    var top = y + 16 + h > window.innerHeight ? y - h - 10 : y + 16;
    t.style.left = Math.max(4, left) + "px";
    t.style.top = Math.max(4, top) + "px";
  }

  document.addEventListener("mouseover", function (e) {
    var chip = e.target.closest && e.target.closest(".chips .tok");
    if (chip) showTip(chip, e.clientX, e.clientY);
  });
  document.addEventListener("mouseout", function (e) {
    var chip = e.target.closest && e.target.closest(".chips .tok");
    if (chip && (!e.relatedTarget || !chip.contains(e.relatedTarget))) {
      var t = tip();
      if (t) t.hidden = true;
    }
  });

  function setAnchors(button, on) {
    button.setAttribute("aria-pressed", on ? "true" : "false");
    var target = document.getElementById(button.getAttribute("data-target"));
    if (target) target.classList.toggle("show-anchors", on);
  }

  function applyAnchors(root) {
    var on = false;
    try { on = sessionStorage.getItem(ANCHORS_KEY) === "1"; } catch (err) { on = false; }
    (root || document).querySelectorAll(".toggle-anchors").forEach(function (b) { setAnchors(b, on); });
  }

  document.addEventListener("click", function (e) {
    var button = e.target.closest && e.target.closest(".toggle-anchors");
    if (!button) return;
    var on = button.getAttribute("aria-pressed") !== "true";
    try { sessionStorage.setItem(ANCHORS_KEY, on ? "1" : "0"); } catch (err) { /* private mode */ }
    document.querySelectorAll(".toggle-anchors").forEach(function (b) { setAnchors(b, on); });
  });

  // Arrow keys page through rows (not while typing in a field).
  document.addEventListener("keydown", function (e) {
    if (e.altKey || e.ctrlKey || e.metaKey || e.shiftKey) return;
    var t = e.target;
    if (t && (t.tagName === "INPUT" || t.tagName === "SELECT" || t.tagName === "TEXTAREA" || t.isContentEditable)) return;
    var id = e.key === "ArrowLeft" ? "nav-prev" : e.key === "ArrowRight" ? "nav-next" : null;
    var link = id && document.getElementById(id);
    if (link) {
      e.preventDefault();
      link.click();
    }
  });

  document.addEventListener("htmx:afterSwap", function () {
    var t = tip();
    if (t) t.hidden = true;
    applyAnchors(document);
  });

  // -- statistics charts (uPlot), data from the JSON endpoint named in data-stats --------------------
  // Bars over categories (bin labels, source names): x is the bin's index, the axis shows its label.
  function bars(el, labels, ys, xLabel, yLabel) {
    if (typeof uPlot === "undefined") return;
    var xs = labels.map(function (_, i) { return i; });
    var width = Math.max(300, el.clientWidth - 16);
    // Every bar keeps its bar, but only every `each`-th gets its label when they would not fit side by
    // side (about 7 px a character at the axis font, plus a gap), so labels never overlap on a phone.
    var longest = labels.reduce(function (n, l) { return Math.max(n, String(l).length); }, 1);
    var each = Math.max(1, Math.ceil(labels.length * (longest * 7 + 12) / Math.max(width - 70, 1)));
    var shown = xs.filter(function (i) { return i % each === 0; });
    var opts = {
      width: width, height: 240,
      // a bar's height is its count from zero: an axis from near the smallest bar made a 300-row
      // source next to a 400-row one look empty
      scales: { x: { time: false, range: [-0.6, Math.max(labels.length - 0.4, 0.6)] },
                y: { range: function (u, lo, hi) { return [0, hi > 0 ? hi * 1.08 : 1]; } } },
      axes: [
        { label: xLabel, splits: function () { return shown; },
          values: function (u, splits) { return splits.map(function (i) { return labels[i] || ""; }); } },
        { label: yLabel },
      ],
      series: [
        { label: xLabel, value: function (u, i) { return i == null ? "hover a bar" : (labels[i] || ""); } },
        { label: yLabel, value: function (u, v) { return v == null ? "" : Number(v).toLocaleString("en"); }, fill: "rgba(47,91,211,0.35)", stroke: "#2f5bd3", points: { show: false },
          paths: uPlot.paths && uPlot.paths.bars ? uPlot.paths.bars({ size: [0.8, 80] }) : undefined },
      ],
    };
    el.replaceChildren();
    el.setAttribute("data-x-labels", String(shown.length));
    // the y axis' lowest value once the scales are set: 0, what a reader (and a test) can check
    opts.hooks = { setScale: [function (u, key) { if (key === "y") el.setAttribute("data-y-min", String(u.scales.y.min)); }] };
    new uPlot(opts, [xs, ys], el);
  }

  function drawCharts() {
    var charts = document.querySelectorAll(".chart[data-stats]");
    if (!charts.length) return;
    var url = charts[0].getAttribute("data-stats");
    fetch(url, { credentials: "same-origin" }).then(function (r) { return r.json(); }).then(function (data) {
      charts.forEach(function (el) {
        var key = el.getAttribute("data-key");
        if (key === "per_source") {
          var rows = data.per_source || [];
          bars(el, rows.map(function (s) { return s.source.split("/").pop(); }),
            rows.map(function (s) { return s.rows; }), "source file", "rows");
          el.setAttribute("data-drawn", String(rows.length));
          return;
        }
        var h = data[key];
        if (!h) return;
        bars(el, h.labels, h.counts, el.getAttribute("data-label") || key, "rows");
        el.setAttribute("data-drawn", String(h.counts.length));
      });
    });
  }

  function ready() {
    applyAnchors(document);
    drawCharts();
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", ready);
  else ready();
})();
