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
  // A refresh replaces the fragment's elements: the one that had the keyboard focus (a badge showing its
  // tooltip, a button) gets it back when the new fragment has an element of the same kind at the same place.
  function pathTo(root, el) {
    var path = [];
    if (!el || el === root || !root.contains(el)) { return null; }
    for (; el !== root; el = el.parentElement) {
      path.unshift([Array.prototype.indexOf.call(el.parentElement.children, el), el.tagName, el.className]);
    }
    return path;
  }

  function refocus(root, path) {
    if (!path) { return; }
    var el = root;
    for (var i = 0; i < path.length; i++) {
      el = el.children[path[i][0]];
      if (!el || el.tagName !== path[i][1]) { return; }
    }
    if (el.className === path[path.length - 1][2] && typeof el.focus === "function") { el.focus(); }
  }

  function refresher(element) {
    var timer = null, last = 0, busy = false, shown = null;
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
            if (html === null || html === shown) { return; }  // nothing changed: nothing replaced
            var path = pathTo(element, document.activeElement);
            element.innerHTML = html;
            shown = html;
            refocus(element, path);
            emit("fragment", {element: element});
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
      var named = element.getAttribute("data-refresh-on");  // "": no event refreshes it
      var kinds = (named === null ? "job signal step checkpoint budget" : named).split(" ").filter(Boolean);
      kinds.forEach(function (kind) { on(kind, function () { refresh(); }); });
      var every = Number(element.getAttribute("data-refresh-every"));  // seconds; a view no event announces
      if (every > 0) { setInterval(refresh, every * 1000); }
    });
  }

  window.TetoPanel = {data: data, t: t, on: on, emit: emit, api: api, locale: data.locale};
  document.addEventListener("DOMContentLoaded", function () { wireFragments(); connect(); });
})();
