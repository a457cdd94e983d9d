// The job page: charts from the server-rendered data, then live updates from the job's stream
// (GET /api/v1/jobs/{id}/stream, Server-Sent Events, authenticated by the session cookie).
(function () {
  "use strict";

  var TERMINAL = ["succeeded", "failed", "cancelled"];
  var LOG_LINES_KEPT = 500;
  var ZOOM_RAW_STEPS = 10000; // a zoomed range this narrow is fetched at full resolution

  var page = JSON.parse(document.getElementById("job-data").textContent);
  var metricsUrl = document.getElementById("job-urls").dataset.metrics;
  var store = new Map(); // step -> {name: value}
  var knownNames = new Set(page.metric_names);
  var charts = []; // {names, kind, plot, box}
  var smoothing = Number(document.getElementById("smoothing").value);
  var redrawPending = false;
  var source = null;

  // Fetched points may carry only some names: merge them. A streamed point is the step's whole
  // row (a later attempt's step replaces the earlier one's): replace.
  function merge(points, whole) {
    points.forEach(function (point) {
      var values = store.get(point.step);
      if (!values || whole) { store.set(point.step, Object.assign({}, point.values)); return; }
      Object.assign(values, point.values);
    });
  }

  function rows(names) {
    var steps = [];
    store.forEach(function (values, step) {
      for (var i = 0; i < names.length; i++) if (values[names[i]] != null) { steps.push(step); return; }
    });
    steps.sort(function (a, b) { return a - b; });
    var columns = names.map(function (name) {
      return steps.map(function (step) { var v = store.get(step)[name]; return v == null ? null : v; });
    });
    return { steps: steps, columns: columns };
  }

  function chartData(chart) {
    var table = rows(chart.names);
    if (chart.kind === "reward") {
      var mean = table.columns[0], std = table.columns[1];
      var smoothMean = LabCharts.smooth(mean, smoothing), smoothStd = LabCharts.smooth(std, smoothing);
      var upper = smoothMean.map(function (m, i) { return m == null || smoothStd[i] == null ? null : m + smoothStd[i]; });
      var lower = smoothMean.map(function (m, i) { return m == null || smoothStd[i] == null ? null : m - smoothStd[i]; });
      return [table.steps, mean, smoothMean, upper, lower];
    }
    var data = [table.steps];
    table.columns.forEach(function (column) {
      if (chart.raw) data.push(column);
      data.push(chart.raw ? LabCharts.smooth(column, smoothing) : column);
    });
    return data;
  }

  function addChart(container, names, options) {
    var box = document.createElement("figure");
    box.className = "chart card";
    box.dataset.metric = names[0];
    var caption = document.createElement("figcaption");
    caption.textContent = options.title || names[0];
    box.appendChild(caption);
    if (options.removable) {
      var remove = document.createElement("button");
      remove.type = "button"; remove.className = "link remove-chart"; remove.textContent = "×";
      remove.title = "Remove this chart";
      caption.appendChild(remove);
    }
    var area = document.createElement("div");
    box.appendChild(area);
    container.appendChild(box);
    var chart = { names: names, kind: options.kind || "line", raw: options.raw !== false, box: box, zoomedIn: false };
    area.addEventListener("dblclick", function () { chart.zoomedIn = false; });
    var lines = options.kind === "reward" ? [{ label: "reward/mean" }] : names.map(function (name) { return { label: name }; });
    chart.plot = LabCharts.create(area, {
      lines: lines, raw: chart.raw, band: options.kind === "reward", data: chartData(chart), points: options.points,
      xMax: options.xMax,
      hooks: { setSelect: [function (u) { zoomed(chart, u); }] },
    });
    charts.push(chart);
    if (options.removable) {
      box.querySelector(".remove-chart").addEventListener("click", function () {
        chart.plot.destroy(); box.remove();
        charts.splice(charts.indexOf(chart), 1);
        refreshPicker();
      });
    }
    return chart;
  }

  // A zoomed range that the initial (downsampled) data covers sparsely is fetched at full resolution.
  function zoomed(chart, u) {
    if (!u.select.width) return;
    chart.zoomedIn = true;
    var from = Math.floor(u.posToVal(u.select.left, "x")), to = Math.ceil(u.posToVal(u.select.left + u.select.width, "x"));
    if (to - from > ZOOM_RAW_STEPS || to - from < 2) return;
    fetchPoints(chart.names, { after_step: Math.max(-1, from - 1), limit: to - from + 1 }).then(scheduleRedraw);
  }

  function fetchPoints(names, extra) {
    var params = new URLSearchParams(Object.assign({ names: names.join(",") }, extra || {}));
    return fetch(metricsUrl + "?" + params, { credentials: "same-origin" })
      .then(function (response) { return response.ok ? response.json() : { data: [] }; })
      .then(function (body) { merge(body.data); });
  }

  function redraw() {
    redrawPending = false;
    charts.forEach(function (chart) {
      chart.plot.setData(chartData(chart), !chart.zoomedIn);
    });
    document.getElementById("charts-empty").hidden = store.size > 0;
  }

  function scheduleRedraw() {
    if (redrawPending) return;
    redrawPending = true;
    setTimeout(function () { requestAnimationFrame(redraw); }, 200);
  }

  function refreshPicker() {
    var picker = document.getElementById("add-metric");
    var shown = new Set();
    charts.forEach(function (chart) { chart.names.forEach(function (name) { shown.add(name); }); });
    while (picker.options.length > 1) picker.remove(1);
    Array.from(knownNames).sort().forEach(function (name) {
      if (shown.has(name)) return;
      var option = document.createElement("option");
      option.value = name; option.textContent = name;
      picker.appendChild(option);
    });
  }

  // The per-environment means of eval and validation (eval/<env>/mean, val/<env>/mean) get their
  // own sections; per-function means are in the "Add chart" picker.
  function heldOutSection(name) {
    var parts = name.split("/");
    if (parts.length !== 3 || parts[2] !== "mean") return null;
    return parts[0] === "eval" ? "eval" : parts[0] === "val" ? "val" : null;
  }

  // Eval and validation run at a few steps: their x axis spans the whole job (0..max_steps),
  // so where the points fall in training reads at a glance.
  function addHeldOutChart(name) {
    var section = heldOutSection(name) || "eval";
    document.getElementById(section + "-section").hidden = false;
    addChart(document.getElementById(section + "-charts"), [name], { raw: false, points: true, xMax: page.job.max_steps });
  }

  // --- status header, progress, logs, events, rollouts ------------------------------------------

  function setStep(step) {
    var counter = document.getElementById("job-step"), bar = document.getElementById("job-progress");
    if (!counter || !bar || step <= Number(counter.textContent)) return;
    counter.textContent = step;
    bar.value = Math.min(step, bar.max);
  }

  var lastLogSeq = 0;

  // A progress bar an engine library draws on stderr (tqdm's "label:  50%|█████     | 1/2 [...]")
  // is progress, not an error: shown muted, each redraw of one bar replacing its previous line.
  var PROGRESS = /^(.*?)\s*\d{1,3}%\|[^|]*\|\s*\d+(?:\.\d+)?[kMG]?\/\d+(?:\.\d+)?[kMG]?/;

  function progressKey(text) {
    var match = PROGRESS.exec(text);
    return match ? match[1] : null;
  }

  // Mark `span` as a progress line when it is one; return true when it replaced the bar's last line.
  function placeProgress(logs, span) {
    var key = progressKey(span.textContent);
    if (key === null) return false;
    span.className = "log-line log-progress";
    span.dataset.progress = key;
    var previous = span.previousElementSibling || logs.lastElementChild;
    if (previous && previous !== span && previous.dataset.progress === key) {
      previous.replaceWith(span);
      return true;
    }
    return false;
  }

  (function classifyRenderedLogs() {
    var logs = document.getElementById("logs");
    if (!logs) return;
    Array.from(logs.querySelectorAll(".log-line")).forEach(function (line) {
      lastLogSeq = Math.max(lastLogSeq, Number(line.dataset.seq));
      placeProgress(logs, line);
    });
  })();

  function appendLog(line) {
    if (line.seq <= lastLogSeq) return;
    lastLogSeq = line.seq;
    var logs = document.getElementById("logs");
    var atBottom = logs.scrollTop + logs.clientHeight >= logs.scrollHeight - 8;
    var span = document.createElement("span");
    span.className = "log-line log-" + line.stream;
    span.dataset.seq = line.seq;
    span.textContent = line.line + "\n";
    if (!placeProgress(logs, span)) logs.appendChild(span);
    while (logs.childElementCount > LOG_LINES_KEPT) logs.removeChild(logs.firstElementChild);
    if (atBottom) logs.scrollTop = logs.scrollHeight;
  }

  var seenEvents = new Set(page.event_ids);

  function prependEvent(event) {
    if (seenEvents.has(event.id)) return;
    seenEvents.add(event.id);
    var list = document.getElementById("events");
    var empty = list.querySelector(".empty");
    if (empty) empty.remove();
    var item = document.createElement("li");
    item.className = "event level-" + event.level;
    item.dataset.id = event.id;
    var time = document.createElement("time");
    time.dateTime = event.created_at;
    time.textContent = new Date(event.created_at).toTimeString().slice(0, 8);
    var type = document.createElement("code");
    type.textContent = event.type;
    var message = document.createElement("span");
    message.textContent = event.message;
    item.append(time, " ", type, " ", message);
    list.insertBefore(item, list.firstChild);
  }

  var sampleSteps = new Set(page.sample_steps);

  function noteSampleStep(step) {
    if (sampleSteps.has(step)) return;
    var select = document.getElementById("rollout-step");
    var first = sampleSteps.size === 0;
    sampleSteps.add(step);
    if (first) select.innerHTML = "";
    var option = document.createElement("option");
    option.value = step; option.textContent = step;
    select.insertBefore(option, select.firstChild);
    if (first) {
      select.value = String(step);
      // A step's samples arrive together: load the first step's rollouts once they have landed.
      setTimeout(function () { htmx.trigger(select.form, "change"); }, 500);
    }
  }

  // --- the live stream ------------------------------------------------------------------------

  function setLive(on) {
    var dot = document.getElementById("live-indicator");
    dot.classList.toggle("on", on);
    dot.textContent = on ? "live" : "not live";
  }

  // A finished job's page is complete: no stream, no live badge.
  function finished() {
    document.getElementById("live-indicator").hidden = true;
  }

  var jobFinished = false;
  var snapshotPending = false;

  function connect() {
    if (!window.EventSource) return;
    source = new EventSource(page.stream_url + "?last_event_id=" + encodeURIComponent(page.stream_after));
    // Every connection opens with a snapshot of the job (a status event without an id).
    source.addEventListener("open", function () { setLive(true); snapshotPending = true; });
    // Lab ends the stream after a finished job's history; the browser would reconnect.
    source.addEventListener("error", function () {
      setLive(false);
      if (jobFinished) { source.close(); finished(); }
    });
    source.addEventListener("metrics", function (message) {
      var point = JSON.parse(message.data);
      merge([point], true);
      setStep(point.step);
      var picker = false;
      Object.keys(point.values).forEach(function (name) {
        if (knownNames.has(name)) return;
        knownNames.add(name); picker = true;
        if (heldOutSection(name)) addHeldOutChart(name);
      });
      if (picker) refreshPicker();
      scheduleRedraw();
    });
    source.addEventListener("status", function (message) {
      var job = JSON.parse(message.data);
      setStep(job.step);
      document.body.dispatchEvent(new CustomEvent("job-status"));
      var snapshot = snapshotPending;
      snapshotPending = false;
      jobFinished = TERMINAL.indexOf(job.status) >= 0;
      // After the opening snapshot the history since the last event is still to come; a
      // terminal status from the history itself is the job's last record.
      if (jobFinished && !snapshot) { source.close(); finished(); }
    });
    source.addEventListener("log", function (message) { appendLog(JSON.parse(message.data)); });
    source.addEventListener("event", function (message) {
      var event = JSON.parse(message.data);
      prependEvent(event);
      if (event.type.indexOf("adapter.") === 0) { document.body.dispatchEvent(new CustomEvent("job-adapter")); }
    });
    source.addEventListener("sample", function (message) { noteSampleStep(JSON.parse(message.data).step); });
    source.addEventListener("checkpoint", function () { document.body.dispatchEvent(new CustomEvent("job-checkpoint")); });
  }

  // --- start ----------------------------------------------------------------------------------

  document.addEventListener("DOMContentLoaded", function () {
    merge(page.metrics);
    var grid = document.getElementById("charts");
    // A job that ended without a step has nothing to chart: the page says so instead.
    if (!page.ended_without_steps) {
      addChart(grid, ["reward/mean", "reward/std"], { kind: "reward", title: "reward/mean ± std" });
      ["loss/mean", "entropy/mean", "seq_len/mean", "perf/tokens_per_s"].forEach(function (name) { addChart(grid, [name], {}); });
    }
    page.eval_names.forEach(addHeldOutChart);
    page.val_names.forEach(addHeldOutChart);
    refreshPicker();
    if (!page.ended_without_steps) document.getElementById("charts-empty").hidden = store.size > 0;

    var slider = document.getElementById("smoothing");
    slider.addEventListener("input", function () {
      smoothing = Number(slider.value);
      document.getElementById("smoothing-value").textContent = smoothing.toFixed(2);
      redraw();
    });
    document.getElementById("add-metric").addEventListener("change", function (event) {
      var name = event.target.value;
      if (!name) return;
      event.target.value = "";
      fetchPoints([name], { max_points: page.max_points }).then(function () {
        if (heldOutSection(name)) addHeldOutChart(name); else addChart(grid, [name], { removable: true });
        refreshPicker();
      });
    });
    window.addEventListener("resize", function () { LabCharts.fit(charts.map(function (chart) { return chart.plot; })); });
    window.labJobPage = { charts: charts, store: store }; // read by the browser tests
    if (TERMINAL.indexOf(page.job.status) < 0) connect(); else finished();
  });
})();
