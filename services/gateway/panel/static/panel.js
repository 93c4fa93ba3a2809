/* Teto panel: the one live connection of this tab, fragment refreshes, and JSON calls with the CSRF token.
   No inline scripts anywhere (CSP); page scripts register with TetoPanel.on(type, handler). */
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("panel-data").textContent);
  var handlers = {};
  var csrfMeta = document.querySelector('meta[name="csrf-token"]');

  function t(key, values) {
    var text = data.messages[key];
    if (text === undefined) { return key; }
    Object.keys(values || {}).forEach(function (name) { text = text.split("{" + name + "}").join(values[name]); });
    return text;
  }

  function on(type, handler) { (handlers[type] = handlers[type] || []).push(handler); }

  function emit(type, event) {
    (handlers[type] || []).concat(handlers["*"] || []).forEach(function (h) {
      try { h(event, type); } catch (err) { if (window.console) { console.error(err); } }
    });
  }

  /* A JSON request to the API with the session cookie and the CSRF token; resolves {status, body}. */
  function api(method, url, body) {
    var headers = {"Accept": "application/json"};
    if (body !== undefined) { headers["Content-Type"] = "application/json"; }
    if (csrfMeta && method !== "GET") { headers["X-CSRF-Token"] = csrfMeta.getAttribute("content"); }
    return fetch(url, {method: method, headers: headers, credentials: "same-origin",
                       body: body === undefined ? undefined : JSON.stringify(body)})
      .then(function (r) { return r.text().then(function (text) {
        var parsed = null;
        try { parsed = text ? JSON.parse(text) : null; } catch (e) { parsed = {reason: text}; }
        return {status: r.status, body: parsed};
      }); });
  }

  /* Server-rendered fragments (escaped by the server) swapped in when the feed says they changed:
     at most one refresh a second per fragment. */
  function refresher(element) {
    var timer = null, last = 0, busy = false;
    return function () {
      if (timer) { return; }
      var wait = Math.max(0, 1000 - (Date.now() - last));
      timer = setTimeout(function () {
        timer = null;
        if (busy) { return; }
        busy = true; last = Date.now();
        fetch(element.getAttribute("data-fragment"), {credentials: "same-origin"})
          .then(function (r) { return r.ok ? r.text() : null; })
          .then(function (html) {
            if (html !== null) { element.innerHTML = html; emit("fragment", {element: element}); }
          })
          .finally(function () { busy = false; });
      }, wait);
    };
  }

  function liveState(state) {
    var el = document.getElementById("live-state");
    if (!el) { return; }
    el.setAttribute("data-state", state);
    el.textContent = t(state === "on" ? "common.live_on" : state === "off" ? "common.live_off" : "common.live_connecting");
  }

  function connect() {
    if (!document.getElementById("live-state") || !window.EventSource) { return; }
    var job = document.body.getAttribute("data-job");
    var source = new EventSource("/live" + (job ? "?job=" + encodeURIComponent(job) : ""));
    ["job", "signal", "step", "checkpoint", "progress", "budget", "executor", "node", "check"].forEach(function (type) {
      source.addEventListener(type, function (msg) { emit(type, JSON.parse(msg.data)); });
    });
    source.addEventListener("hello", function () { liveState("on"); });
    source.addEventListener("reload", function () { source.close(); window.location.reload(); });
    source.onerror = function () { liveState("off"); };
    source.onopen = function () { liveState("on"); };
  }

  function wireFragments() {
    document.querySelectorAll("[data-fragment]").forEach(function (element) {
      var refresh = refresher(element);
      var kinds = (element.getAttribute("data-refresh-on") || "job signal step checkpoint budget").split(" ");
      kinds.forEach(function (kind) { on(kind, function () { refresh(); }); });
    });
  }

  window.TetoPanel = {data: data, t: t, on: on, emit: emit, api: api, locale: data.locale};
  document.addEventListener("DOMContentLoaded", function () { wireFragments(); connect(); });
})();
