// Line charts for the dashboard on uPlot (static/vendor/uplot-1.6.32): steps on x, one or more
// series on y, optional smoothing and a band (mean ± std). No build step: plain browser JS.
(function () {
  "use strict";

  var PALETTE = ["#3756d6", "#d9480f", "#2b8a3e", "#ae3ec9", "#1098ad", "#f08c00", "#5c7cfa", "#c2255c"];

  // Exponential moving average with the start-up bias corrected (as TensorBoard's smoothing):
  // weight 0 leaves the values as they are, 0.99 smooths the most. Nulls stay null.
  function smooth(values, weight) {
    if (!weight) return values.slice();
    var out = new Array(values.length), last = 0, count = 0;
    for (var i = 0; i < values.length; i++) {
      var value = values[i];
      if (value == null || !isFinite(value)) { out[i] = null; continue; }
      last = last * weight + (1 - weight) * value;
      count++;
      out[i] = last / (1 - Math.pow(weight, count));
    }
    return out;
  }

  function formatNumber(value) {
    if (value == null) return "–";
    var size = Math.abs(value);
    if (size >= 1e9) return Number((value / 1e9).toPrecision(3)) + "G";
    if (size >= 1e6) return Number((value / 1e6).toPrecision(3)) + "M";
    if (size >= 1e4) return Number((value / 1e3).toPrecision(3)) + "k";
    if (size !== 0 && size < 1e-3) return value.toExponential(1);
    return Number(value.toPrecision(4)).toString();
  }

  // The y range of a chart: the data's, padded; a flat line gets a visible band around it.
  function yRange(u, min, max) {
    if (min == null || max == null) return [0, 1];
    if (min === max) { var pad = Math.abs(min) * 0.1 || 1; return [min - pad, max + pad]; }
    var margin = (max - min) * 0.08;
    return [min - margin, max + margin];
  }

  // An x range from step 0 to at least `xMax`; a zoomed-in range (narrower than the data) stays.
  function stepRange(xMax) {
    return function (u, min, max) {
      var dataMin = u.data && u.data[0] && u.data[0].length ? u.data[0][0] : null;
      var dataMax = u.data && u.data[0] && u.data[0].length ? u.data[0][u.data[0].length - 1] : null;
      var zoomed = min != null && max != null && dataMin != null && (min > dataMin || max < dataMax);
      if (zoomed) return [min, max];
      return [Math.min(0, min == null ? 0 : min), Math.max(xMax, max == null ? 0 : max)];
    };
  }

  // Steps are whole numbers: the x axis ticks only at integers, in steps of 1, 2 or 5 × 10^k.
  var STEP_INCREMENTS = [];
  for (var power = 1; power <= 1e7; power *= 10) STEP_INCREMENTS.push(power, 2 * power, 5 * power);

  // With the cursor off the chart the legend shows each line's latest value, not dashes.
  function showLatest(u) {
    var count = u.data && u.data[0] ? u.data[0].length : 0;
    if (count && u.legend.idx == null) u.setLegend({ idx: count - 1 }, false);
  }

  function withLatestLegend(hooks) {
    var merged = {};
    Object.keys(hooks || {}).forEach(function (name) { merged[name] = hooks[name].slice(); });
    merged.setLegend = (merged.setLegend || []).concat(showLatest);
    merged.setData = (merged.setData || []).concat(showLatest);
    return merged;
  }

  function transparent(color, alpha) {
    var hex = color.replace("#", "");
    var r = parseInt(hex.slice(0, 2), 16), g = parseInt(hex.slice(2, 4), 16), b = parseInt(hex.slice(4, 6), 16);
    return "rgba(" + r + "," + g + "," + b + "," + alpha + ")";
  }

  // Create a chart in `container`. `lines` is [{label, color?}]; with `band: true` the first line
  // gets a shaded band given as two extra data rows (upper, lower); `integerX: false` for an x
  // axis that is not whole steps (wall time); `xMax` makes the x axis span 0..xMax at least
  // (a job's max_steps) rather than the data's own range. Returns the uPlot instance.
  function create(container, options) {
    var lines = options.lines, series = [{ label: "step" }], bands = [], hidden = [];
    lines.forEach(function (line, index) {
      var color = line.color || PALETTE[index % PALETTE.length];
      if (options.raw) {
        hidden.push(series.length);
        series.push({ label: line.label + " (raw)", stroke: transparent(color, 0.25), width: 1, spanGaps: true,
          points: { show: false }, value: function (u, v) { return formatNumber(v); } });
      }
      series.push({ label: line.label, stroke: color, width: 2, spanGaps: true,
        points: { show: options.points === true }, value: function (u, v) { return formatNumber(v); } });
    });
    if (options.band) {
      var color = lines[0].color || PALETTE[0];
      hidden.push(series.length, series.length + 1);
      series.push({ label: "+std", stroke: transparent(color, 0.15), width: 1, spanGaps: true, points: { show: false },
        value: function (u, v) { return formatNumber(v); } });
      series.push({ label: "−std", stroke: transparent(color, 0.15), width: 1, spanGaps: true, points: { show: false },
        value: function (u, v) { return formatNumber(v); } });
      bands.push({ series: [series.length - 2, series.length - 1], fill: transparent(color, 0.12) });
    }
    var width = Math.max(240, container.clientWidth || 480);
    var plot = new uPlot({
      width: width,
      height: options.height || 220,
      series: series,
      bands: bands,
      scales: { x: options.xMax ? { time: false, range: stepRange(options.xMax) } : { time: false }, y: { range: yRange } },
      axes: [
        options.integerX === false
          ? { stroke: "#667085", grid: { stroke: "#eef0f3" }, ticks: { stroke: "#e3e6eb" } }
          : { stroke: "#667085", grid: { stroke: "#eef0f3" }, ticks: { stroke: "#e3e6eb" }, incrs: STEP_INCREMENTS,
              values: function (u, values) { return values.map(function (v) { return Number.isInteger(v) ? String(v) : ""; }); } },
        { stroke: "#667085", grid: { stroke: "#eef0f3" }, ticks: { stroke: "#e3e6eb" }, size: 56,
          values: function (u, values) { return values.map(formatNumber); } },
      ],
      cursor: { drag: { x: true, y: false } },
      legend: { show: true, live: true },
      hooks: withLatestLegend(options.hooks),
    }, options.data || [[]].concat(series.slice(1).map(function () { return []; })), container);
    // The legend names the lines people read; raw values and band edges stay out of it.
    var rows = plot.root.querySelectorAll(".u-legend tr.u-series");
    hidden.forEach(function (index) { if (rows[index]) rows[index].style.display = "none"; });
    showLatest(plot);
    return plot;
  }

  // Keep every chart as wide as its box.
  function fit(plots) {
    plots.forEach(function (plot) {
      var box = plot.root.parentElement;
      if (box && box.clientWidth) plot.setSize({ width: box.clientWidth, height: plot.height });
    });
  }

  window.LabCharts = { create: create, smooth: smooth, fit: fit, formatNumber: formatNumber, palette: PALETTE };
})();
