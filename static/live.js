// Live pages: ONE EventSource per page, on the element with data-sse (its events: app/web/sse.py's docstring).
// A plain EventSource rather than htmx's SSE extension: the stream's payloads are JSON (progress counts,
// log rows, and next metric points for charts), not HTML fragments to swap. Small updates are drawn here
// with textContent (never parsed as HTML); when a status changes, the server-rendered partial named by
// data-refresh is fetched again through htmx. EventSource reconnects by itself after a dropped
// connection, sending Last-Event-ID, so the server resumes without duplicates; on `end` we close it.
// Other scripts (the run page's charts) get every event as a "dd:sse" CustomEvent on document; a page
// names extra events to listen for in data-sse-events ("metrics").
(function () {
  "use strict";
  var root = document.querySelector("[data-sse]");
  if (!root || !window.EventSource) return;

  var refreshing = null;
  var again = false;

  // Fetch the partial again; calls while one is in flight coalesce into one more fetch after it.
  function refresh() {
    var url = root.getAttribute("data-refresh");
    var target = root.firstElementChild;
    if (!url || !target || !window.htmx) return;
    if (refreshing) { again = true; return; }
    refreshing = window.htmx.ajax("GET", url, { target: "#" + target.id, swap: "outerHTML" });
    Promise.resolve(refreshing).finally(function () {
      refreshing = null;
      if (again) { again = false; refresh(); }
    });
  }

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  // The structure of templates/partials/progress.html, from the stream's progress payload.
  function drawProgress(span, status, p) {
    if (!span) return;
    var parts = [];
    if (p.percent !== null) {
      var bar = el("progress", "", p.percent + "%");
      bar.max = p.total;
      bar.value = Math.min(p.done, p.total);
      bar.setAttribute("aria-label", "progress");
      parts.push(bar);
    } else if (status === "running") {
      var busy = el("progress");
      busy.setAttribute("aria-label", "progress");
      parts.push(busy);
    }
    if (p.label) parts.push(el("span", "muted small", p.label));
    if (p.rate) {
      var speed = el("span", "rate small", p.rate + (p.eta ? " · " + p.eta : ""));
      speed.setAttribute("data-rate", "");
      parts.push(speed);
    }
    span.replaceChildren.apply(span, parts);
  }

  var handlers = {
    job: function (job) {
      var live = document.getElementById("job-live");
      if (!live) return;
      if (live.getAttribute("data-status") !== job.status) { refresh(); return; }
      if (live.getAttribute("data-alerts") !== String(job.alerts)) { refresh(); return; } // one was raised
      drawProgress(live.querySelector(".status-line .progress"), job.status, job.progress);
    },
    log: function (rows) {
      var log = document.getElementById("job-log");
      if (!log) return;
      rows.forEach(function (row) {
        if (log.querySelector('li[data-event="' + row.id + '"]')) return; // already drawn by a refresh
        var li = el("li", "lvl-" + row.level);
        li.setAttribute("data-event", row.id);
        li.append(el("time", "", row.time), " ", el("span", "msg", row.message));
        log.appendChild(li);
      });
    },
    alerts: function (alerts) {
      var badge = document.getElementById("alert-count");
      if (!badge) return;
      badge.textContent = String(alerts.open);
      badge.hidden = alerts.open === 0;
    },
    jobs: function (rows) {
      var stale = false;
      rows.forEach(function (job) {
        var tr = document.querySelector('#jobs-table tr[data-job="' + job.id + '"]');
        if (!tr || tr.getAttribute("data-status") !== job.status) { stale = true; return; }
        drawProgress(tr.querySelector(".progress"), job.status, job.progress);
      });
      if (stale) refresh();
    },
    end: function () {
      source.close();
      root.setAttribute("data-sse-state", "closed");
      refresh();
    },
  };

  var source = new EventSource(root.getAttribute("data-sse"));
  root.setAttribute("data-sse-state", "connecting");
  source.addEventListener("open", function () { root.setAttribute("data-sse-state", "open"); });
  source.addEventListener("error", function () {
    // CONNECTING: the connection dropped and EventSource is trying again. CLOSED: the server refused the
    // stream (a 4xx, e.g. the job is gone): EventSource gives up; the page stays as last drawn.
    var closed = source.readyState === EventSource.CLOSED;
    root.setAttribute("data-sse-state", closed ? "failed" : "reconnecting");
  });
  var names = Object.keys(handlers).concat((root.getAttribute("data-sse-events") || "").split(/\s+/));
  names.filter(Boolean).forEach(function (name) {
    source.addEventListener(name, function (ev) {
      // where a reconnect resumes (EventSource sends it back as Last-Event-ID); readable for tests
      if (ev.lastEventId) root.setAttribute("data-sse-last", ev.lastEventId);
      var data = JSON.parse(ev.data);
      if (handlers[name]) handlers[name](data);
      document.dispatchEvent(new CustomEvent("dd:sse", { detail: { event: name, data: data } }));
    });
  });
})();
