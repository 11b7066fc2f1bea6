// llmgw console: live updates and table sorting, in plain JavaScript (no CDN, no build step).
// Every few seconds the page's own URL is asked with ?fragment=1 and the main content is swapped in,
// unless the operator is typing in a form or has text selected there.
(function () {
  "use strict";
  var main = document.getElementById("main");
  var every = (parseInt(document.body.getAttribute("data-refresh-s"), 10) || 5) * 1000;
  var sorted = {};  // header text -> direction, kept across refreshes

  function busy() {
    var a = document.activeElement;
    if (a && main.contains(a) && /^(INPUT|SELECT|TEXTAREA)$/.test(a.tagName)) return true;
    var sel = window.getSelection && window.getSelection();
    return !!(sel && String(sel).length && main.contains(sel.anchorNode));
  }

  function fragmentUrl() {
    var u = new URL(window.location.href);
    u.searchParams.set("fragment", "1");
    return u.toString();
  }

  function refresh() {
    if (document.hidden || busy() || main.querySelector("[data-no-refresh]")) return;
    fetch(fragmentUrl(), {credentials: "same-origin", headers: {"accept": "text/html"}})
      .then(function (r) {
        if (r.status === 401) { window.location.reload(); return null; }  // signed out: to the sign-in
        return r.ok ? r.text() : null;
      })
      .then(function (text) {
        if (text === null || busy()) return;
        main.innerHTML = text;
        main.setAttribute("data-refreshed", String(Date.now()));
        reapplySort();
      })
      .catch(function () { /* the control plane did not answer: keep what is shown */ });
  }

  function cellValue(row, i) {
    var c = row.children[i];
    var t = c ? c.textContent.trim() : "";
    var n = parseFloat(t.replace(/[, ]/g, ""));
    return isNaN(n) || !/^[-\d.,\s]+/.test(t) ? t.toLowerCase() : n;
  }

  function sortBy(th, dir) {
    var table = th.closest("table"), body = table.tBodies[0];
    var i = Array.prototype.indexOf.call(th.parentNode.children, th);
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = cellValue(a, i), y = cellValue(b, i);
      if (typeof x !== typeof y) { x = String(x); y = String(y); }
      return (x < y ? -1 : x > y ? 1 : 0) * dir;
    });
    rows.forEach(function (r) { body.appendChild(r); });
  }

  function reapplySort() {
    main.querySelectorAll("th[data-sort]").forEach(function (th) {
      var dir = sorted[th.textContent];
      if (dir) sortBy(th, dir);
    });
  }

  document.addEventListener("click", function (e) {
    var th = e.target.closest && e.target.closest("th[data-sort]");
    if (!th) return;
    var dir = sorted[th.textContent] === 1 ? -1 : 1;
    sorted = {};
    sorted[th.textContent] = dir;
    sortBy(th, dir);
  });

  if (main && document.body.hasAttribute("data-refresh-s")) setInterval(refresh, every);
})();
