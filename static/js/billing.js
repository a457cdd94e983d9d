// Billing page: cost per day (USD) by resource type, as stacked-free lines on uPlot with a time axis.
(function () {
  "use strict";
  document.addEventListener("DOMContentLoaded", function () {
    var page = JSON.parse(document.getElementById("billing-data").textContent);
    var container = document.getElementById("usage-chart");
    if (!container || !window.uPlot) return;
    var series = [{ label: "day" }];
    page.series.forEach(function (line, index) {
      series.push({ label: line.resource, stroke: LabCharts.palette[index % LabCharts.palette.length], width: 2,
        points: { show: true }, value: function (u, v) { return v == null ? "–" : "$" + v.toFixed(4); } });
    });
    var data = [page.x].concat(page.series.map(function (line) { return line.cost_usd; }));
    var plot = new uPlot({
      width: Math.max(240, container.clientWidth || 480),
      height: 240,
      series: series,
      scales: { x: { time: true } },
      axes: [
        { stroke: "#667085", grid: { stroke: "#eef0f3" } },
        { stroke: "#667085", grid: { stroke: "#eef0f3" }, size: 64,
          values: function (u, values) { return values.map(function (v) { return "$" + LabCharts.formatNumber(v); }); } },
      ],
      legend: { show: true, live: true },
    }, data, container);
    window.addEventListener("resize", function () { LabCharts.fit([plot]); });
  });
})();
