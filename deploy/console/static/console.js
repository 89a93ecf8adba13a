// dcmirror console: the map's live parts follow /api/map every refresh interval (no reload).
// Everything else is server-rendered; this file only updates text and classes.
// A flow's running disaster-recovery action follows /api/flows/<flow>/action until it ends.
(function () {
  "use strict";
  var every = parseInt(document.body.getAttribute("data-refresh-ms"), 10) || 2000;
  Array.prototype.forEach.call(document.querySelectorAll("[data-action-api][data-running=\"1\"]"), function (box) {
    function show(run) {
      var outcome = box.querySelector(".dr-outcome");
      var lines = box.querySelector(".dr-lines");
      var report = box.querySelector(".dr-report");
      if (lines) { lines.textContent = (run.lines || []).join("\n"); }
      if (report && run.report && run.report.length) { report.textContent = run.report.join("\n"); report.hidden = false; }
      if (outcome && !run.running) {
        outcome.textContent = run.outcome === "ok" ? "Done: ok" : "Failed: " + (run.error || "?");
        box.setAttribute("data-running", "0");
      }
      return run.running;
    }
    function poll() {
      fetch(box.getAttribute("data-action-api"), { credentials: "same-origin", cache: "no-store" })
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (run) { return run && run.action ? show(run) : false; })
        .catch(function () { return true; /* the next poll tries again */ })
        .then(function (again) { if (again) { window.setTimeout(poll, every); } });
    }
    window.setTimeout(poll, every);
  });
}());
(function () {
  "use strict";
  var map = document.getElementById("map");
  if (!map) { return; }
  var every = parseInt(document.body.getAttribute("data-refresh-ms"), 10) || 2000;
  var LEVELS = ["level-ok", "level-warn", "level-crit", "level-unknown"];

  function setLevel(el, level) {
    if (!el) { return; }
    LEVELS.forEach(function (c) { el.classList.remove(c); });
    el.classList.add("level-" + level);
  }
  function each(selector, fn) { Array.prototype.forEach.call(document.querySelectorAll(selector), fn); }
  function attr(name, value) { return "[" + name + "=\"" + (window.CSS && CSS.escape ? CSS.escape(value) : value) + "\"]"; }

  function apply(state) {
    Object.keys(state.flows).forEach(function (name) {
      var f = state.flows[name];
      each(".flow" + attr("data-flow", name), function (g) {
        setLevel(g, f.level);
        var path = g.querySelector("path");
        if (path) { path.setAttribute("marker-end", "url(#arrow-" + f.level + ")"); }
      });
      each(attr("data-flow-text", name), function (el) { el.textContent = f.text; });
      each(attr("data-flow-level", name), function (el) { el.textContent = f.level; setLevel(el, f.level); });
      each(attr("data-flow-workers", name), function (el) { el.textContent = f.workers; });
      each(attr("data-flow-reasons", name), function (el) { el.textContent = f.reasons.join("; "); });
    });
    Object.keys(state.clusters).forEach(function (name) {
      var c = state.clusters[name];
      each(".node" + attr("data-node", name), function (g) { setLevel(g, c.level); });
      each(attr("data-node-text", name), function (el) { el.textContent = c.text; });
    });
    if (state.warehouse) {
      each(".node" + attr("data-node", "warehouse"), function (g) { setLevel(g, state.warehouse.level); });
      each(".flow" + attr("data-flow", "warehouse"), function (g) {
        setLevel(g, state.warehouse.level);
        var path = g.querySelector("path");
        if (path) { path.setAttribute("marker-end", "url(#arrow-" + state.warehouse.level + ")"); }
      });
      each(attr("data-node-text", "warehouse"), function (el) { el.textContent = state.warehouse.text; });
    }
    Object.keys(state.datacenters).forEach(function (name) {
      var d = state.datacenters[name];
      each(".dc" + attr("data-dc", name), function (g) { g.classList.toggle("cut", d.cut); });
      each(attr("data-dc-cut", name), function (el) { el.textContent = d.cut ? " — CUT OFF" : ""; });
    });
    var note = document.getElementById("map-updated");
    if (note) { note.textContent = "Updated " + new Date(state.at_s * 1000).toLocaleTimeString() + "."; }
  }

  function poll() {
    fetch(map.getAttribute("data-api"), { credentials: "same-origin", cache: "no-store" })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (state) { if (state) { apply(state); } })
      .catch(function () { /* the next poll tries again */ })
      .then(function () { window.setTimeout(poll, every); });
  }
  window.setTimeout(poll, every);
}());
