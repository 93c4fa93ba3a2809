/* The gang policy form: each number is read in the page's locale (TetoNumbers, numparse.js: pt-BR 1.000 is 1000)
   and checked as it is typed against the contract's bounds (the same rules as fleet.policy_problem on the server),
   the back-off maximum against its base, then sent as typed to PUT /policy, which reads the numbers by the same
   rule and sets the policy as PUT /v1/policies/gang; the server's refusal is shown as it words it (it stays the
   judge). */
(function () {
  "use strict";
  var P = window.TetoPanel;
  var bounds = JSON.parse(document.getElementById("policy-bounds").textContent);
  var form = document.getElementById("policy-form");
  var numbers = ["ready_timeout_seconds", "backoff_base_seconds", "backoff_max_seconds", "backoff_limit"];

  function fmt(value) { return Number(value).toLocaleString(P.locale); }

  function problem(name, text) {
    var spec = bounds[name];
    text = text.trim();
    if (text === "") { return spec.nullable ? null : P.t("policy.err_required"); }
    var read = window.TetoNumbers.parse(text, P.locale);
    if (read.problem) {
      var seps = window.TetoNumbers.separators[P.locale] || window.TetoNumbers.separators.en;
      return P.t("numbers." + read.problem, {text: text, group: seps[0], point: seps[1],
        other: window.TetoNumbers.written(read.other, P.locale), mine: window.TetoNumbers.written(read.mine, P.locale)});
    }
    var value = read.value;
    if (spec.kind === "int" && Math.floor(value) !== value) { return P.t("policy.err_not_integer"); }
    if (spec.min !== undefined && (spec.min_exclusive ? value <= spec.min : value < spec.min)) {
      return P.t(spec.min_exclusive ? "policy.err_above" : "policy.err_at_least", {min: fmt(spec.min)});
    }
    if (spec.max !== undefined && value > spec.max) { return P.t("policy.err_at_most", {max: fmt(spec.max)}); }
    return null;
  }

  function field(name) { return document.getElementById("p-" + name); }

  function valueOf(name) {
    var text = field(name).value.trim();
    return text === "" ? null : window.TetoNumbers.parse(text, P.locale).value;
  }

  function show(name, message) {
    var input = field(name);
    input.setAttribute("aria-invalid", message ? "true" : "false");
    document.getElementById("e-" + name).textContent = message || "";
  }

  function check() {
    var ok = true;
    numbers.forEach(function (name) {
      var message = problem(name, field(name).value);
      show(name, message);
      if (message) { ok = false; }
    });
    var base = valueOf("backoff_base_seconds"), cap = valueOf("backoff_max_seconds");
    if (ok && base !== null && cap !== null && cap < base) {
      show("backoff_max_seconds", P.t("policy.err_max_below_base", {base: fmt(base), max: fmt(cap)}));
      ok = false;
    }
    document.getElementById("policy-save").disabled = !ok;
    return ok;
  }

  function body() {
    var out = {numbers: {}};
    numbers.forEach(function (name) { out.numbers[name] = field(name).value.trim(); });
    out.sequential_admission = field("sequential_admission").checked;
    out.node_failure_strategy = field("node_failure_strategy").value;
    return out;
  }

  form.addEventListener("input", check);
  form.addEventListener("submit", function (e) {
    e.preventDefault();
    if (!check()) { return; }
    var result = document.getElementById("policy-result");
    P.api("PUT", "/policy", body()).then(function (answer) {
      var b = answer.body || {};
      if (answer.status === 200) {
        window.location.assign("/policy?saved=1");
      } else if (answer.status === 202) {
        result.className = "";
        result.textContent = P.t("policy.pending");
      } else {
        var fields = (b.errors || []).map(function (item) { return (item.loc || []).join(".") + ": " + (item.msg || ""); });
        Object.keys(b.fields || {}).forEach(function (name) { show(name, b.fields[name]); });
        result.className = "error";
        result.textContent = P.t("policy.refused", {status: answer.status, reason: b.reason || ""}) +
          (fields.length ? " (" + fields.join("; ") + ")" : "");
      }
    });
  });
  check();
})();
