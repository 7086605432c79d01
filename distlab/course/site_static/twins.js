/* JavaScript twins of the labs' widgets, so that a static page redraws when a slider moves.
 *
 * "planner" (Lab 7's planner): a port of distlab/labs/planning (model_of_size, memory_per_gpu,
 * comm_bytes_per_step, step_time, reference_choose_degrees); the same test compares the layout,
 * memory per GPU, bubble, traffic per axis and step time with the Python.
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

  // ------------------------------------------------------------------ planning/ (Lab 7)
  // A port of shapes.model_of_size, memory.memory_per_gpu, communication.comm_bytes_per_step,
  // step_time.step_time, degrees.reference_choose_degrees and reports.planner's inputs.
  var GB = 1e9, TERMS = ["weights", "gradients", "master_weights", "adam_m", "adam_v", "activations"];

  function pyRound(x) {  // Python's round(): halves to even
    var r = Math.round(x);
    return (Math.abs(x % 1) === 0.5 && r % 2 !== 0) ? r - 1 : r;
  }
  function fmtG(x) { return String(Number(x.toPrecision(6))); }  // Python's {:g}, for 1e-4..1e6

  function layerParams(md) {
    var kv = md.kv_heads * Math.floor(md.hidden / md.heads);
    return 2 * md.hidden * md.hidden + 2 * md.hidden * kv + 3 * md.hidden * md.ffn + 2 * md.hidden;
  }
  function modelParams(md) { return md.layers * layerParams(md) + 2 * md.vocab * md.hidden + md.hidden; }

  function modelOfSize(paramsB) {
    var hidden = Math.max(1024, 1024 * pyRound(Math.pow(paramsB * 1e9 / 0.106, 1 / 3) / 1024));
    var md = {layers: 1, hidden: hidden, heads: Math.floor(hidden / 128), kv_heads: 8,
              ffn: 256 * pyRound(3.5 * hidden / 256), vocab: 128256};
    md.layers = Math.max(2, pyRound((paramsB * 1e9 - 2 * md.vocab * hidden) / layerParams(md)));
    md.name = "~" + fmtG(paramsB) + "B model";
    return md;
  }

  function microbatches(cfg) { return Math.floor(cfg.job.global_batch / (cfg.job.micro_batch * cfg.dp)); }

  function stageParams(md, tp, pp) {
    return (Math.ceil(md.layers / pp) * layerParams(md) + (pp === 1 ? 2 : 1) * md.vocab * md.hidden) / tp;
  }

  function activationBytesPerLayer(md, tp, job) {
    var sbh = job.seq_len * job.micro_batch * md.hidden;
    var scores = job.recompute === "selective" ? 0 : 5 * md.heads * job.seq_len / md.hidden;
    if (job.recompute === "full") return 2 * sbh / (job.sequence_parallel ? tp : 1);
    if (job.sequence_parallel) return sbh * (34 + scores) / tp;
    return sbh * (10 + 24 / tp + scores / tp);
  }

  function zeroDivides(job, m) {
    var resident = job.zero_accumulation === "resident" && m > 1;
    return {optimizer: job.zero_stage >= 1, gradients: job.zero_stage >= 2 && !resident,
            weights: job.zero_stage >= 3 && !resident};
  }

  function stageMemory(md, cfg, stage) {
    var job = cfg.job, d = cfg.dp, m = Math.max(microbatches(cfg), 1);
    var phi = stageParams(md, cfg.tp, cfg.pp), div = zeroDivides(job, m), opt = div.optimizer ? d : 1;
    var act = activationBytesPerLayer(md, cfg.tp, job) * Math.ceil(md.layers / cfg.pp) *
              Math.min(cfg.pp - stage, m);
    if (stage === cfg.pp - 1) act += 4 * job.seq_len * job.micro_batch * md.vocab / cfg.tp;
    var weights = job.weight_bytes * phi / (div.weights ? d : 1);
    if (div.weights && d > 1) weights += job.weight_bytes * 2 * layerParams(md) / cfg.tp;
    var t = {weights: weights, gradients: job.grad_bytes * phi / (div.gradients ? d : 1),
             master_weights: 4 * phi / opt, adam_m: 4 * phi / opt, adam_v: 4 * phi / opt,
             activations: act};
    t.total = TERMS.reduce(function (a, k) { return a + t[k]; }, 0);
    return t;
  }

  function memoryPerGpu(md, cfg) {
    var first = stageMemory(md, cfg, 0), last = stageMemory(md, cfg, cfg.pp - 1);
    return last.total > first.total ? last : first;
  }

  function commBytesPerStep(md, cfg) {
    var job = cfg.job, t = cfg.tp, p = cfg.pp, d = cfg.dp, m = microbatches(cfg), mm = Math.max(m, 1);
    var act = job.micro_batch * job.seq_len * md.hidden * job.weight_bytes;
    var calls = (job.sequence_parallel ? 10 : 8) + (job.recompute === "full" ? 4 : 0);
    var share = (d - 1) / d * stageParams(md, t, p), dp;
    if (job.zero_stage === 0) dp = {all_reduce: 2 * share * job.grad_bytes};
    else {
      var div = zeroDivides(job, mm);
      dp = {reduce_scatter: share * job.grad_bytes * (div.gradients ? mm : 1),
            all_gather: share * job.weight_bytes * (div.weights ? 2 * mm : 1)};
    }
    return {tp: m * Math.ceil(md.layers / p) * calls * (t - 1) / t * act,
            pp: p > 1 ? m * 2 * act : 0,
            dp: Object.keys(dp).reduce(function (a, k) { return a + dp[k]; }, 0), dpBy: dp};
  }

  function axisBandwidth(cl, cfg) {
    var bw = function (span) { return (span <= cl.gpus_per_node ? cl.intra_node_gbs : cl.inter_node_gbs) * GB; };
    return {tp: bw(cfg.tp), pp: bw(cfg.tp * cfg.pp), dp: bw(cfg.tp * cfg.pp * cfg.dp)};
  }

  function stepTime(md, cl, cfg) {
    var flops = 6 * modelParams(md) * cfg.job.global_batch * cfg.job.seq_len *
                (cfg.job.recompute === "full" ? 8 / 6 : 1);
    var gpus = cfg.tp * cfg.pp * cfg.dp;
    var compute = flops / (gpus * cl.peak_tflops * 1e12 * cl.kernel_efficiency);
    var comm = commBytesPerStep(md, cfg), bw = axisBandwidth(cl, cfg);
    var parts = {compute: compute, bubble: compute * (cfg.pp - 1) / microbatches(cfg),
                 tp: comm.tp / bw.tp, pp: comm.pp / bw.pp, dp: comm.dp / bw.dp};
    parts.total = parts.compute + parts.bubble + parts.tp + parts.pp + parts.dp;
    return parts;
  }

  function divisors(n) { var r = []; for (var k = 1; k <= n; k++) if (n % k === 0) r.push(k); return r; }

  function candidates(cl, job) {
    var n = cl.nodes * cl.gpus_per_node, out = [];
    divisors(cl.gpus_per_node).forEach(function (t) {
      if (n % t) return;
      divisors(n / t).forEach(function (p) { out.push({tp: t, pp: p, dp: n / (t * p), job: job}); });
    });
    return out;
  }

  function valid(md, cl, cfg) {
    var job = cfg.job;
    return cfg.tp <= cl.gpus_per_node && cl.gpus_per_node % cfg.tp === 0 && md.heads % cfg.tp === 0 &&
      cfg.pp <= md.layers && job.global_batch % (job.micro_batch * cfg.dp) === 0 &&
      memoryPerGpu(md, cfg).total <= cl.gpu_mem_gb * GB;
  }

  function chooseDegrees(md, cl, job) {  // least step time; ties: smaller t*p, then smaller p
    var best = null, key = null;
    candidates(cl, job).forEach(function (c) {
      if (!valid(md, cl, c)) return;
      var k = [stepTime(md, cl, c).total, c.tp * c.pp, c.pp];
      if (!best || k[0] < key[0] || (k[0] === key[0] && (k[1] < key[1] || (k[1] === key[1] && k[2] < key[2])))) {
        best = c; key = k;
      }
    });
    return best;
  }

  function plan(s) {
    var md = modelOfSize(s.params_b);
    var cl = {nodes: s.nodes, gpus_per_node: s.gpus_per_node, gpu_mem_gb: s.gpu_mem_gb,
              peak_tflops: 989.0, kernel_efficiency: 0.40, intra_node_gbs: 450.0, inter_node_gbs: 50.0};
    var gpus = s.nodes * s.gpus_per_node;
    var seqs = Math.max(gpus, gpus * pyRound(s.batch_m_tokens * 1e6 / s.seq_len / gpus));
    var job = {seq_len: s.seq_len, global_batch: seqs, micro_batch: 1, zero_stage: s.zero_stage,
               recompute: s.recompute, sequence_parallel: true, grad_bytes: 4, weight_bytes: 2,
               zero_accumulation: s.zero_accumulation};
    var cfg = chooseDegrees(md, cl, job), out = {model: md, seqs: seqs, cluster: cl, cfg: cfg,
               rule: modelParams(md) / 1e9 * 18 * 1.25 / s.gpu_mem_gb};
    if (cfg) {
      out.memory = memoryPerGpu(md, cfg); out.step = stepTime(md, cl, cfg);
      out.comm = commBytesPerStep(md, cfg); out.bw = axisBandwidth(cl, cfg); out.m = microbatches(cfg);
      out.bubble = (cfg.pp - 1) / (out.m + cfg.pp - 1);
    }
    return out;
  }

  var PLANNER_INPUTS = [
    ["params_b", "model (B params)", "log", [0, 3, 0.1], 70],
    ["seq_len", "sequence length", [1024, 2048, 4096, 8192, 16384, 32768], null, 4096],
    ["gpus_per_node", "GPUs per node", [1, 2, 4, 8], null, 8],
    ["nodes", "nodes", [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048], null, 16],
    ["gpu_mem_gb", "GPU memory (GB)", [16, 24, 40, 48, 80, 96, 141, 192], null, 80],
    ["batch_m_tokens", "batch (M tokens)", [0.5, 1, 2, 4, 8, 16], null, 4],
    ["zero_stage", "ZeRO stage", "select", [0, 1, 2, 3], 1],
    ["recompute", "recompute", "select", ["none", "selective", "full"], "selective"],
    ["zero_accumulation", "ZeRO-2/3 over micro-batches", "select", ["regather", "resident"], "regather"]];

  function plannerTwin(root) {
    root.textContent = "";
    var controls = document.createElement("div");
    controls.className = "distlab-controls";
    var state = {}, inputs = {};
    PLANNER_INPUTS.forEach(function (spec) {
      var name = spec[0], input, shown;
      state[name] = spec[4];
      if (spec[2] === "select") {
        input = document.createElement("select");
        spec[3].forEach(function (v) { var o = document.createElement("option"); o.value = o.textContent = v; input.appendChild(o); });
        input.value = spec[4];
      } else if (spec[2] === "log") {   // ipywidgets' FloatLogSlider: the exponent moves
        input = slider(name, spec[3][0], spec[3][1], spec[3][2], Math.log10(spec[4]));
      } else {                           // a SelectionSlider: the index of the option moves
        input = slider(name, 0, spec[2].length - 1, 1, spec[2].indexOf(spec[4]));
      }
      input.name = name;
      shown = control(controls, spec[1], input);
      inputs[name] = [input, shown, spec];
    });
    var numbers = document.createElement("pre");
    numbers.className = "distlab-plan";
    var chart = document.createElement("div");
    chart.className = "distlab-chart";
    root.appendChild(controls); root.appendChild(numbers); root.appendChild(chart);

    function read(name) {
      var input = inputs[name][0], spec = inputs[name][2];
      if (spec[2] === "select") return typeof spec[4] === "number" ? +input.value : input.value;
      if (spec[2] === "log") return Math.pow(10, +input.value);
      return spec[2][+input.value];
    }

    function redraw() {
      Object.keys(inputs).forEach(function (n) {
        if (inputs[n][2][2] !== "select") inputs[n][1].textContent = n === "params_b" ? fmtG(state[n]) : state[n];
      });
      var r = plan(state), md = r.model, lines = [
        md.name + ": " + md.layers + " layers, hidden " + md.hidden + ", " + md.heads + " heads (" +
          (modelParams(md) / 1e9).toFixed(1) + "B params); batch " + r.seqs + " x " + state.seq_len + " tokens",
        "rule of thumb: " + r.rule.toFixed(1) + " GPUs to hold it"];
      chart.textContent = "";
      var summary = {};
      if (!r.cfg) {
        lines.push("No (TP, PP, DP) layout fits: use ZeRO-3, full recompute or more GPUs.");
      } else {
        var c = r.cfg, mem = r.memory;
        summary = {layout: "TP=" + c.tp + " PP=" + c.pp + " DP=" + c.dp, memory: (mem.total / GB).toFixed(1),
                   bubble: r.bubble.toFixed(3), tp: (r.comm.tp / GB).toFixed(2),
                   pp: (r.comm.pp / GB).toFixed(2), dp: (r.comm.dp / GB).toFixed(2),
                   step: r.step.total.toFixed(2)};
        lines.push(summary.layout + ", ZeRO-" + state.zero_stage + ", m = " + r.m + " micro-batches",
          "  memory per GPU: " + TERMS.map(function (k) { return k + " " + (mem[k] / GB).toFixed(1); }).join(", ") +
            " = " + summary.memory + " GB of " + state.gpu_mem_gb,
          "  bubble: (p-1)/(m+p-1) = " + summary.bubble,
          "  GB sent per step and GPU: TP " + summary.tp + ", PP " + summary.pp + ", DP " + summary.dp,
          "  step: compute " + r.step.compute.toFixed(2) + " s + bubble " + r.step.bubble.toFixed(2) +
            " s + communication " + (r.step.tp + r.step.pp + r.step.dp).toFixed(2) + " s = " + summary.step + " s");
        chart.appendChild(memoryBar(mem, state.gpu_mem_gb));
      }
      numbers.textContent = lines.join("\n");
      root.setAttribute("data-state", JSON.stringify(state));
      root.setAttribute("data-plan", JSON.stringify(summary));
    }
    Object.keys(inputs).forEach(function (n) {
      inputs[n][0].addEventListener("input", function () { state[n] = read(n); redraw(); });
    });
    redraw();
  }

  function memoryBar(mem, capacity) {  // one stacked bar of the terms against the GPU's memory
    var W = 640, H = 46, top = Math.max(mem.total / GB, capacity), sx = (W - 10) / top, x = 0;
    var svg = el("svg", {viewBox: "0 0 " + W + " " + H, "class": "distlab-gantt", role: "img",
                         "aria-label": "memory per GPU by term"});
    TERMS.forEach(function (k, i) {
      var w = mem[k] / GB * sx;
      svg.appendChild(el("rect", {x: x, y: 4, width: Math.max(w, 0), height: 18, "class": "term" + i}));
      x += w;
    });
    svg.appendChild(el("line", {x1: capacity * sx, x2: capacity * sx, y1: 0, y2: 26, "class": "capacity"}));
    svg.appendChild(el("text", {x: 0, y: 40, "class": "axis"}, "memory per GPU: " +
      (mem.total / GB).toFixed(1) + " GB by term (weights, gradients, master, Adam m, v, activations); line: " + capacity + " GB"));
    return svg;
  }

  var TWINS = {schedule: scheduleTwin, planner: plannerTwin};

  var SOURCES = {schedule: "distlab/labs/pipeline", planner: "distlab/labs/planning"};

  function start() {
    document.querySelectorAll(".distlab-twin[data-twin]").forEach(function (root) {
      var name = root.getAttribute("data-twin"), twin = TWINS[name];
      if (!twin) return;
      twin(root);
      var note = document.createElement("p");   // say what the reader is moving
      note.className = "distlab-live";
      note.textContent = "live in your browser: a JavaScript copy of the lab's Python (" +
        SOURCES[name] + "), checked against it by the course's tests";
      root.insertBefore(note, root.firstChild);
    });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
  window.distlabTwins = {simulate: simulate, peakInFlight: peakInFlight,
                         measuredBubble: measuredBubble, theoreticalBubble: theoreticalBubble,
                         plan: plan};
}());
