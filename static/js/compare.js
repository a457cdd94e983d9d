// Compare: overlay one metric (reward/mean by default) of several jobs, with smoothing.
(function () {
  "use strict";
  document.addEventListener("DOMContentLoaded", function () {
    var page = JSON.parse(document.getElementById("compare-data").textContent);
    var container = document.getElementById("compare-chart");
    if (!container || !page.series.length) return;
    var steps = new Set();
    page.series.forEach(function (series) { series.points.forEach(function (point) { steps.add(point[0]); }); });
    var xs = Array.from(steps).sort(function (a, b) { return a - b; });
    var index = new Map(xs.map(function (step, i) { return [step, i]; }));
    var raw = page.series.map(function (series) {
      var column = new Array(xs.length).fill(null);
      series.points.forEach(function (point) { column[index.get(point[0])] = point[1]; });
      return column;
    });
    var smoothing = Number(document.getElementById("smoothing").value);
    function data() { return [xs].concat(raw.map(function (column) { return LabCharts.smooth(column, smoothing); })); }
    var plot = LabCharts.create(container, {
      lines: page.series.map(function (series) { return { label: series.name + " (" + series.id + ")" }; }),
      raw: false, data: data(), height: 380, integerX: page.x === "step",
    });
    var slider = document.getElementById("smoothing");
    slider.addEventListener("input", function () {
      smoothing = Number(slider.value);
      document.getElementById("smoothing-value").textContent = smoothing.toFixed(2);
      plot.setData(data());
    });
    window.addEventListener("resize", function () { LabCharts.fit([plot]); });
    window.labCompare = { plot: plot }; // read by the browser tests
  });
})();
