/* The follow-up page: loss and step-time plots (SVG, from the API's step history GET /v1/jobs/<id>/steps and
   live step events), the requeue form (validated as typed; the server stays the judge), cancel, and the job's
   output followed live (GET /v1/jobs/<id>/logs?follow=true, NDJSON), bounded in the page, text only. */
(function () {
  "use strict";
  var P = window.TetoPanel;
  var SVG = "http://www.w3.org/2000/svg";
  var points = [];
  var live, jobId;

  function numberText(value, decimals) {
    return new Intl.NumberFormat(P.locale, {maximumFractionDigits: decimals === undefined ? 1 : decimals}).format(value);
  }

  function el(name, attrs, text) {
    var node = document.createElementNS(SVG, name);
    Object.keys(attrs).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    if (text !== undefined) { node.textContent = text; }
    return node;
  }

  /* A line plot of (step, value) into an SVG of viewBox 600x200, with min/max labels on both axes. */
  function plot(svg, series, secondDecimals) {
    while (svg.firstChild) { svg.removeChild(svg.firstChild); }
    var pts = series.filter(function (p) { return p[1] !== null && p[1] !== undefined && isFinite(p[1]); });
    if (!pts.length) {
      svg.appendChild(el("text", {x: 300, y: 100, "text-anchor": "middle"}, P.t("job.plots_empty")));
      return;
    }
    var left = 60, right = 590, top = 10, bottom = 175;
    var xs = pts.map(function (p) { return p[0]; }), ys = pts.map(function (p) { return p[1]; });
    var x0 = Math.min.apply(null, xs), x1 = Math.max.apply(null, xs);
    var y0 = Math.min.apply(null, ys), y1 = Math.max.apply(null, ys);
    if (x1 === x0) { x1 = x0 + 1; }
    if (y1 === y0) { y1 = y0 + Math.max(Math.abs(y0) * 0.1, 1e-6); }
    function sx(x) { return left + (x - x0) / (x1 - x0) * (right - left); }
    function sy(y) { return bottom - (y - y0) / (y1 - y0) * (bottom - top); }
    svg.appendChild(el("line", {x1: left, y1: bottom, x2: right, y2: bottom, "class": "axis"}));
    svg.appendChild(el("line", {x1: left, y1: top, x2: left, y2: bottom, "class": "axis"}));
    svg.appendChild(el("text", {x: left - 4, y: top + 8, "text-anchor": "end"}, numberText(y1, secondDecimals)));
    svg.appendChild(el("text", {x: left - 4, y: bottom, "text-anchor": "end"}, numberText(y0, secondDecimals)));
    svg.appendChild(el("text", {x: left, y: 193}, numberText(x0, 0)));
    svg.appendChild(el("text", {x: right, y: 193, "text-anchor": "end"}, P.t("job.axis_step") + " " + numberText(x1, 0)));
    var d = pts.map(function (p, i) { return (i ? "L" : "M") + sx(p[0]).toFixed(1) + "," + sy(p[1]).toFixed(1); }).join(" ");
    svg.appendChild(el("path", {d: d, "class": "line"}));
    var last = pts[pts.length - 1];
    svg.appendChild(el("circle", {cx: sx(last[0]), cy: sy(last[1]), r: 3, "class": "line"}));
    svg.setAttribute("data-points", String(pts.length));
    svg.setAttribute("data-last-step", String(last[0]));
  }

  function draw() {
    points.sort(function (a, b) { return a.step - b.step; });
    plot(document.getElementById("plot-loss"), points.map(function (p) { return [p.step, p.loss]; }), 3);
    plot(document.getElementById("plot-time"), points.map(function (p) { return [p.step, p.step_seconds]; }), 3);
  }

  function addPoint(p) {
    var same = points.filter(function (q) { return q.step === p.step; });
    if (same.length) { same[0].loss = p.loss; same[0].step_seconds = p.step_seconds; } else { points.push(p); }
  }

  /* The API's points are in run order; a resumed run repeats steps from its checkpoint and replaces them. */
  function loadSteps() {
    fetch("/v1/jobs/" + encodeURIComponent(jobId) + "/steps?max_points=2000", {credentials: "same-origin"})
      .then(function (r) { return r.ok ? r.json() : {points: []}; })
      .then(function (body) { (body.points || []).forEach(addPoint); draw(); });
  }

  function announce(text) {
    var status = document.getElementById("action-status");
    status.textContent = text;
    status.hidden = false;
  }

  /* -- requeue: the ceiling read as typed in the page's locale (TetoNumbers, numparse.js) and checked against
     consumed + 60; the text goes to the server as typed (POST /jobs/<id>/requeue), which reads it by the same
     rule and stays the judge; its refusal is shown with its numbers -- */
  function requeueForm() {
    var form = document.getElementById("requeue-form");
    if (!form) { return; }
    var input = document.getElementById("requeue-ceiling"), check = document.getElementById("requeue-check");
    var button = document.getElementById("requeue-submit"), result = document.getElementById("requeue-result");
    function refuse(text) {
      check.textContent = text; check.className = "error"; input.setAttribute("aria-invalid", "true"); button.disabled = true;
      return false;
    }
    function validate() {
      var minimum = parseFloat(input.getAttribute("data-minimum")), consumed = parseFloat(input.getAttribute("data-consumed"));
      var most = parseFloat(input.getAttribute("data-most"));
      var typed = input.value.trim(), read = window.TetoNumbers.parse(typed, P.locale);
      if (read.problem) {
        var seps = window.TetoNumbers.separators[P.locale] || window.TetoNumbers.separators.en;
        return refuse(P.t("numbers." + read.problem, {text: typed, group: seps[0], point: seps[1],
          other: window.TetoNumbers.written(read.other, P.locale), mine: window.TetoNumbers.written(read.mine, P.locale)}));
      }
      var given = read.value;
      if (given > most) {
        return refuse(P.t("numbers.ceiling_out_of_range", {text: typed, most: window.TetoNumbers.written(most, P.locale)}));
      }
      if (given < minimum) {
        return refuse(P.t("job.requeue_too_low", {given: numberText(given), minimum: numberText(minimum), consumed: numberText(consumed)}));
      }
      check.textContent = P.t("job.requeue_ok_value", {given: window.TetoNumbers.written(given, P.locale), left: numberText(given - consumed)});
      check.className = "help"; input.removeAttribute("aria-invalid"); button.disabled = false;
      return true;
    }
    input.addEventListener("input", validate);
    button.disabled = true;
    form.addEventListener("submit", function (ev) {
      ev.preventDefault();
      /* The page may think it enough on stale figures: the server reads exactly what was typed, and judges. */
      var typed = input.value.trim(), read = window.TetoNumbers.parse(typed, P.locale);
      if (read.problem) { validate(); return; }
      button.disabled = true;
      P.api("POST", form.getAttribute("data-action"), {ceiling: typed})
        .then(function (answer) {
          if (answer.status >= 200 && answer.status < 300) {
            /* Outside the form, which hides itself once the job is no longer interrupted. */
            result.hidden = true;
            announce(P.t("job.requeue_done", {ceiling: window.TetoNumbers.written(read.value, P.locale)}));
            return;
          }
          result.hidden = false;
          var body = answer.body || {}, d = body.detail || {};
          result.className = "error";
          var text = P.t("job.requeue_refused", {reason: body.reason || answer.status});
          if (d.minimum_seconds !== undefined) {
            text += " " + P.t("job.requeue_refused_numbers", {consumed: numberText(d.consumed_seconds),
              minimum: numberText(d.minimum_seconds), given: numberText(d.given_seconds)});
          }
          result.textContent = text;
          button.disabled = false;
        });
    });
  }

  /* Cancel asks first: the submit shows the question in the page (no browser dialog), "yes" sends it. */
  function cancelForm() {
    var form = document.getElementById("cancel-form");
    if (!form) { return; }
    var question = document.getElementById("cancel-confirm"), submit = document.getElementById("cancel-submit");
    function ask(open) {
      question.hidden = !open;
      submit.hidden = open;
      (open ? document.getElementById("cancel-no") : submit).focus();
    }
    form.addEventListener("submit", function (ev) { ev.preventDefault(); ask(true); });
    document.getElementById("cancel-no").addEventListener("click", function () { ask(false); });
    document.getElementById("cancel-yes").addEventListener("click", function () {
      ask(false);
      var reason = document.getElementById("cancel-reason").value.trim(), result = document.getElementById("cancel-result");
      P.api("POST", "/v1/jobs/" + encodeURIComponent(form.getAttribute("data-job")) + "/cancel", reason ? {reason: reason} : {})
        .then(function (answer) {
          if (answer.status >= 200 && answer.status < 300) {
            result.hidden = true;
            announce(P.t("job.cancel_done"));
            return;
          }
          result.hidden = false;
          result.className = "error";
          result.textContent = P.t("job.action_failed", {status: answer.status, reason: (answer.body || {}).reason || ""});
        });
    });
  }

  /* After each refresh of the live part: the forms follow the job's state and figures. */
  function syncForms() {
    var root = live.querySelector("[data-state]");
    if (!root) { return; }
    var requeue = document.getElementById("requeue");
    if (requeue) {
      requeue.hidden = root.getAttribute("data-may-requeue") !== "true";
      var input = document.getElementById("requeue-ceiling");
      input.setAttribute("data-minimum", root.getAttribute("data-minimum"));
      input.setAttribute("data-consumed", root.getAttribute("data-consumed"));
      document.getElementById("requeue-figures").textContent = root.getAttribute("data-requeue-text");
      if (input.value) { input.dispatchEvent(new Event("input")); }
    }
    var cancel = document.getElementById("cancel");
    if (cancel && root.getAttribute("data-may-cancel") !== "true") { cancel.hidden = true; }
  }

  /* -- output: followed while the job runs, one line element per line, at most data-max-lines kept -- */
  function logs() {
    var box = document.getElementById("logs");
    if (!box || !window.ReadableStream) { return; }
    var text = document.getElementById("logs-text"), status = document.getElementById("logs-status");
    var maxLines = parseInt(box.getAttribute("data-max-lines"), 10) || 2000;
    var afterSeq = 0, open = {}, trimmed = false, ended = null;

    function addLine(source, stream, piece) {
      var line = document.createElement("div"), src = document.createElement("span"), body = document.createElement("span");
      line.className = "log-line log-" + (stream === "stderr" ? "stderr" : "stdout");
      src.className = "log-src";
      src.textContent = source;
      body.className = "log-text";
      body.textContent = piece;
      line.appendChild(src);
      line.appendChild(body);
      text.appendChild(line);
      while (text.childNodes.length > maxLines) { text.removeChild(text.firstChild); trimmed = true; }
      return body;
    }

    /* The marker where output is missing or ends, in the page's words from the chunk's fields (the API's
       English "notice" is logviews.notice; the same rule, words from terms.log_*). */
    function notice(c) {
      var parts = [];
      if (c.dropped_bytes) {
        var why = c.truncated && !c.text ? "terms.log_limit" : "terms.log_not_in_time";
        parts.push(P.t("terms.log_dropped", {bytes: numberText(c.dropped_bytes, 0), stream: c.stream, why: P.t(why)}));
      } else if (c.truncated && !c.final) {
        parts.push(P.t("terms.log_truncated", {stream: c.stream}));
      }
      if (c.final) {
        var code = c.exit_code, status = code === null || code === undefined ? P.t("terms.log_status_unknown")
          : code < 0 ? P.t("terms.log_status_signal", {signal: -code}) : P.t("terms.log_status_exit", {code: code});
        parts.push(P.t("terms.log_ended", {attempt: c.attempt, rank: c.rank, status: status}));
      }
      return parts.join(" ");
    }

    function chunk(c) {
      var key = c.attempt + "/" + c.rank + "/" + c.stream;
      var source = P.t("job.logs_line_source", {rank: c.rank, stream: c.stream, attempt: c.attempt});
      var pieces = (c.text || "").split("\n");
      var atBottom = text.scrollTop + text.clientHeight >= text.scrollHeight - 4;
      var last = null;
      pieces.forEach(function (piece, i) {
        if (i === 0 && open[key] && open[key].isConnected) { open[key].textContent += piece; last = open[key]; }
        else if (i < pieces.length - 1 || piece !== "") { last = addLine(source, c.stream, piece); }
      });
      /* A chunk that does not end its line: the next chunk of the same source continues it. */
      if (pieces[pieces.length - 1] !== "" && last) { open[key] = last; } else { delete open[key]; }
      var marker = notice(c);
      if (marker) { addLine(source, c.stream, marker).classList.add("log-notice"); delete open[key]; }
      if (atBottom) { text.scrollTop = text.scrollHeight; }
      box.hidden = false;
    }

    function show(key, values) {
      var words = P.t(key, values || {});
      if (trimmed) { words += " — " + P.t("job.logs_trimmed", {lines: maxLines}); }
      status.textContent = words;
    }

    function item(o) {
      if (typeof o.next_after_seq === "number") { afterSeq = o.next_after_seq; }
      if (o.type === "chunk") { afterSeq = Math.max(afterSeq, o.seq); chunk(o); }
      else if (o.type === "end") { ended = o.state || "ended"; }
    }

    function follow() {
      show("job.logs_following");
      fetch(box.getAttribute("data-logs") + "?follow=true&after_seq=" + afterSeq,
            {credentials: "same-origin", headers: {"Accept": "application/x-ndjson"}})
        .then(function (r) {
          if (r.status === 404 || r.status === 503) { return null; }  /* no output here: the section stays hidden */
          if (!r.ok) { throw new Error(String(r.status)); }
          box.hidden = false;
          var reader = r.body.getReader(), decoder = new TextDecoder(), rest = "";
          function pump() {
            return reader.read().then(function (step) {
              rest += decoder.decode(step.value || new Uint8Array(), {stream: !step.done});
              var lines = rest.split("\n");
              rest = lines.pop();
              lines.forEach(function (l) { if (l.trim()) { try { item(JSON.parse(l)); } catch (e) { /* a cut line */ } } });
              return step.done ? null : pump();
            });
          }
          return pump().then(function () { return "done"; });
        })
        .then(function (how) {
          if (how === null) { return; }
          if (ended) {
            box.hidden = false;
            show(text.childNodes.length ? "job.logs_ended" : "job.logs_empty");
            /* A failed job's last output is all in: the live part again, for its log tail. */
            if (ended === "failed") { P.emit("job", {job_id: jobId, logs_ended: true}); }
            return;
          }
          window.setTimeout(follow, 2000);  /* the stream was cut (a restart, a proxy): go on from afterSeq */
        })
        .catch(function (err) {
          show("job.logs_unavailable", {reason: err.message});
          window.setTimeout(follow, 5000);
        });
    }
    follow();
  }

  document.addEventListener("DOMContentLoaded", function () {
    live = document.getElementById("job-live");
    jobId = live.getAttribute("data-job");
    loadSteps();
    requeueForm();
    cancelForm();
    logs();
    P.on("step", function (ev) {
      if (ev.job_id === jobId && ev.step !== undefined) {
        addPoint({step: ev.step, loss: ev.loss, step_seconds: ev.step_seconds});
        draw();
      }
    });
    P.on("fragment", function (ev) { if (ev.element === live) { syncForms(); } });
  });
})();
