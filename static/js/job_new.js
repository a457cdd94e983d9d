// "New job": a problem's "line N" link selects that line in the spec editor.
document.querySelectorAll(".line-link").forEach(function (link) {
  link.addEventListener("click", function (event) {
    event.preventDefault();
    var area = document.querySelector("#job-form textarea");
    var lines = area.value.split("\n"), line = Number(link.dataset.line), start = 0;
    for (var index = 0; index < line - 1 && index < lines.length; index++) start += lines[index].length + 1;
    area.focus();
    area.setSelectionRange(start, start + (lines[line - 1] || "").length);
    var lineHeight = parseFloat(getComputedStyle(area).lineHeight) || 20;
    area.scrollTop = Math.max(0, (line - 5) * lineHeight);
  });
});

// One submission per click: a second press while the first is on its way does nothing (a double
// click on "Submit job" would otherwise queue the job twice).
(function () {
  var form = document.getElementById("job-form");
  if (!form) return;
  form.addEventListener("submit", function (event) {
    if (form.dataset.sending) { event.preventDefault(); return; }
    form.dataset.sending = "1";
  });
  window.addEventListener("pageshow", function () { delete form.dataset.sending; });
})();
