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

  // The Mirror page's upload (llmgw/console/mirror_page.py): the file goes in pieces (Blob.slice) with
  // Content-Range through the console's own routes (the session's rights, the CSRF token in a header); a piece
  // that fails is sent again from the offset the leader holds; then the commit, whose refusal is shown in words.
  function uploadFile(form) {
    var input = form.querySelector("input[type=file]"), file = input.files && input.files[0];
    if (!file) return;
    var name = (form.querySelector("input[name=name]").value || "").trim() || file.name;
    var csrf = form.querySelector("input[name=csrf]").value;
    var piece = parseInt(form.getAttribute("data-piece-bytes"), 10) || 8388608;
    var bar = form.querySelector("progress"), status = form.querySelector("[data-testid=mirror-upload-status]");
    var started = Date.now(), base = 0, failures = 0;
    form.setAttribute("data-no-refresh", "1");  // the live refresh leaves the page as it is while this runs
    form.setAttribute("data-upload-state", "sending");
    bar.hidden = false;

    function ask(method, url, body, headers) {
      var h = {"x-csrf-token": csrf};
      Object.keys(headers || {}).forEach(function (k) { h[k] = headers[k]; });
      return fetch(url, {method: method, body: body, headers: h, credentials: "same-origin"})
        .then(function (r) {
          return r.text().then(function (t) {
            var doc = null;
            try { doc = JSON.parse(t); } catch (e) { doc = null; }
            return {status: r.status, doc: doc};
          });
        });
    }
    function words(answer) {
      var e = answer.doc && answer.doc.error;
      return e ? e.code + ": " + e.message : "HTTP " + answer.status + " (signed out, or not an admin key?)";
    }
    function show(done) {
      var pct = file.size ? Math.floor(100 * done / file.size) : 100;
      var secs = Math.max((Date.now() - started) / 1000, 0.001);
      var rate = (done - base) / secs / 1048576;
      bar.value = pct;
      bar.setAttribute("data-bytes", String(done));
      status.textContent = done + " of " + file.size + " bytes (" + pct + "%), " + rate.toFixed(1) + " MiB/s";
    }
    function fail(text) {
      form.setAttribute("data-upload-state", "refused");
      status.textContent = "Not done: " + text;
    }
    function send(id, offset) {
      show(offset);
      if (offset >= file.size) return commit(id);
      var end = Math.min(offset + piece, file.size);
      ask("PUT", "/mirror/uploads/" + encodeURIComponent(id), file.slice(offset, end),
          {"content-range": "bytes " + offset + "-" + (end - 1) + "/" + file.size,
           "content-type": "application/octet-stream"})
        .then(function (a) {
          if (a.status === 200) { failures = 0; return send(id, a.doc.offset); }
          if (a.status === 409 && a.doc && a.doc.error && typeof a.doc.error.offset === "number") {
            return send(id, a.doc.error.offset);  // the leader holds another offset: go on from there
          }
          if (a.status >= 500 && ++failures < 5) return resume(id);
          fail(words(a));
        }, function () {
          if (++failures < 5) return resume(id);
          fail("the control plane did not answer");
        });
    }
    function resume(id) {  // a failed piece: ask again where the upload stands, go on from there
      status.textContent += " (a piece failed; going on from the offset the leader holds)";
      ask("POST", "/mirror/uploads", JSON.stringify({name: name, size: file.size}),
          {"content-type": "application/json"})
        .then(function (a) { return a.status < 300 ? send(a.doc.id, a.doc.offset) : fail(words(a)); },
              function () { setTimeout(function () { resume(id); }, 1000 * failures); });
    }
    function commit(id) {
      status.textContent = file.size + " of " + file.size + " bytes (100%): the leader checks the file";
      form.setAttribute("data-upload-state", "checking");
      ask("POST", "/mirror/uploads/" + encodeURIComponent(id) + "/commit", "", {})
        .then(function (a) {
          if (a.status < 300) {
            form.setAttribute("data-upload-state", "done");
            window.location.assign("/mirror?added=" + encodeURIComponent(name));
          } else fail(words(a));
        }, function () { fail("the control plane did not answer the commit"); });
    }
    ask("POST", "/mirror/uploads", JSON.stringify({name: name, size: file.size}), {"content-type": "application/json"})
      .then(function (a) {
        if (a.status >= 300) return fail(words(a));
        base = a.doc.offset;
        send(a.doc.id, a.doc.offset);
      }, function () { fail("the control plane did not answer"); });
  }

  document.addEventListener("change", function (e) {  // a file chosen: no refresh takes the form away
    var form = e.target && e.target.closest && e.target.closest("#mirror-upload");
    if (form) form.setAttribute("data-no-refresh", "1");
  });

  document.addEventListener("submit", function (e) {
    if (e.target && e.target.id === "mirror-upload") { e.preventDefault(); uploadFile(e.target); }
  });

  if (main && document.body.hasAttribute("data-refresh-s")) setInterval(refresh, every);
})();
