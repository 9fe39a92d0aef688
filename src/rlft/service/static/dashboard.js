// The rlft job dashboard: job list, submit form, curves (Plotly), samples and log tail of a job.
// Vanilla JS, no build step. Every text from the service goes into the page as textContent.
"use strict";

(() => {
  // The same panels as `rlft plot` (src/rlft/logging/plots.py), under the same names.
  const PANELS = [
    { id: "reward", title: "Reward", y: "reward", keys: ["reward/mean"], pattern: /^reward\/(.+)\/mean$/ },
    { id: "zero_std", title: "Groups with zero reward spread", y: "share of groups", keys: ["groups_zero_std"], unit: true },
    { id: "kl", title: "KL to the reference", y: "kl", keys: ["kl"] },
    { id: "entropy", title: "Entropy", y: "entropy", keys: ["entropy"] },
    { id: "length", title: "Completion length", y: "tokens", keys: ["completion_len/mean"],
      right: ["truncation_rate"], rightTitle: "truncation rate" },
    { id: "clip_frac", title: "Clipped fraction", y: "clip fraction", keys: ["clip_frac"] },
    { id: "lr", title: "Learning rate", y: "lr", keys: ["lr"], exp: true },
    { id: "eval_accuracy", title: "Eval accuracy", y: "accuracy", keys: ["accuracy"], source: "eval", unit: true },
    { id: "grad_norm", title: "Gradient norm", y: "grad norm", keys: ["grad_norm"] },
    { id: "step_seconds", title: "Step time", y: "seconds", keys: ["step_seconds"] },
  ];
  const LABELS = { "reward/mean": "total", "completion_len/mean": "mean length", truncation_rate: "truncation rate" };
  const COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                   "#bcbd22", "#17becf"];
  const DASHES = ["solid", "dash", "dot", "dashdot"];
  const LIVE = new Set(["pending", "running"]);
  const TOKEN_KEY = "rlft.token";

  const state = {
    token: sessionStorage.getItem(TOKEN_KEY) || "",
    authNeeded: false,
    jobs: [],               // the list as last fetched (newest first)
    byId: new Map(),        // every job seen: list rows and fetched details
    selected: null,
    compare: new Set(),
    filter: "",
    series: new Map(),      // job id -> {steps: Map(step -> record), offset, done, version, error}
    evals: new Map(),       // job id -> {results, version, done}
    configShown: null,
    logStream: "stdout",
    chartKey: "",
    firstList: true,
  };

  const $ = (id) => document.getElementById(id);
  function el(tag, attrs = {}, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") node.className = v;
      else if (k === "text") node.textContent = v;
      else if (k === "role" || k.startsWith("data-") || k.startsWith("aria-")) node.setAttribute(k, v);
      else node[k] = v;
    }
    for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    return node;
  }
  const plotText = (s) => String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  const isNum = (v) => typeof v === "number" && Number.isFinite(v);
  const fmt = (v) => (!isNum(v) ? "–" : Number.isInteger(v) ? String(v) : Math.abs(v) >= 100 ? v.toFixed(1) : String(Number(v.toPrecision(3))));
  const baseName = (p) => (p ? String(p).split("/").pop() : "inline config");

  function ago(seconds) {
    if (!isNum(seconds)) return "";
    const d = Math.max(0, Date.now() / 1000 - seconds);
    if (d < 60) return `${Math.round(d)}s ago`;
    if (d < 3600) return `${Math.round(d / 60)}m ago`;
    if (d < 86400) return `${Math.round(d / 3600)}h ago`;
    return `${Math.round(d / 86400)}d ago`;
  }
  const when = (s) => (isNum(s) ? new Date(s * 1000).toLocaleString() : "–");

  // ------------------------------------------------------------------ the API

  class ApiError extends Error {
    constructor(status, message, problems = []) { super(message); this.status = status; this.problems = problems; }
  }

  // The service answers a refusal with {detail, problems}; FastAPI's own checks with {detail: [{loc, msg}]}.
  function problemOf(status, data) {
    let d = data && data.detail;
    let problems = data && Array.isArray(data.problems) ? data.problems : [];
    if (d && typeof d === "object" && !Array.isArray(d)) { problems = d.problems || problems; d = d.detail; }
    if (Array.isArray(d)) {
      return ["the request was refused", d.map((e) => `${(e.loc || []).filter((x) => x !== "body").join(".")}: ${e.msg}`)];
    }
    return [typeof d === "string" && d ? d : `HTTP ${status}`, problems.map(String)];
  }

  async function api(path, { method = "GET", body } = {}) {
    const headers = { Accept: "application/json" };
    if (state.token) headers.Authorization = `Bearer ${state.token}`;
    if (method !== "GET") headers["Content-Type"] = "application/json";
    const res = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
    let data = null;
    try { data = await res.json(); } catch (_) { /* not JSON */ }
    if (res.status === 401 && !path.startsWith("/api/health")) {
      state.authNeeded = true;
      showAuth();
    }
    if (!res.ok) throw new ApiError(res.status, ...problemOf(res.status, data));
    return data;
  }

  function showAuth() {
    $("auth-msg").hidden = !state.authNeeded;
    $("token-form").classList.toggle("needed", state.authNeeded);
    if (!state.authNeeded) return;
    $("auth-msg").textContent = state.token ? "the token was refused" : "this service needs a token";
    $("job-list").replaceChildren(el("p", { class: "hint", text: "Enter the service's token (top right) to see its jobs." }));
    $("token-input").focus();
  }

  function notice(text) {
    $("notice").hidden = !text;
    $("notice").textContent = text || "";
  }

  function showMessage(msgId, listId, text, problems = [], ok = false) {
    const msg = $(msgId), list = $(listId);
    msg.hidden = !text;
    msg.textContent = text || "";
    msg.classList.toggle("ok", ok);
    list.replaceChildren(...problems.map((p) => el("li", { text: p })));
    list.hidden = problems.length === 0;
  }

  // ------------------------------------------------------------------ job list

  async function refreshHealth() {
    try {
      const h = await api("/api/health");
      const j = h.jobs || {};
      $("health").textContent = `v${h.version} · ${j.running || 0} running · ${j.pending || 0} pending`;
      $("health").className = "health ok";
    } catch (e) {
      $("health").textContent = "service unreachable";
      $("health").className = "health bad";
    }
  }

  async function refreshJobs() {
    if (state.authNeeded) return;
    const q = new URLSearchParams({ limit: "200" });
    if (state.filter) q.set("status", state.filter);
    const { jobs } = await api(`/api/jobs?${q}`);
    state.jobs = jobs;
    for (const j of jobs) state.byId.set(j.id, { ...state.byId.get(j.id), ...j });
    notice("");
    if (state.firstList) {
      state.firstList = false;
      const wanted = location.hash.startsWith("#job=") ? decodeURIComponent(location.hash.slice(5)) : null;
      if (wanted && jobs.some((j) => j.id === wanted)) select(wanted);
      else if (!state.selected && jobs.length) select(jobs[0].id);  // the newest
    }
    renderJobList();
    if (state.selected && !jobs.some((j) => j.id === state.selected)) await fetchDetail(state.selected);
    renderDetails();
  }

  function renderJobList() {
    const list = $("job-list");
    const focused = document.activeElement && document.activeElement.closest && document.activeElement.closest(".job-row");
    const refocus = focused ? focused.dataset.jobId : null;
    if (!state.jobs.length) {
      list.replaceChildren(el("p", { class: "hint", text: state.filter ? `No ${state.filter} jobs.` : "No jobs yet: submit a config below." }));
      return;
    }
    list.replaceChildren(...state.jobs.map((j) => {
      const box = el("input", { type: "checkbox", class: "compare", title: "overlay this job's curves", checked: state.compare.has(j.id) });
      box.addEventListener("click", (ev) => ev.stopPropagation());
      box.addEventListener("change", () => {
        if (box.checked) state.compare.add(j.id); else state.compare.delete(j.id);
        pollSeries().then(renderCharts).catch(report);
      });
      const progress = isNum(j.step) ? `step ${j.step}${isNum(j.total_steps) ? `/${j.total_steps}` : ""}` : "";
      const row = el("div", { class: `job-row${j.id === state.selected ? " selected" : ""}`, "data-job-id": j.id,
                              "data-status": j.status, role: "listitem", tabIndex: 0 },
        box,
        el("span", { class: `badge status-${j.stalled ? "stalled" : j.status}`, text: j.stalled ? `${j.status}, stalled` : j.status,
                     title: j.stalled || null }),
        el("div", { class: "job-main" }, el("code", { text: j.id }), el("span", { class: "src", text: j.config_source || "inline config", title: j.run_dir })),
        el("div", { class: "job-meta" }, el("span", { text: progress }), ...healthBadge(j), el("span", { text: ago(j.created_at) })));
      row.addEventListener("click", () => select(j.id));
      row.addEventListener("keydown", (ev) => { if (ev.key === "Enter") select(j.id); });
      return row;
    }));
    if (refocus) { const row = list.querySelector(`.job-row[data-job-id="${CSS.escape(refocus)}"]`); if (row) row.focus(); }
  }

  // The run's health verdict (rlft.health, from its run.json): a badge, and each finding with its knob.
  function healthBadge(job) {  // [] or [a badge]: a healthy run (or one with no verdict yet) shows none in the list
    if (!job.health || job.health === "healthy") return [];
    const checks = (job.health_findings || []).map((f) => f.check).join(", ");
    return [el("span", { class: `badge health-${job.health}`, text: job.health, title: checks || null })];
  }

  function healthDetails(job) {
    const findings = job.health_findings || [];
    return el("div", { class: "health-details" },
      el("span", { class: `badge health-${job.health}`, text: job.health }),
      ...findings.map((f) => el("div", { class: `finding finding-${f.severity}` },
        el("strong", { text: `${f.check} (${f.severity}, step ${f.step}` +
          (f.recovered_step != null ? `, recovered at step ${f.recovered_step})` : ")") }),
        el("span", { text: `: ${f.message}. ` }), el("span", { class: "knob", text: `Knob: ${f.knob}` }))),
      ...(findings.length ? [el("div", { class: "hint", text: `rlft diagnose ${job.run_dir} writes the report with plots` })] : []));
  }

  // ------------------------------------------------------------------ the selected job

  function select(id) {
    if (state.selected === id) return;
    state.selected = id;
    history.replaceState(null, "", `#job=${encodeURIComponent(id)}`);
    showMessage("action-msg", "action-problems", "");
    $("log-tail").textContent = "";
    $("samples").replaceChildren();
    $("config-yaml").textContent = "";
    state.configShown = null;
    renderJobList();
    renderDetails();
    refreshSelected(true).catch(report);
    pollSeries().then(renderCharts).catch(report);
  }

  async function fetchDetail(id) {
    const job = await api(`/api/jobs/${encodeURIComponent(id)}`);
    state.byId.set(id, { ...state.byId.get(id), ...job });
    return job;
  }

  function renderDetails() {
    const job = state.byId.get(state.selected);
    $("empty-state").hidden = !!job;
    $("job-view").hidden = !job;
    if (!job) return;
    $("job-title").textContent = `Job ${job.id}`;
    const rows = [
      ["status", el("span", { class: `badge status-${job.status}`, text: job.cancel_requested && LIVE.has(job.status) ? `${job.status} (cancel requested)` : job.status })],
      ["stalled", job.stalled ? el("span", { class: "badge status-stalled", role: "alert", text: job.stalled }) : null],
      ["health", job.health ? healthDetails(job) : null],
      ["kind", job.kind], ["config", job.config_source || "inline config"],
      ["progress", isNum(job.step) ? `step ${job.step}${isNum(job.total_steps) ? ` of ${job.total_steps}` : ""}` : "–"],
      ["error type", job.error_type], ["exit code", job.exit_code], ["summary", job.summary],
      ["run dir", el("code", { text: job.run_dir })], ["resumed from", job.resume_from], ["resumes job", job.resumed_job],
      ["submitted", `${when(job.created_at)}${job.submitted_by ? ` by ${job.submitted_by}` : ""}`],
      ["started", job.started_at ? when(job.started_at) : null], ["finished", job.finished_at ? when(job.finished_at) : null],
    ];
    $("job-details").replaceChildren(...rows.filter(([, v]) => v !== null && v !== undefined && v !== "").flatMap(([k, v]) =>
      [el("dt", { text: k }), el("dd", {}, v instanceof Node ? v : String(v))]));
    $("cancel-btn").disabled = !LIVE.has(job.status) || !!job.cancel_requested;
    $("resume-btn").disabled = !["failed", "cancelled"].includes(job.status);
    $("resume-overrides").disabled = $("resume-btn").disabled;
    if (job.config_yaml !== undefined && state.configShown !== job.id) {
      $("config-yaml").textContent = job.config_yaml;
      state.configShown = job.id;
    }
  }

  async function refreshSelected(force = false) {
    const id = state.selected;
    if (!id || state.authNeeded) return;
    let job = state.byId.get(id);
    if (!job || job.config_yaml === undefined) job = await fetchDetail(id);
    if (id !== state.selected) return;
    renderDetails();
    const seen = `${id}:${job.status}:${state.logStream}`;
    if (!force && !LIVE.has(job.status) && state.logsFor === seen) return;  // an ended job's files no longer change
    // samples.jsonl is read whole by the service: refresh it less often than the log
    const wantSamples = force || state.logsFor !== seen || Date.now() - (state.samplesAt || 0) > 10000;
    state.logsFor = seen;
    const q = `/api/jobs/${encodeURIComponent(id)}`;
    const [logs, samples] = await Promise.all([
      api(`${q}/logs?stream=${state.logStream}&tail=200`),
      wantSamples ? api(`${q}/samples?steps=3`) : null,
    ]);
    if (id !== state.selected) return;
    if (samples) {
      state.samplesAt = Date.now();
      const text = JSON.stringify(samples.groups || []);
      if (text !== state.samplesShown || force) renderSamples(samples.groups || []);  // keep a selection in place
      state.samplesShown = text;
    }
    const pre = $("log-tail");
    const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 8;
    pre.textContent = logs.text || `(${logs.stream} is empty)`;
    if (atBottom || force) pre.scrollTop = pre.scrollHeight;
  }

  function renderSamples(groups) {
    if (!groups.length) {
      $("samples").replaceChildren(el("p", { class: "hint", text: "No samples logged yet." }));
      return;
    }
    $("samples").replaceChildren(...groups.map((g) => {
      const fns = [...new Set(g.completions.flatMap((c) => Object.keys(c.rewards || {})))].sort();
      const best = Math.max(...g.completions.map((c) => (isNum(c.reward) ? c.reward : -Infinity)));
      const head = el("tr", {}, el("th", { text: "#" }), el("th", { text: "completion" }), el("th", { text: "reward" }),
        ...fns.map((f) => el("th", { text: f })));
      const body = g.completions.map((c, i) => el("tr", { class: isNum(c.reward) && c.reward === best && g.completions.length > 1 ? "best" : "" },
        el("td", { class: "num", text: String(i + 1) }),
        el("td", {}, el("pre", { class: "completion", text: c.completion })),
        el("td", { class: "num", text: fmt(c.reward) }),
        ...fns.map((f) => el("td", { class: "num", text: fmt((c.rewards || {})[f]) }))));
      return el("table", { class: "sample-group" },
        el("caption", {}, el("span", { class: "step", text: `step ${g.step}` }), el("pre", { class: "prompt", text: g.prompt })),
        el("thead", {}, head), el("tbody", {}, ...body));
    }));
  }

  // ------------------------------------------------------------------ metrics and charts

  const shownJobs = () => [state.selected, ...[...state.compare].filter((id) => id !== state.selected)].filter(Boolean);

  async function pollSeries() {
    if (state.authNeeded) return;
    await Promise.all(shownJobs().map(async (id) => {
      const job = state.byId.get(id) || {};
      let s = state.series.get(id);
      if (!s) state.series.set(id, (s = { steps: new Map(), maxStep: -Infinity, offset: 0, done: false, version: 0, error: null }));
      let e = state.evals.get(id);
      if (!e) state.evals.set(id, (e = { results: [], version: 0, done: false }));
      const ended = job.status && !LIVE.has(job.status);
      const q = `/api/jobs/${encodeURIComponent(id)}`;
      if (!s.done) {
        try {
          const { records, offset, reset } = await api(`${q}/metrics?offset=${s.offset}`);
          if (reset) {  // the file was rewritten (a resume): these records start from the beginning
            s.steps.clear(); s.maxStep = -Infinity; s.version++;
          }
          addRecords(s, records);
          s.error = null;
          s.offset = offset;
          if (ended && !records.length) s.done = true;  // read to the end after the job ended
        } catch (err) { s.error = err.message; }
      }
      if (!e.done) {
        try {
          const { results } = await api(`${q}/eval`);
          if (JSON.stringify(results) !== JSON.stringify(e.results)) { e.results = results; e.version++; }
          if (ended) e.done = true;
        } catch (err) { s.error = err.message; }
      }
    }));
  }

  function addRecords(s, records) {
    for (const r of records) {
      if (!isNum(r.step)) continue;
      if (r.step > s.maxStep) s.maxStep = r.step;
      s.steps.set(r.step, { ...s.steps.get(r.step), ...r });
    }
    if (records.length) s.version++;
  }

  function jobLabel(id) {
    const j = state.byId.get(id) || {};
    return `${id} · ${baseName(j.config_source)}`;
  }

  function panelSeries(panel, id) {
    const records = panel.source === "eval" ? ((state.evals.get(id) || {}).results || [])
      : [...((state.series.get(id) || {}).steps || new Map()).values()].sort((a, b) => a.step - b.step);
    const keys = [...panel.keys];
    if (panel.pattern) {
      const found = new Set();
      for (const rec of records) for (const k of Object.keys(rec)) if (panel.pattern.test(k)) found.add(k);
      keys.push(...[...found].sort().filter((k) => !keys.includes(k)));
    }
    const out = [];
    for (const [key, right] of [...keys.map((k) => [k, false]), ...(panel.right || []).map((k) => [k, true])]) {
      const pts = records.filter((rec) => isNum(rec.step) && isNum(rec[key]));
      const m = panel.pattern && key.match(panel.pattern);
      if (pts.length) out.push({ key, right, label: m ? m[1] : (LABELS[key] || key), pts });
    }
    return out;
  }

  // One colour per job when several are overlaid (line styles tell a job's series apart), else one per series.
  function panelTraces(panel, ids) {
    const several = ids.length > 1;
    const perJob = ids.map((id) => panelSeries(panel, id));
    const multi = perJob.some((list) => list.length > 1);
    return perJob.flatMap((list, r) => list.map((ser, s) => ({
      x: ser.pts.map((p) => p.step), y: ser.pts.map((p) => p[ser.key]), yaxis: ser.right ? "y2" : "y",
      type: "scatter", mode: panel.source === "eval" || ser.pts.length < 2 ? "lines+markers" : "lines",
      name: plotText(several ? (multi ? `${jobLabel(ids[r])} · ${ser.label}` : jobLabel(ids[r])) : ser.label),
      line: { color: COLOURS[(several ? r : s) % COLOURS.length], width: 1.6,
              dash: DASHES[(several ? s : (ser.right ? 1 : 0)) % DASHES.length] },
    })));
  }

  function renderCharts() {
    const ids = shownJobs();
    const notes = ids.map((id) => (state.series.get(id) || {}).error ? `${id}: ${state.series.get(id).error}` : null).filter(Boolean);
    $("chart-notes").textContent = notes.join(" · ");
    $("compare-note").textContent = ids.length > 1 ? `overlaying ${ids.length} jobs` : "";
    const key = ids.map((id) => `${id}:${(state.series.get(id) || {}).version}:${(state.evals.get(id) || {}).version}`).join("|");
    if (key === state.chartKey) return;
    state.chartKey = key;
    const box = $("charts");
    if (typeof Plotly === "undefined") {
      box.replaceChildren(el("p", { class: "hint", text: "Charts need /static/plotly.min.js (pip install plotly on the server)." }));
      return;
    }
    let drawn = 0;
    for (const panel of PANELS) {
      const traces = panelTraces(panel, ids);
      let div = $(`chart-${panel.id}`);
      if (!traces.length) {
        if (div) { Plotly.purge(div); div.remove(); }
        continue;
      }
      drawn++;
      if (!div) {
        div = el("div", { id: `chart-${panel.id}`, class: "chart" });
        const next = PANELS.slice(PANELS.indexOf(panel) + 1).map((p) => $(`chart-${p.id}`)).find(Boolean);
        box.insertBefore(div, next || null);
      }
      const unit = panel.unit ? { range: [-0.02, 1.02] } : {};
      // the legend goes below the axes and the chart grows with it, so the axes keep their size
      const long = traces.some((t) => t.name.length > 28);
      const legendPx = traces.length > 1 ? 8 + 18 * Math.ceil(traces.length / (long ? 1 : 2)) : 0;
      Plotly.react(div, traces, {
        title: { text: panel.title, font: { size: 13 }, x: 0.01, xanchor: "left" }, height: 250 + legendPx,
        margin: { l: 60, r: panel.right ? 55 : 15, t: 34, b: 44 + legendPx }, hovermode: "x unified",
        xaxis: { title: { text: "step" }, zeroline: false },
        yaxis: { title: { text: panel.y }, zeroline: false, exponentformat: panel.exp ? "e" : "B", ...unit },
        yaxis2: { title: { text: panel.rightTitle || "" }, overlaying: "y", side: "right", range: [-0.02, 1.02],
                  tickmode: "auto", tickformat: ".0%", showgrid: false },
        showlegend: traces.length > 1,
        legend: { orientation: "h", yref: "container", y: 0, yanchor: "bottom", x: 0, font: { size: 10 } },
        uirevision: `${panel.id}:${ids.join(",")}`, font: { family: "system-ui, sans-serif" },
        paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
      }, { displaylogo: false, responsive: true, modeBarButtonsToRemove: ["select2d", "lasso2d"] });
    }
    for (const div of [...box.children]) if (!div.id || !div.id.startsWith("chart-")) div.remove();
    if (!drawn) box.prepend(el("p", { class: "hint", text: "No metrics logged yet." }));
  }

  // ------------------------------------------------------------------ actions

  async function submitJob(ev) {
    ev.preventDefault();
    const overrides = $("overrides").value.split("\n").map((s) => s.trim()).filter(Boolean);
    const body = { config_path: $("config-path").value.trim(), resume_from: $("resume-from").value || null };
    if (overrides.length) body.overrides = overrides;
    $("submit-btn").disabled = true;
    try {
      const res = await api("/api/train", { method: "POST", body });
      showMessage("submit-msg", "submit-problems", `submitted job ${res.job_id} (${res.status})`, [], true);
      await afterLaunch(res.job_id);
    } catch (err) {
      showMessage("submit-msg", "submit-problems", err.message, err.problems || []);
    } finally { $("submit-btn").disabled = false; }
  }

  async function afterLaunch(id) {
    await refreshJobs().catch(report);
    select(id);
  }

  async function jobAction(kind) {
    const id = state.selected;
    if (!id) return;
    const btn = $(`${kind}-btn`);
    btn.disabled = true;
    try {
      if (kind === "cancel") {
        const job = await api(`/api/jobs/${encodeURIComponent(id)}/cancel`, { method: "POST" });
        state.byId.set(id, { ...state.byId.get(id), ...job });
        showMessage("action-msg", "action-problems", `cancel requested for job ${id}`, [], true);
      } else {
        const overrides = $("resume-overrides").value.split(/\s+/).filter(Boolean);
        const res = await api(`/api/jobs/${encodeURIComponent(id)}/resume`, { method: "POST", body: overrides.length ? { overrides } : {} });
        $("resume-overrides").value = "";
        await afterLaunch(res.job_id);
        showMessage("action-msg", "action-problems", `resumed job ${id} as ${res.job_id}`, [], true);
      }
    } catch (err) {
      showMessage("action-msg", "action-problems", err.message, err.problems || []);
    } finally { renderDetails(); }
  }

  function report(err) {
    if (err && err.status === 401) return;
    notice(err instanceof TypeError ? "cannot reach the service" : (err && err.message) || String(err));
  }

  function every(ms, fn) {
    const loop = async () => {
      try { await fn(); } catch (err) { report(err); }
      setTimeout(loop, ms);
    };
    loop();
  }

  function init() {
    $("token-input").value = state.token;
    $("token-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      state.token = $("token-input").value.trim();
      if (state.token) sessionStorage.setItem(TOKEN_KEY, state.token); else sessionStorage.removeItem(TOKEN_KEY);
      state.authNeeded = false;
      showAuth();
      state.logsFor = null;
      refreshJobs().then(() => refreshSelected(true)).then(pollSeries).then(renderCharts).catch(report);
    });
    $("status-filter").addEventListener("change", () => { state.filter = $("status-filter").value; refreshJobs().catch(report); });
    $("submit-form").addEventListener("submit", submitJob);
    $("cancel-btn").addEventListener("click", () => jobAction("cancel"));
    $("resume-btn").addEventListener("click", () => jobAction("resume"));
    for (const btn of document.querySelectorAll(".toggle button")) {
      btn.addEventListener("click", () => {
        state.logStream = btn.dataset.stream;
        for (const b of document.querySelectorAll(".toggle button")) b.classList.toggle("on", b === btn);
        refreshSelected(true).catch(report);
      });
    }
    every(3000, refreshJobs);
    every(10000, refreshHealth);
    every(2000, async () => { await pollSeries(); renderCharts(); });
    every(3000, () => refreshSelected(false));
  }

  init();
})();
