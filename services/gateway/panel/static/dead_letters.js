/* Dead letters: Replay publishes a letter's message again on its original subject (POST
   /v1/dead-letters/<seq>/replay, with the CSRF token; the server judges and audits it). Asked for confirmation
   first: a replayed command is applied as if sent again. */
(function () {
  "use strict";
  var P = window.TetoPanel;

  document.addEventListener("click", function (e) {
    var button = e.target.closest ? e.target.closest("button[data-action='replay']") : null;
    if (!button) { return; }
    var seq = button.getAttribute("data-seq");
    if (!window.confirm(P.t("dead.confirm", {seq: seq, subject: button.getAttribute("data-subject")}))) { return; }
    var out = document.getElementById("replay-" + seq);
    button.disabled = true;
    P.api("POST", "/v1/dead-letters/" + encodeURIComponent(seq) + "/replay").then(function (answer) {
      var body = answer.body || {};
      if (answer.status < 300) {
        out.textContent = P.t("dead.replayed", {subject: body.subject || ""});
        out.className = "replay-result ok";
      } else {
        out.textContent = P.t("dead.refused", {status: answer.status, reason: body.reason || body.detail || ""});
        out.className = "replay-result error";
        button.disabled = false;
      }
    });
  });
})();
