/* Nodes and health checks: on-demand checks of a group or of the selected nodes, drain and undrain. Each action
   is the ordinary /v1 call (TetoPanel.api sends the CSRF token); the server judges it. The selection survives
   the live refresh of the tables. */
(function () {
  "use strict";
  var P = window.TetoPanel;
  var picked = {};

  function say(text, isError) {
    var el = document.getElementById("nodes-message");
    if (!el) { return; }
    el.textContent = text;
    el.className = isError ? "error" : "";
  }

  function refused(answer) {
    var body = answer.body || {};
    return P.t("nodes.refused", {status: answer.status, reason: body.reason || body.detail || body.error || ""});
  }

  function startCheck(body) {
    say(P.t("nodes.check_starting"));
    P.api("POST", "/v1/health-checks", body).then(function (answer) {
      var b = answer.body || {};
      if (answer.status < 300 && b.run_id) {
        window.location.assign("/nodes?run=" + encodeURIComponent(b.run_id) + "#run");
      } else if (answer.status === 202) {
        say(P.t("nodes.check_pending", {command: b.command_id || ""}));
      } else {
        say(refused(answer), true);
      }
    });
  }

  function nodeAction(kind, node) {
    var body = kind === "drain" ? {reason: P.t("nodes.drain_reason")} : undefined;
    P.api("POST", "/v1/nodes/" + encodeURIComponent(node) + "/" + kind, body).then(function (answer) {
      say(answer.status < 300 ? P.t(kind === "drain" ? "nodes.drained_ok" : "nodes.undrained_ok", {node: node})
                              : refused(answer), answer.status >= 300);
    });
  }

  function restorePicks() {
    document.querySelectorAll("input.node-pick").forEach(function (box) { box.checked = !!picked[box.value]; });
  }

  document.addEventListener("change", function (e) {
    if (e.target.classList && e.target.classList.contains("node-pick")) { picked[e.target.value] = e.target.checked; }
  });

  document.addEventListener("click", function (e) {
    var button = e.target.closest ? e.target.closest("button[data-action]") : null;
    if (!button) { return; }
    var action = button.getAttribute("data-action");
    var force = document.getElementById("check-force");
    force = !!(force && force.checked);
    if (action === "check-group") {
      startCheck({group: button.getAttribute("data-group"), force: force});
    } else if (action === "check-nodes") {
      var nodes = Object.keys(picked).filter(function (n) { return picked[n]; }).sort();
      if (!nodes.length) { say(P.t("nodes.pick_first"), true); return; }
      startCheck({nodes: nodes, force: force});
    } else if (action === "drain" || action === "undrain") {
      nodeAction(action, button.getAttribute("data-node"));
    }
  });

  P.on("fragment", restorePicks);
})();
