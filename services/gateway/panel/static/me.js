/* The person's page: make a token (shown once, here) and revoke one, through the API with the session's CSRF
   token (TetoPanel.api); the server decides who may do what and its refusal is shown as it words it. */
(function () {
  "use strict";
  var P = window.TetoPanel;
  var form = document.getElementById("token-form");
  var result = document.getElementById("token-result");
  var admin = document.getElementById("me-tokens").getAttribute("data-admin") === "yes";
  form.addEventListener("submit", function (ev) {
    ev.preventDefault();
    var days = form.elements.expires_in_days.value.trim();
    var body = {role: form.elements.role.value, description: form.elements.description.value};
    if (days !== "") { body.expires_in_days = Number(days); }
    P.api("POST", form.getAttribute("data-action"), body).then(function (r) {
      if (r.status === 201) {
        result.textContent = P.t("me.created", {id: r.body.id}) + " " + r.body.secret;
        result.setAttribute("data-secret", r.body.secret);
      } else {
        result.textContent = (r.body && r.body.reason) || String(r.status);
      }
    });
  });
  document.querySelectorAll("button.revoke").forEach(function (button) {
    button.addEventListener("click", function () {
      var id = button.getAttribute("data-token");
      var url = (admin ? "/v1/tokens/" : "/v1/me/tokens/") + encodeURIComponent(id);
      P.api("DELETE", url).then(function (r) {
        if (r.status === 204) { window.location.reload(); }
        else { result.textContent = (r.body && r.body.reason) || String(r.status); }
      });
    });
  });
})();
