/* A typed number read in the page's locale: the same rule as services/gateway/panel/numparse.py, which stays
   the judge (the requeue form posts the text as typed). Used here only to say, as you type, what the server will
   answer. Returns {value: number} or {problem: code, other: number|null}. tests/unit/test_panel_numparse.py runs
   one table of cases against both. */
(function (root) {
  "use strict";
  var SEPARATORS = {"pt-BR": [".", ","], "en": [",", "."]};
  var MAX_CHARS = 40;

  function read(text, group, point) {
    for (var i = 0; i < text.length; i++) {
      if ("0123456789".indexOf(text[i]) < 0 && text[i] !== group && text[i] !== point) { return {problem: "not_a_number"}; }
    }
    var edge = [group, point];
    if (edge.indexOf(text[0]) >= 0 || edge.indexOf(text[text.length - 1]) >= 0 || /[^0-9][^0-9]/.test(text)) {
      return {problem: "misplaced_separator"};
    }
    if (text.split(point).length > 2) { return {problem: "several_points"}; }
    var at = text.indexOf(point);
    var whole = at < 0 ? text : text.slice(0, at), fraction = at < 0 ? "" : text.slice(at + 1);
    if (fraction.indexOf(group) >= 0) { return {problem: "group_after_point"}; }
    if (whole.indexOf(group) >= 0) {
      var parts = whole.split(group);
      var bad = parts[0].length > 3 || parts[0][0] === "0";
      for (var j = 1; j < parts.length; j++) { bad = bad || parts[j].length !== 3; }
      if (bad) { return {problem: "bad_grouping"}; }
    }
    return {value: parseFloat(whole.split(group).join("") + (fraction ? "." + fraction : ""))};
  }

  function parse(typed, locale) {
    var text = (typed || "").trim();
    if (!text) { return {problem: "empty", other: null}; }
    if (text.length > MAX_CHARS) { return {problem: "not_a_number", other: null}; }
    var sign = text[0] === "-" ? -1 : 1;
    var body = "+-".indexOf(text[0]) >= 0 ? text.slice(1) : text;
    if (!body || !/[0-9]/.test(body)) { return {problem: "not_a_number", other: null}; }
    var seps = SEPARATORS[locale] || SEPARATORS.en, group = seps[0], point = seps[1];
    var mine = read(body, group, point), theirs = read(body, point, group);
    var other = theirs.problem ? null : sign * theirs.value + 0;
    if (!mine.problem) {
      var at = body.indexOf(point), fraction = at < 0 ? "" : body.slice(at + 1);
      if (body.indexOf(group) < 0 && fraction.length === 3 && !theirs.problem) {
        return {problem: "ambiguous", other: other, mine: sign * mine.value + 0};
      }
      return {value: sign * mine.value + 0};
    }
    if (mine.problem !== "not_a_number" && !theirs.problem) { return {problem: "other_convention", other: other}; }
    return {problem: mine.problem, other: null};
  }

  /* As numparse.written: the value as the locale writes it, with its decimals (up to 6). */
  function written(value, locale) {
    if (value === null || value === undefined || !isFinite(value)) { return "—"; }
    var seps = SEPARATORS[locale] || SEPARATORS.en;
    var fixed = Math.abs(value).toFixed(6).replace(/0+$/, "").replace(/\.$/, "");
    var at = fixed.indexOf("."), whole = at < 0 ? fixed : fixed.slice(0, at), fraction = at < 0 ? "" : fixed.slice(at + 1);
    whole = whole.replace(/\B(?=(\d{3})+(?!\d))/g, seps[0]);
    return (value < 0 ? "-" : "") + whole + (fraction ? seps[1] + fraction : "");
  }

  root.TetoNumbers = {parse: parse, written: written, separators: SEPARATORS};
}(typeof window !== "undefined" ? window : globalThis));
