/* JavaScript twins of the labs' widgets, so that a static page redraws when a slider moves.
 *
 * "schedule" (Lab 5's schedule explorer): a line-by-line port of
 * distlab/labs/pipeline/schedules.py (schedule_order, simulate) and stages.py (peak_in_flight,
 * measured_bubble, theoretical_bubble). tests/test_browser.py moves every control in Chromium and
 * compares the numbers drawn here with the Python functions for the same inputs.
 *
 * A twin is drawn into every <div class="distlab-twin" data-twin="NAME">; the numbers it shows
 * carry data-out="..." so a test can read them.
 */
(function () {
  "use strict";

  // ------------------------------------------------------------------ schedules.py
  var SCHEDULES = ["naive", "gpipe", "1f1b"];

  function scheduleOrder(kind, p, m) {
    var orders = [], s, i;
    for (s = 0; s < p; s++) {
      var ops = [];
      if (kind === "naive") {
        ops = [["F", 0], ["B", 0]];
      } else if (kind === "gpipe") {
        for (i = 0; i < m; i++) ops.push(["F", i]);
        for (i = 0; i < m; i++) ops.push(["B", i]);
      } else {  // 1f1b: warm up, alternate one forward and one backward, cool down
        var warm = Math.min(p - s - 1, m);
        for (i = 0; i < warm; i++) ops.push(["F", i]);
        for (i = 0; i < m - warm; i++) { ops.push(["F", warm + i]); ops.push(["B", i]); }
        for (i = m - warm; i < m; i++) ops.push(["B", i]);
      }
      orders.push(ops);
    }
    return orders;
  }

  function simulate(kind, p, m, tFwd, tBwd) {
    var scale = kind === "naive" ? m : 1;
    var orders = scheduleOrder(kind, p, m);
    var done = {}, free = [], nxt = [], events = [], s;
    for (s = 0; s < p; s++) { free.push(0); nxt.push(0); }
    var left = function () { for (var r = 0; r < p; r++) if (nxt[r] < orders[r].length) return true; return false; };
    while (left()) {
      var progressed = false;
      for (s = 0; s < p; s++) {
        while (nxt[s] < orders[s].length) {
          var op = orders[s][nxt[s]][0], i = orders[s][nxt[s]][1], ready;
          var dep = op === "F" ? "F," + (s - 1) + "," + i : (s < p - 1 ? "B," + (s + 1) + "," + i : "F," + s + "," + i);
          if (op === "F" && s === 0) ready = 0;
          else if (dep in done) ready = done[dep];
          else break;
          var start = Math.max(free[s], ready);
          free[s] = done[op + "," + s + "," + i] = start + scale * (op === "F" ? tFwd : tBwd);
          events.push({rank: s, mb: i, kind: op, start: start, end: free[s]});
          nxt[s] += 1;
          progressed = true;
        }
      }
      if (!progressed) throw new Error("schedule " + kind + " deadlocks");
    }
    return events;
  }

  // ------------------------------------------------------------------ stages.py
  function peakInFlight(events, p) {
    var peaks = [];
    for (var r = 0; r < p; r++) {
      // +1 at each forward start, -1 at each backward end; ties: finish before start
      var marks = events.filter(function (e) { return e.rank === r; }).map(function (e) {
        return e.kind === "F" ? [e.start, 1] : [e.end, -1];
      }).sort(function (a, b) { return a[0] - b[0] || a[1] - b[1]; });
      var alive = 0, peak = 0;
      marks.forEach(function (mk) { alive += mk[1]; peak = Math.max(peak, alive); });
      peaks.push(peak);
    }
    return peaks;
  }

  function measuredBubble(events, p) {
    var span = Math.max.apply(null, events.map(function (e) { return e.end; })) -
               Math.min.apply(null, events.map(function (e) { return e.start; }));
    var busy = events.reduce(function (a, e) { return a + e.end - e.start; }, 0);
    return 1 - busy / (p * span);
  }

  function theoreticalBubble(p, m) { return (p - 1) / (m + p - 1); }

  // ------------------------------------------------------------------ drawing
  var SVG = "http://www.w3.org/2000/svg";

  function el(tag, attrs, text) {
    var e = document.createElementNS(SVG, tag);
    Object.keys(attrs).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function gantt(events, p) {
    var end = Math.max.apply(null, events.map(function (e) { return e.end; }));
    var W = 640, lane = 26, left = 56, H = lane * p + 28, sx = (W - left - 8) / end;
    var svg = el("svg", {viewBox: "0 0 " + W + " " + H, role: "img", "class": "distlab-gantt",
                         "aria-label": "simulated schedule, one lane per rank"});
    for (var r = 0; r < p; r++) {
      svg.appendChild(el("text", {x: left - 6, y: r * lane + lane / 2 + 4, "text-anchor": "end", "class": "lane"}, "rank " + r));
    }
    events.forEach(function (e) {
      var x = left + e.start * sx, w = (e.end - e.start) * sx, y = e.rank * lane + 2;
      svg.appendChild(el("rect", {x: x, y: y, width: Math.max(w - 1, 1), height: lane - 4, "class": e.kind === "F" ? "fwd" : "bwd"}));
      if (w > 14) svg.appendChild(el("text", {x: x + w / 2, y: y + lane / 2 + 2, "text-anchor": "middle", "class": e.kind === "F" ? "fwd-label" : "bwd-label"}, String(e.mb)));
    });
    svg.appendChild(el("text", {x: left, y: H - 6, "class": "axis"}, "time (forward = 1): step " + end.toFixed(1)));
    return svg;
  }

  function control(box, label, input) {
    var row = document.createElement("label");
    row.className = "distlab-control";
    var name = document.createElement("span");
    name.textContent = label;
    var value = document.createElement("output");
    row.appendChild(name); row.appendChild(input); row.appendChild(value);
    box.appendChild(row);
    return value;
  }

  function slider(name, min, max, step, value) {
    var s = document.createElement("input");
    s.type = "range"; s.name = name; s.min = min; s.max = max; s.step = step; s.value = value;
    return s;
  }

  function scheduleTwin(root) {
    root.textContent = "";
    var controls = document.createElement("div");
    controls.className = "distlab-controls";
    var kind = document.createElement("select");
    kind.name = "kind";
    SCHEDULES.forEach(function (k) { var o = document.createElement("option"); o.value = o.textContent = k; kind.appendChild(o); });
    kind.value = "1f1b";
    var inputs = {kind: kind, p: slider("p", 2, 8, 1, 4), m: slider("m", 1, 16, 1, 8),
                  ratio: slider("ratio", 0.5, 3, 0.5, 2)};
    control(controls, "schedule", kind);
    var shown = {p: control(controls, "stages p", inputs.p), m: control(controls, "micro m", inputs.m),
                 ratio: control(controls, "t_b / t_f", inputs.ratio)};
    var numbers = document.createElement("p");
    numbers.className = "distlab-numbers";
    var chart = document.createElement("div");
    chart.className = "distlab-chart";
    root.appendChild(controls); root.appendChild(numbers); root.appendChild(chart);

    function out(name, text) { return '<b data-out="' + name + '">' + text + "</b>"; }

    function redraw() {
      var k = kind.value, p = +inputs.p.value, m = +inputs.m.value, ratio = +inputs.ratio.value;
      shown.p.textContent = p; shown.m.textContent = m; shown.ratio.textContent = ratio.toFixed(1);
      var events = simulate(k, p, m, 1.0, ratio), mm = k === "naive" ? 1 : m;
      numbers.innerHTML = k + ": p=" + p + ", m=" + mm + ": bubble " +
        out("bubble", measuredBubble(events, p).toFixed(3)) + ", (p-1)/(m+p-1) = " +
        out("theory", theoreticalBubble(p, mm).toFixed(3)) + ", in flight per stage " +
        out("in-flight", "[" + peakInFlight(events, p).join(", ") + "]");
      chart.textContent = "";
      chart.appendChild(gantt(events, p));
      root.setAttribute("data-state", [k, p, m, ratio].join(","));
    }
    Object.keys(inputs).forEach(function (n) { inputs[n].addEventListener("input", redraw); });
    redraw();
  }

  var TWINS = {schedule: scheduleTwin};

  function start() {
    document.querySelectorAll(".distlab-twin[data-twin]").forEach(function (root) {
      var twin = TWINS[root.getAttribute("data-twin")];
      if (twin) twin(root);
    });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
  window.distlabTwins = {simulate: simulate, peakInFlight: peakInFlight,
                         measuredBubble: measuredBubble, theoreticalBubble: theoreticalBubble};
}());
