// The hetmm inspection console. Plain browser JavaScript, no build step, no third-party code:
// everything goes through the service's HTTP API (same origin), with the admin token (kept in
// this tab's sessionStorage) on the routes that change something. API errors are shown as the
// API wrote them ({"error": {"code", "message"}}).
"use strict";

const TOKEN_KEY = "hetmm.adminToken";
const RECENT_PAGE = 60;
const state = { products: [], counts: {}, product: null, view: "products", recentShown: RECENT_PAGE, farSlider: 50 };

const $ = (id) => document.getElementById(id);
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children) if (c !== null && c !== undefined) node.append(c);
  return node;
}
const fmt = (x, digits = 4) => (x === null || x === undefined ? "–" : Number(x).toFixed(digits));
const pct = (x, digits = 1) => (x === null || x === undefined ? "–" : `${(100 * x).toFixed(digits)}%`);
const when = (t) => (t ? new Date(t * 1000).toLocaleString() : "–");
const enc = encodeURIComponent;

// --- API ------------------------------------------------------------------------------------
class ApiError extends Error {
  constructor(status, code, message) {
    super(`${message} (HTTP ${status} ${code})`);
    this.status = status;
    this.code = code;
  }
}

function token() { return sessionStorage.getItem(TOKEN_KEY) || ""; }

async function api(method, path, { body = null, type = null, admin = false, raw = false } = {}) {
  const headers = {};
  if (type) headers["Content-Type"] = type;
  if (admin && token()) headers["Authorization"] = `Bearer ${token()}`;
  let response;
  try {
    response = await fetch(path, { method, headers, body, credentials: "same-origin" });
  } catch (exc) {
    throw new ApiError(0, "network", `the service did not answer (${exc.message})`);
  }
  if (raw && response.ok) return response;
  const text = await response.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (_) { data = null; }
  if (!response.ok) {
    const err = (data && data.error) || {};
    throw new ApiError(response.status, err.code || "http_error", err.message || text.slice(0, 200) || response.statusText);
  }
  return data;
}

function showError(exc, where = null) {
  const message = exc instanceof ApiError ? exc.message : `unexpected: ${exc && exc.message ? exc.message : exc}`;
  const box = $("error");
  box.textContent = message;
  box.hidden = false;
  if (where) where.replaceChildren(el("span", { class: "err", "data-testid": "action-error", text: message }));
}
function clearError() { $("error").hidden = true; }
function notice(text) { const n = $("notice"); n.textContent = text; n.hidden = !text; }

// --- admin token ----------------------------------------------------------------------------
function renderToken() {
  $("token-state").textContent = token() ? "admin token set for this tab" : "no admin token (reading only)";
}
$("token-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const given = $("token").value.trim();
  if (given) sessionStorage.setItem(TOKEN_KEY, given);
  $("token").value = "";
  renderToken();
});
$("token-forget").addEventListener("click", () => { sessionStorage.removeItem(TOKEN_KEY); renderToken(); });

// --- jobs -----------------------------------------------------------------------------------
// Polls GET /v1/jobs/{id} into `box` until the job ends; resolves with the final record.
// doneText(job): the line shown once it succeeded (default: the version it published).
async function followJob(job, box, doneText = (j) => `job ${j.kind} succeeded: new version v${j.version}`) {
  const bar = el("progress", { max: 1, value: 0, "data-testid": "job-progress" });
  const line = el("div", { "data-testid": "job-stage" });
  box.replaceChildren(line, bar);
  for (;;) {
    const p = job.progress || {};
    line.textContent = `job ${job.kind} ${job.state}: ${p.stage || "queued"}${p.total ? ` ${p.done}/${p.total}` : ""}`;
    if (p.total) { bar.max = p.total; bar.value = p.done; }
    if (job.state !== "running") break;
    await new Promise((r) => setTimeout(r, 400));
    job = (await api("GET", `/v1/jobs/${enc(job.id)}`, { admin: true })).job;
  }
  if (job.state === "failed") throw new ApiError(422, "job_failed", (job.error && job.error.message) || "the job failed");
  bar.max = 1; bar.value = 1;
  line.textContent = doneText(job);
  return job;
}

// --- products -------------------------------------------------------------------------------
async function loadProducts() {
  const [products, recent] = await Promise.all([api("GET", "/v1/products"), api("GET", "/v1/recent")]);
  state.products = products.products;
  state.counts = recent.products;
  state.recentPerProduct = recent.per_product;
  const select = $("product");
  const names = state.products.map((p) => p.product);
  if (!state.product || !names.includes(state.product)) state.product = names[0] || null;
  select.replaceChildren(...names.map((n) => el("option", { value: n, selected: n === state.product, text: n })));
}

async function renderProducts() {
  const rows = state.products.map((p) => {
    const c = state.counts[p.product] || { scored: 0, flagged: 0, flagged_share: null };
    const rule = p.threshold_rule ? `${p.threshold_rule}${p.threshold_rule === "far" ? ` ${pct(p.rule_target, 2)}` : ""}` : "–";
    return el("tr", { class: p.product === state.product ? "selected" : null, "data-product": p.product,
      onclick: () => selectProduct(p.product) },
      el("td", { text: p.product }), el("td", { text: p.error ? `v${p.version} (${p.error})` : `v${p.version}` }),
      el("td", { text: p.backbone || "–" }), el("td", { text: p.sheets ?? "–" }), el("td", { text: p.images ?? "–" }),
      // a threshold far above every good score (threshold_warning): marked, the reason on hover
      el("td", { text: `${fmt(p.threshold)}${p.threshold_warning ? " \u26a0" : ""}`, title: p.threshold_warning,
        class: p.threshold_warning ? "warn" : null, "data-testid": p.threshold_warning ? "threshold-warning" : null }),
      el("td", { text: rule }), el("td", { text: pct(p.estimated_false_alarm_rate, 2) }),
      el("td", { text: String(c.scored) }), el("td", { text: c.scored ? `${c.flagged} (${pct(c.flagged_share)})` : "–" }));
  });
  $("products-body").replaceChildren(...rows);
  await renderReportLink(state.product);
}

// The selected product's latest evaluation report (hetmm evaluate --store --report), when it has one:
// a link to the page the service serves read-only.
async function renderReportLink(product) {
  const box = $("product-report");
  if (!product) { box.replaceChildren(); return; }
  let report;
  try { ({ report } = await api("GET", `/v1/products/${enc(product)}/report`)); } catch (exc) { showError(exc, box); return; }
  if (product !== state.product) return; // another product was selected meanwhile
  box.replaceChildren(report
    ? el("a", { href: report.url, target: "_blank", rel: "noopener", "data-testid": "report-link",
      text: `Latest evaluation report (v${report.version}, ${when(report.created)})` })
    : el("span", { class: "hint", text: `${product}: no evaluation report stored (hetmm evaluate --store --report)` }));
}

function selectProduct(name) {
  state.product = name;
  $("product").value = name;
  state.recentShown = RECENT_PAGE;
  render();
}
$("product").addEventListener("change", (ev) => selectProduct(ev.target.value));

// --- result cards (Inspect and Recent) ------------------------------------------------------
function legend(threshold, scale) {
  const vmax = scale && scale.vmax;
  const bar = el("span", { class: "bar" });
  if (vmax && threshold !== null && threshold !== undefined) {
    const tick = el("span", { class: "tick", title: `threshold ${fmt(threshold)}` });
    tick.style.left = `${Math.min(100, (100 * threshold) / vmax)}%`;
    bar.append(tick);
  }
  return el("div", { class: "legend", "data-testid": "legend",
    title: "heat-map colour scale: the same for every image of this product version" },
    el("span", { text: "0" }), bar, el("span", { text: vmax ? fmt(vmax, 3) : "own max" }));
}

// r: a prediction result; imageSrc: URL of the inspected image; heatSrc: URL of its heat-map;
// imageBytes(): resolves to a Blob of the image (to teach with).
function resultCard(product, r, imageSrc, heatSrc, imageBytes) {
  // the review band: a part between the review threshold and the threshold is "REVIEW"
  const review = r.verdict === "review";
  const verdict = r.is_anomaly ? "FLAGGED" : review ? "REVIEW" : "pass";
  const timing = r.timing ? `${fmt(r.timing.total_ms ?? r.timing.score_ms, 1)} ms` : "";
  const teach = el("div", { class: "teach", "data-testid": "teach" });
  const card = el("div", { class: `card${r.is_anomaly ? " flagged" : ""}`, "data-testid": "result-card",
    "data-flagged": String(r.is_anomaly), "data-score": String(r.score), "data-version": String(r.version),
    "data-verdict": String(r.verdict || (r.is_anomaly ? "reject" : "ok")) },
    el("div", { class: "name", text: r.name && r.name !== "<body>" ? r.name : (r.id || "") }),
    imageSrc === null
      ? el("div", { class: "pics none", text: "image not kept (the record's image policy)" })
      : el("div", { class: "pics" },
        el("img", { src: imageSrc, alt: "inspected image", loading: "lazy" }),
        el("img", { src: heatSrc, alt: "heat-map", loading: "lazy", "data-testid": "heatmap" })),
    // A recent prediction sent without ?map=png has its heat-map drawn later by the head: same rule.
    legend(r.threshold, r.heatmap_scale || (r.threshold ? { vmax: 2 * r.threshold } : null)),
    el("div", {},
      el("span", { class: `verdict ${r.is_anomaly ? "bad" : review ? "review" : "good"}`, "data-testid": "verdict", text: verdict }),
      ` score ${fmt(r.score)} vs threshold ${fmt(r.threshold)}${r.review_threshold != null ? ` (review above ${fmt(r.review_threshold)})` : ""}`),
    el("div", { class: "meta", text: `v${r.version}${r.threshold_rule ? `, rule ${r.threshold_rule}` : ""}${timing ? `, ${timing}` : ""}${r.at ? `, ${when(r.at)}` : ""}` }),
    el("div", { class: "actions" },
      el("button", { type: "button", "data-testid": "good-part", onclick: () => teachGood(product, imageBytes, r, teach) }, "Good part (false alarm)"),
      el("button", { type: "button", "data-testid": "confirm-defect", onclick: () => teachDefect(product, imageBytes, r, teach) }, "Confirmed defect")),
    teach);
  return card;
}

async function teachGood(product, imageBytes, r, box) {
  clearError();
  try {
    const blob = await imageBytes();
    const started = await api("POST", `/v1/products/${enc(product)}/normals`, { body: blob, type: blob.type || "application/octet-stream", admin: true });
    const job = await followJob(started.job, box);
    await api("POST", `/v1/products/${enc(product)}/labels?label=good&name=${enc(r.name || "")}`, { body: blob, type: blob.type || "application/octet-stream", admin: true });
    const again = await api("POST", `/v1/products/${enc(product)}/predict?map=png`, { body: blob, type: blob.type || "application/octet-stream" });
    box.append(el("div", { "data-testid": "rescored", "data-score": String(again.score), "data-threshold": String(again.threshold),
      "data-version": String(again.version), "data-flagged": String(again.is_anomaly),
      text: `added as a normal in v${job.version}; now scores ${fmt(again.score)} vs threshold ${fmt(again.threshold)} at v${again.version}: ${again.is_anomaly ? "still FLAGGED" : "pass"}` }));
    await loadProducts();
  } catch (exc) { showError(exc, box); }
}

async function teachDefect(product, imageBytes, r, box) {
  clearError();
  try {
    const blob = await imageBytes();
    const done = await api("POST", `/v1/products/${enc(product)}/labels?label=defective&name=${enc(r.name || "")}`, { body: blob, type: blob.type || "application/octet-stream", admin: true });
    box.replaceChildren(el("div", { "data-testid": "label-stored", text: `labelled a confirmed defect (${done.label.id}); see Calibration` }));
  } catch (exc) { showError(exc, box); }
}

// --- Inspect --------------------------------------------------------------------------------
const INSPECT_MAP_PX = 1024;

async function inspect(files) {
  clearError();
  const product = state.product;
  if (!product) return showError(new ApiError(0, "no_product", "no product to inspect: create one first"));
  const out = $("inspect-results");
  const chunk = 16; // the service's default max_images_per_request
  // A tiled product's heat-map is stitched at the frame's resolution: asked at most INSPECT_MAP_PX on
  // its long side, so a camera frame's map stays a small PNG (an untiled product's is its canvas view).
  const listed = state.products.find((p) => p.product === product);
  const tiled = listed && listed.tiles && listed.tiles[0] * listed.tiles[1] > 1;
  const query = tiled ? `?map=png&map_size=${INSPECT_MAP_PX}` : "?map=png";
  for (let i = 0; i < files.length; i += chunk) {
    const part = files.slice(i, i + chunk);
    const form = new FormData();
    for (const f of part) form.append("images", f, f.name);
    try {
      const data = await api("POST", `/v1/products/${enc(product)}/predict${query}`, { body: form });
      data.results.forEach((r, j) => {
        const file = part[j];
        out.prepend(resultCard(product, r, URL.createObjectURL(file), `data:image/png;base64,${r.heatmap_png}`, async () => file));
      });
    } catch (exc) { showError(exc); }
  }
  loadProducts().then(renderProducts).catch(showError);
}
$("files").addEventListener("change", (ev) => { inspect([...ev.target.files]); ev.target.value = ""; });
const drop = $("drop");
drop.addEventListener("dragover", (ev) => { ev.preventDefault(); drop.classList.add("over"); });
drop.addEventListener("dragleave", () => drop.classList.remove("over"));
drop.addEventListener("drop", (ev) => { ev.preventDefault(); drop.classList.remove("over"); inspect([...ev.dataTransfer.files]); });

// --- Recent ---------------------------------------------------------------------------------
async function renderRecent() {
  const product = state.product;
  const flagged = $("flagged-only").checked;
  const data = await api("GET", `/v1/products/${enc(product)}/recent?flagged=${flagged}`);
  const c = state.counts[product] || { scored: 0, flagged: 0 };
  const recorded = data.items.filter((r) => r.recorded).length;
  $("recent-hint").textContent = `The last ${data.per_product} predictions of each product, kept in the service's memory `
    + `(lost when it restarts): ${data.items.length} shown of ${c.scored} scored since start`
    + (recorded ? `, ${recorded} of them read from the inspection record (from before the last restart).` : ".");
  const base = `/v1/products/${enc(product)}/recent/`;
  const shown = data.items.slice(0, state.recentShown);
  $("recent-results").replaceChildren(...shown.map((r) => resultCard(product, r, r.recorded && !r.has_image ? null : `${base}${enc(r.id)}/image`,
    `${base}${enc(r.id)}/heatmap.png`, async () => (await api("GET", `${base}${enc(r.id)}/image`, { raw: true })).blob())));
  $("recent-more").hidden = data.items.length <= shown.length;
}
$("flagged-only").addEventListener("change", () => renderRecent().catch(showError));
$("recent-more").addEventListener("click", () => { state.recentShown += RECENT_PAGE; renderRecent().catch(showError); });

// --- Calibration ----------------------------------------------------------------------------
const farRate = (v) => 10 ** (-3 + (2.5 * v) / 100); // slider 0..100 -> 0.1% .. ~31.6%, log scale

// A W x H SVG with a white background, and add(tag, attrs, text) appending an element to it
// (the charts: the out-of-fold histogram and the drift chart).
function svgCanvas(W, H) {
  const NS = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(NS, "svg");
  const add = (tag, attrs, text) => {
    const n = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, v);
    if (text !== undefined) n.textContent = text;
    svg.append(n);
    return n;
  };
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("width", W);
  svg.setAttribute("height", H);
  add("rect", { x: 0, y: 0, width: W, height: H, fill: "#fff" });
  return { svg, add };
}

// previews: [{threshold, label, colour, testid}] drawn as dashed lines.
function histogram(data, previews) {
  const W = 640, H = 220, pad = 30;
  const scores = data.oof_scores;
  const marks = data.labels.map((l) => l.score);
  const top = Math.max(...scores, ...marks, data.threshold || 0, ...previews.map((p) => p.threshold), 1e-9) * 1.08;
  const bins = 24;
  const counts = new Array(bins).fill(0);
  for (const s of scores) counts[Math.min(bins - 1, Math.floor((s / top) * bins))] += 1;
  const most = Math.max(1, ...counts);
  const x = (v) => pad + ((W - 2 * pad) * v) / top;
  const { svg, add } = svgCanvas(W, H);
  counts.forEach((n, i) => {
    const h = ((H - 2 * pad) * n) / most;
    add("rect", { x: x((i * top) / bins), y: H - pad - h, width: Math.max(1, x(top / bins) - pad - 1), height: h, fill: "#8fa6bf" });
  });
  add("line", { x1: pad, y1: H - pad, x2: W - pad, y2: H - pad, stroke: "#333" });
  for (let k = 0; k <= 4; k++) add("text", { x: x((k * top) / 4) - 10, y: H - pad + 14 }, fmt((k * top) / 4, 3));
  data.labels.forEach((l, i) => {
    const cx = x(l.score), cy = H - pad - 8 - (i % 4) * 9;
    add("circle", { cx, cy, r: 5, fill: l.label === "defective" ? "#d03020" : "#2a9a45", stroke: "#000",
      "data-testid": `mark-${l.label}`, "data-score": l.score }).append(
      Object.assign(document.createElementNS(svg.namespaceURI, "title"), { textContent: `${l.label} ${fmt(l.score)}` }));
  });
  if (data.threshold !== null) {
    add("line", { x1: x(data.threshold), y1: pad - 10, x2: x(data.threshold), y2: H - pad, stroke: "#000", "stroke-width": 2, "data-testid": "threshold-line" });
    add("text", { x: x(data.threshold) + 4, y: pad - 2 }, `threshold ${fmt(data.threshold)} (${data.threshold_rule})`);
  }
  previews.forEach((p, i) => {
    add("line", { x1: x(p.threshold), y1: pad + 8 + 14 * i, x2: x(p.threshold), y2: H - pad, stroke: p.colour, "stroke-width": 2, "stroke-dasharray": "5,4", "data-testid": p.testid });
    add("text", { x: x(p.threshold) + 4, y: pad + 18 + 14 * i, fill: p.colour }, p.label);
  });
  add("text", { x: pad, y: 12 }, `${scores.length} out-of-fold good scores, ${data.labels.length} labelled`);
  return svg;
}

// Beside the histogram: the far rule at a few rates (threshold, good frames above, estimate and its
// interval, recall on the labelled defects), the good frames whose out-of-fold score stands apart and
// the good frames held more than once.
function renderRatesAndOutliers(data) {
  const rows = (data.rates || []).map((r) => el("tr", { "data-testid": "rate-row", "data-rate": String(r.rate) },
    el("td", { text: pct(r.rate, 0) }), el("td", { text: fmt(r.threshold) }),
    el("td", { text: `${r.good_above} of ${r.n_good}` }),
    el("td", { text: `${pct(r.estimate.rate, 2)} (${pct(r.estimate.low, 2)}-${pct(r.estimate.high, 2)})` }),
    el("td", { text: r.defective ? `${pct(r.recall)} (${r.defective_flagged} of ${r.defective})` : "no labelled defects" })));
  $("rate-table-body").replaceChildren(...rows);
  const o = data.outliers;
  const lines = [];
  if (o && o.cut !== null) {
    lines.push(`Good frames standing apart (${o.rule}: above ${fmt(o.cut)}): ${o.frames.length} of ${o.n_scores}.`);
    o.frames.forEach((f) => lines.push(`frame ${f.index} (${f.digest.slice(0, 12)}): ${fmt(f.score)}`));
    if (o.frames.length) lines.push(`Threshold (${o.threshold_rule}) ${fmt(o.threshold)} with them, ${fmt(o.threshold_without)} without them; drop them with hetmm drop.`);
  }
  // Frames the bank holds more than once (same content): each copy's fold holds its twin, so its score is near 0.
  if (o && o.repeats && o.repeats.length) {
    lines.push(`Good frames held more than once (same content; the first copy is the one kept): ${o.repeats.length}.`);
    o.repeats.forEach((g) => {
      const scores = g.scores.map((s) => (s === null ? "no score" : fmt(s))).join(", ");
      const why = g.twin_in_bank ? " (each copy's fold holds another copy)" : "";
      lines.push(`frames ${g.indices.join(" = ")} (${g.digest.slice(0, 12)}): out-of-fold ${scores}${why}`);
    });
    lines.push(`Threshold (${o.threshold_rule}) ${fmt(o.threshold)} with them, ${fmt(o.threshold_without_repeats)} without the later copies; drop them with hetmm drop --repeats.`);
  }
  $("outliers").replaceChildren(...lines.map((t) => el("div", { text: t, "data-testid": "outlier-line" })));
}

async function renderCalibration() {
  const product = state.product;
  const rate = farRate(Number($("far").value));
  $("far-value").textContent = pct(rate, 2);
  const data = await api("GET", `/v1/products/${enc(product)}/calibration?false_alarm_rate=${rate}`);
  const pv = data.preview || {};
  const lab = pv.labelled;
  const previews = [];
  if (pv.far) previews.push({ threshold: pv.far.threshold, label: `far ${pct(rate, 2)}`, colour: "#a05000", testid: "preview-line" });
  if (lab) previews.push({ threshold: lab.threshold, label: "labelled recall rule", colour: "#7030a0", testid: "preview-labelled-line" });
  $("histogram").replaceChildren(histogram(data, previews));
  renderRatesAndOutliers(data);
  const est = data.false_alarm_estimate;
  const band = est ? ` (95% interval ${pct(est.low, 2)}-${pct(est.high, 2)}; ${est.above} of ${est.n} out-of-fold good scores above)` : "";
  const lines = [`In force at v${data.version}: threshold ${fmt(data.threshold)} (${data.threshold_rule}), estimated false alarms ${pct(data.estimated_false_alarm_rate, 2)}${band}.`];
  if (pv.far) lines.push(`far rule at ${pct(rate, 2)}: threshold ${fmt(pv.far.threshold)}; recall on ${pv.far.defective} labelled defects ${pct(pv.far.recall)}, labelled good parts flagged ${pct(pv.far.good_flagged)}.`);
  if (lab) lines.push(`labelled recall rule at ${pct(rate, 2)}: threshold ${fmt(lab.threshold)}; recall ${pct(lab.recall)}, labelled good parts flagged ${pct(lab.good_flagged)}, estimated false alarms on good parts ${pct(lab.estimated, 2)}.`);
  else lines.push("The labelled recall rule needs labelled good parts and confirmed defects (teach from Inspect or Recent).");
  $("preview-text").replaceChildren(...lines.map((t) => el("div", { text: t })));
  // Apply stores exactly what this preview showed: its rate, with the rule of the button pressed.
  state.preview = { rate, far: pv.far ? pv.far.threshold : null, labelled: lab ? lab.threshold : null };
  $("apply-far").disabled = !pv.far;
  $("apply").disabled = !lab;
  $("preview-text").dataset.farThreshold = pv.far ? String(pv.far.threshold) : "";
  $("preview-text").dataset.labelledThreshold = lab ? String(lab.threshold) : "";
  $("preview-text").dataset.rate = String(rate);
  const rows = data.labels.slice().reverse().map((l) => el("tr", { "data-testid": "label-row", "data-label": l.label },
    el("td", {}, el("img", { src: `/v1/products/${enc(product)}/labels/${enc(l.id)}/image`, alt: l.name, loading: "lazy", width: 48, height: 48 })),
    el("td", { text: l.label }), el("td", { text: fmt(l.score) }), el("td", { text: `${when(l.created)} (v${l.version})` })));
  $("labels-body").replaceChildren(...rows);
}
let farTimer = null;
$("far").addEventListener("input", () => {
  $("far-value").textContent = pct(farRate(Number($("far").value)), 2);
  // Until the new preview is drawn, Apply would store a rate nobody has seen: hold it.
  $("apply-far").disabled = true;
  $("apply").disabled = true;
  clearTimeout(farTimer);
  farTimer = setTimeout(() => renderCalibration().catch(showError), 150);
});
// rule "far": the far rule at the previewed rate; "labelled": the labelled recall rule at that rate.
async function applyPreview(rule) {
  clearError();
  const box = $("calibration-job");
  const pv = state.preview;
  if (!pv) return;
  const body = rule === "far"
    ? { rule: "far", false_alarm_rate: pv.rate }
    : { source: "store:labels", objective: "recall", max_false_alarm_rate: pv.rate };
  try {
    const started = await api("POST", `/v1/products/${enc(state.product)}/calibrate`, { admin: true, type: "application/json",
      body: JSON.stringify(body) });
    await followJob(started.job, box);
    await loadProducts();
    await renderCalibration();
  } catch (exc) { showError(exc, box); }
}
$("apply-far").addEventListener("click", () => applyPreview("far"));
$("apply").addEventListener("click", () => applyPreview("labelled"));

// --- Versions -------------------------------------------------------------------------------
// One time line, newest first: each version as it was published (create, normals, calibration)
// and each recorded rollback (a HEAD move, not a version).
async function renderVersions() {
  const product = state.product;
  const data = await api("GET", `/v1/products/${enc(product)}/versions`);
  const last = data.changes.find((c) => c.change === "rollback");
  $("versions-hint").textContent = data.rolled_back
    ? `Head is v${data.head}: rolled back from a newer version${last ? ` (v${last.from} to v${last.version}, ${when(last.at)})` : ""}.`
    : `Head is v${data.head}.`;
  const byVersion = new Map(data.versions.map((v) => [v.version, v]));
  const rows = data.changes.map((c) => {
    const v = byVersion.get(c.version);
    if (c.change === "rollback" || c.change === "repair") {
      return el("tr", { class: "move", "data-testid": "move-row", "data-change": c.change, "data-from": c.from, "data-to": c.version },
        el("td", { text: `v${c.from ?? "?"} → v${c.version}` }), el("td", { text: "–" }), el("td", { text: v ? v.images : "–" }),
        el("td", { text: c.change }), el("td", { text: v ? `${fmt(v.threshold)} (${v.threshold_rule || "–"})` : "–" }),
        el("td", { text: when(c.at) }), el("td", {}));
    }
    if (!v) return null;
    return el("tr", { class: v.head ? "selected" : null, "data-testid": "version-row", "data-version": v.version, "data-change": v.change },
      el("td", { text: `v${v.version}${v.head ? " (head)" : ""}` }), el("td", { text: v.parent ? `v${v.parent}` : "–" }),
      el("td", { text: v.images }), el("td", { text: v.change }), el("td", { text: `${fmt(v.threshold)} (${v.threshold_rule || "–"})` }),
      el("td", { text: when(v.created) }),
      el("td", {}, v.head ? null : el("button", { type: "button", "data-testid": `rollback-${v.version}`, onclick: () => rollback(product, v.version) }, "Roll back to this")));
  });
  $("versions-body").replaceChildren(...rows.filter((r) => r !== null));
  await renderCandidates(product);
}

// --- Candidates: stored beside the head; compare, then promote or discard -----------------------
async function renderCandidates(product) {
  const data = await api("GET", `/v1/products/${enc(product)}/candidates`);
  const rows = data.candidates.map((c) => el("tr", { "data-testid": "candidate-row", "data-version": c.version },
    el("td", { text: `v${c.version}` }), el("td", { text: c.parent ? `v${c.parent}` : "–" }), el("td", { text: c.images }),
    el("td", { text: fmt(c.threshold) }), el("td", { text: when(c.created) }),
    el("td", {},
      el("button", { type: "button", "data-testid": `compare-${c.version}`, onclick: () => compareCandidate(product, c.version) }, "Compare"),
      el("button", { type: "button", "data-testid": `promote-${c.version}`, onclick: () => promoteCandidate(product, c.version, data.head) }, "Promote"),
      el("button", { type: "button", "data-testid": `discard-${c.version}`, onclick: () => discardCandidate(product, c.version) }, "Discard"))));
  if (!rows.length) rows.push(el("tr", {}, el("td", { colspan: 6, text: "no candidates" })));
  $("candidates-body").replaceChildren(...rows);
}

async function compareCandidate(product, version) {
  clearError();
  try {
    const job = (await api("POST", `/v1/products/${enc(product)}/versions/${version}/compare`, { admin: true, type: "application/json", body: JSON.stringify({ source: "store:labels" }) })).job;
    const done = await followJob(job, $("compare-job"), (j) => `compared v${j.compare.base} and v${j.compare.candidate}: ${j.compare.flips.length} verdict flip(s)`);
    const c = done.compare;
    const side = (v, s) => `v${v}: ${fmt(s.score)} ${s.is_anomaly ? "ANOMALY" : "ok"} (threshold ${fmt(s.threshold)})`;
    const pairs = c.flips.map((f) => el("div", { class: "card", "data-testid": "flip" },
      el("div", { text: f.image }),
      f.heatmaps ? el("img", { src: f.heatmaps.base, alt: `v${c.base}`, "data-testid": "flip-base" }) : null,
      f.heatmaps ? el("img", { src: f.heatmaps.candidate, alt: `v${c.candidate}`, "data-testid": "flip-candidate" }) : null,
      el("div", { text: side(c.base, f.base) }), el("div", { text: side(c.candidate, f.candidate) })));
    const shift = el("div", { "data-testid": "score-shift", text: `median score v${c.base} ${fmt(c.score_shift.base[2])}, v${c.candidate} ${fmt(c.score_shift.candidate[2])}` });
    $("compare-result").replaceChildren(shift, el("div", { class: "cards" }, ...pairs));
  } catch (exc) { showError(exc, $("compare-job")); }
}

async function promoteCandidate(product, version, head) {
  clearError();
  try {
    await api("POST", `/v1/products/${enc(product)}/versions/${version}/promote`, { admin: true, type: "application/json", body: JSON.stringify({ expect_head: head }) });
    await loadProducts();
    await renderVersions();
    notice(`${product}: v${version} promoted, head now`);
  } catch (exc) { showError(exc); }
}

async function discardCandidate(product, version) {
  clearError();
  try {
    await api("POST", `/v1/products/${enc(product)}/versions/${version}/discard`, { admin: true });
    await renderVersions();
    notice(`${product}: candidate v${version} discarded`);
  } catch (exc) { showError(exc); }
}

async function rollback(product, version) {
  clearError();
  try {
    const done = await api("POST", `/v1/products/${enc(product)}/rollback`, { admin: true, type: "application/json", body: JSON.stringify({ version }) });
    await loadProducts();
    await renderVersions();
    notice(`${product}: v${done.version} is head again`); // after the history shows the rollback
  } catch (exc) { showError(exc); }
}

// --- Region ---------------------------------------------------------------------------------
// The inspection region drawn over a training image picked from this computer (the service keeps
// the training images' features, not the images). Shapes are kept in the image's own pixel
// coordinates (integers: pixel edges), so the region's size is the image's size; the canvas shows
// the image scaled to fit and maps the mouse back through that scale.
const REGION_BOX = { width: 720, height: 540 };
const region = { product: null, image: null, width: 0, height: 0, scale: 1, shapes: [], points: [], drag: null };

const regionTool = () => document.querySelector("input[name=region-tool]:checked").value;
const regionPart = () => document.querySelector("input[name=region-part]:checked").value;

function regionBody() {
  if (!region.image) return null;
  if (!region.shapes.length) return { region: null }; // nothing drawn: every pixel counts
  const part = (p) => region.shapes.filter((s) => s.part === p).map((s) => (s.rect ? { rect: s.rect } : { polygon: s.polygon }));
  return { region: { size: [region.height, region.width], include: part("include"), exclude: part("exclude") } };
}

// The image pixel under a mouse event: clamped to the frame, rounded to the nearest pixel edge.
function regionPoint(ev) {
  const box = $("region-canvas").getBoundingClientRect();
  const x = Math.round(((ev.clientX - box.left) * region.width) / box.width);
  const y = Math.round(((ev.clientY - box.top) * region.height) / box.height);
  return [Math.min(region.width, Math.max(0, x)), Math.min(region.height, Math.max(0, y))];
}

function drawRegion() {
  const canvas = $("region-canvas");
  const ctx = canvas.getContext("2d");
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  if (!region.image) return;
  const s = region.scale;
  ctx.imageSmoothingEnabled = s < 1;
  ctx.drawImage(region.image, 0, 0, canvas.width, canvas.height);
  const path = (shape) => {
    ctx.beginPath();
    if (shape.rect) {
      const [x0, y0, x1, y1] = shape.rect;
      ctx.rect(x0 * s, y0 * s, (x1 - x0) * s, (y1 - y0) * s);
    } else {
      shape.polygon.forEach(([x, y], i) => (i ? ctx.lineTo(x * s, y * s) : ctx.moveTo(x * s, y * s)));
      ctx.closePath();
    }
  };
  const colours = { include: ["rgba(40,180,70,0.25)", "#23a040"], exclude: ["rgba(220,40,30,0.35)", "#d02818"] };
  region.shapes.forEach((shape, i) => {
    const [fill, stroke] = colours[shape.part];
    path(shape);
    ctx.fillStyle = fill; ctx.fill("evenodd");
    ctx.strokeStyle = stroke; ctx.lineWidth = 2; ctx.stroke();
    const [lx, ly] = shape.rect ? shape.rect : shape.polygon[0];
    ctx.fillStyle = stroke; ctx.font = "12px sans-serif"; ctx.fillText(String(i + 1), lx * s + 3, ly * s + 13);
  });
  const pending = region.drag ? { part: regionPart(), rect: region.drag.rect } : null;
  ctx.setLineDash([5, 4]);
  ctx.strokeStyle = regionPart() === "include" ? "#23a040" : "#d02818";
  if (pending && pending.rect) { path(pending); ctx.stroke(); }
  if (region.points.length) {
    ctx.beginPath();
    region.points.forEach(([x, y], i) => (i ? ctx.lineTo(x * s, y * s) : ctx.moveTo(x * s, y * s)));
    ctx.stroke();
    for (const [x, y] of region.points) ctx.fillRect(x * s - 2, y * s - 2, 4, 4);
  }
  ctx.setLineDash([]);
}

// The drawn shapes changed: the list, the canvas, and no preview of other shapes left on show.
function regionChanged() {
  const list = region.shapes.map((shape, i) => el("li", { class: shape.part, "data-testid": "region-shape",
    "data-part": shape.part, "data-shape": JSON.stringify(shape.rect ? { rect: shape.rect } : { polygon: shape.polygon }) },
    `${shape.part} ${shape.rect ? `rectangle [${shape.rect.join(", ")}]` : `polygon of ${shape.polygon.length} points`} `,
    el("button", { type: "button", "data-testid": "region-delete", onclick: () => { region.shapes.splice(i, 1); regionChanged(); } }, "delete")));
  $("region-shapes").replaceChildren(...list);
  $("region-close").disabled = region.points.length < 3;
  $("region-preview").disabled = !region.image;
  $("region-save").disabled = !region.image;
  $("region-compare").hidden = true;
  $("region-compare").removeAttribute("data-proposed-threshold");
  drawRegion();
}

function closePolygon() {
  if (region.points.length >= 3) region.shapes.push({ part: regionPart(), polygon: region.points });
  region.points = [];
  regionChanged();
}

$("region-file").addEventListener("change", (ev) => {
  const file = ev.target.files[0];
  ev.target.value = "";
  if (!file) return;
  const img = new Image();
  img.onload = () => {
    region.image = img;
    region.width = img.naturalWidth;
    region.height = img.naturalHeight;
    region.scale = Math.min(REGION_BOX.width / region.width, REGION_BOX.height / region.height);
    const canvas = $("region-canvas");
    canvas.width = Math.max(1, Math.round(region.width * region.scale));
    canvas.height = Math.max(1, Math.round(region.height * region.scale));
    $("region-size").textContent = `${file.name}: ${region.width} x ${region.height} px (the region's size)`;
    $("region-size").dataset.width = String(region.width);
    $("region-size").dataset.height = String(region.height);
    // shapes drawn on another image stay only if they fit this one
    region.shapes = region.shapes.filter((s) => (s.rect ? [[s.rect[0], s.rect[1]], [s.rect[2], s.rect[3]]] : s.polygon)
      .every(([x, y]) => x <= region.width && y <= region.height));
    region.points = [];
    regionChanged();
  };
  img.onerror = () => showError(new ApiError(0, "bad_image", `${file.name}: the browser cannot show this image`));
  img.src = URL.createObjectURL(file);
});

const regionCanvas = $("region-canvas");
regionCanvas.addEventListener("mousedown", (ev) => {
  if (!region.image || regionTool() !== "rect" || ev.button !== 0) return;
  ev.preventDefault();
  const start = regionPoint(ev);
  region.drag = { start, rect: null };
});
window.addEventListener("mousemove", (ev) => {
  if (!region.drag) return;
  const [ax, ay] = region.drag.start, [bx, by] = regionPoint(ev);
  region.drag.rect = [Math.min(ax, bx), Math.min(ay, by), Math.max(ax, bx), Math.max(ay, by)];
  drawRegion();
});
window.addEventListener("mouseup", (ev) => {
  if (!region.drag) return;
  const [ax, ay] = region.drag.start, [bx, by] = regionPoint(ev);
  region.drag = null;
  if (ax !== bx && ay !== by) { // a click without a drag draws nothing
    region.shapes.push({ part: regionPart(), rect: [Math.min(ax, bx), Math.min(ay, by), Math.max(ax, bx), Math.max(ay, by)] });
  }
  regionChanged();
});
regionCanvas.addEventListener("click", (ev) => {
  if (!region.image || regionTool() !== "polygon") return;
  const p = regionPoint(ev);
  const last = region.points[region.points.length - 1];
  if (!last || last[0] !== p[0] || last[1] !== p[1]) region.points.push(p); // a double-click's clicks add one point
  $("region-close").disabled = region.points.length < 3;
  drawRegion();
});
regionCanvas.addEventListener("dblclick", (ev) => { if (regionTool() === "polygon") { ev.preventDefault(); closePolygon(); } });
$("region-close").addEventListener("click", closePolygon);
for (const input of document.querySelectorAll("input[name=region-tool]")) {
  input.addEventListener("change", () => { region.points = []; regionChanged(); });
}

function regionSide(side) {
  if (!side) return [];
  const q = side.quantiles || {};
  const shapes = side.region ? `${side.region.include.length} include, ${side.region.exclude.length} exclude (${side.region.size[1]} x ${side.region.size[0]})` : "none (every pixel counts)";
  return [`${fmt(side.threshold)} (${side.threshold_rule || "–"})`, pct(side.estimated_false_alarm_rate, 2),
    fmt(q.min), fmt(q.median), fmt(q.p90), fmt(q.max), String(side.oof_scores.length), shapes];
}

function showRegionPreview(preview) {
  const names = ["threshold", "est. false alarms", "out-of-fold min", "median", "p90", "max", "scores", "region"];
  const cur = regionSide(preview.current), pro = regionSide(preview.proposed);
  $("region-compare-body").replaceChildren(...names.map((n, i) => el("tr", {},
    el("th", { text: n }), el("td", { text: cur[i] }), el("td", { "data-testid": `proposed-${i}`, text: pro[i] }))));
  const table = $("region-compare");
  table.dataset.version = String(preview.version);
  table.dataset.currentThreshold = String(preview.current.threshold);
  table.dataset.proposedThreshold = String(preview.proposed.threshold);
  table.hidden = false;
}

// kind "preview": the preview job (publishes nothing); "save": PUT, a new version.
async function regionJob(kind) {
  clearError();
  const box = $("region-job");
  const body = regionBody();
  if (!body) return;
  const product = state.product;
  const sent = JSON.stringify(body);
  try {
    if (kind === "preview") {
      const started = await api("POST", `/v1/products/${enc(product)}/region/preview`, { admin: true, type: "application/json", body: sent });
      const job = await followJob(started.job, box, (j) => `preview of v${j.version} done: nothing was published`);
      if (JSON.stringify(regionBody()) === sent) showRegionPreview(job.preview); // the shapes it was computed for
    } else {
      const started = await api("PUT", `/v1/products/${enc(product)}/region`, { admin: true, type: "application/json", body: sent });
      await followJob(started.job, box);
      await loadProducts();
      await loadStoredRegion(product, false); // the stored region is now the saved one
    }
  } catch (exc) { showError(exc, box); }
}
$("region-preview").addEventListener("click", () => regionJob("preview"));
$("region-save").addEventListener("click", () => regionJob("save"));

// The product's stored region (GET /v1/products/{p}): described under the shapes' list and its rectangles and
// polygons loaded as the shapes to edit (they show once a training image of the region's size is picked).
function storedShapes(stored) {
  const shapes = [];
  for (const part of ["include", "exclude"]) {
    for (const s of stored[part] || []) {
      if (s.rect) shapes.push({ part, rect: s.rect });
      else if (s.polygon) shapes.push({ part, polygon: s.polygon });
    }
  }
  return shapes;
}

function describeStored(settings) {
  const tiles = settings.tiles || [1, 1];
  const tiled = tiles[0] * tiles[1] > 1 ? `; tiled ${tiles[0]} x ${tiles[1]} (each tile position counts its part of the region)` : "";
  const r = settings.region;
  if (!r) return `v${settings.version}: no stored region (every pixel counts)${tiled}`;
  return `v${settings.version}: stored region ${(r.include || []).length} include, ${(r.exclude || []).length} exclude, `
    + `${r.size[1]} x ${r.size[0]} px${tiled}`;
}

async function renderRegion() {
  if (region.product !== state.product) { // shapes belong to a product
    region.product = state.product;
    region.shapes = [];
    region.points = [];
    $("region-job").replaceChildren();
    $("region-stored").textContent = "";
    if (state.product) await loadStoredRegion(state.product, true);
  }
  regionChanged();
}

// shapes: also load the stored region's shapes for editing (when the view opens on a product)
async function loadStoredRegion(product, shapes) {
  try {
    const settings = await api("GET", `/v1/products/${enc(product)}`);
    if (region.product !== product) return; // another product was picked meanwhile
    $("region-stored").textContent = describeStored(settings);
    $("region-stored").dataset.version = String(settings.version);
    if (shapes && settings.region && !region.shapes.length) region.shapes = storedShapes(settings.region);
  } catch (exc) { showError(exc); }
}


// --- Drift: flagged share over time with the expected band, the live windows ------------------
function driftChart(data) {
  const W = 720, H = 240, pad = 36;
  const pts = data.points.map((p) => ({ t: p.time ?? (p.start + p.end) / 2, t0: p.start, t1: p.end, share: p.flagged_share ?? p.windows?.[Object.keys(p.windows)[0]]?.flagged_share,
    rate: p.expected_rate, band: p.band ?? p.windows?.[Object.keys(p.windows)[0]]?.band }));
  const { svg, add } = svgCanvas(W, H);
  const t0 = data.since, t1 = data.until;
  const top = Math.max(1e-3, ...pts.map((p) => p.share ?? 0), ...pts.map((p) => (p.band && p.band[1] != null ? p.band[1] : 0))) * 1.1;
  const x = (t) => pad + ((W - 2 * pad) * (t - t0)) / Math.max(1e-9, t1 - t0);
  const y = (v) => H - pad - ((H - 2 * pad) * v) / top;
  const banded = pts.filter((p) => p.band && p.band[0] != null);
  if (banded.length && banded[0].t0 !== undefined) { // buckets of the record: the band of each bucket's parts
    banded.forEach((p) => add("rect", { x: x(p.t0), y: y(p.band[1]), width: Math.max(1, x(p.t1) - x(p.t0) - 1),
      height: Math.max(1, y(p.band[0]) - y(p.band[1])), fill: "#cfe3f7", "data-testid": "drift-band" }));
    add("polyline", { points: banded.map((p) => `${x(p.t)},${y(p.rate)}`).join(" "), fill: "none", stroke: "#1a56c4", "stroke-dasharray": "5,4" });
  } else if (banded.length) {
    const upper = banded.map((p) => `${x(p.t)},${y(p.band[1])}`), lower = banded.map((p) => `${x(p.t)},${y(p.band[0])}`).reverse();
    add("polygon", { points: [...upper, ...lower].join(" "), fill: "#cfe3f7", "data-testid": "drift-band" });
    add("polyline", { points: banded.map((p) => `${x(p.t)},${y(p.rate)}`).join(" "), fill: "none", stroke: "#1a56c4", "stroke-dasharray": "5,4" });
  }
  add("polyline", { points: pts.filter((p) => p.share != null).map((p) => `${x(p.t)},${y(p.share)}`).join(" "), fill: "none", stroke: "#c0261a", "stroke-width": 2 });
  pts.forEach((p) => { if (p.share != null) add("circle", { cx: x(p.t), cy: y(p.share), r: 3, fill: "#c0261a", "data-testid": "drift-point", "data-share": p.share }); });
  add("line", { x1: pad, y1: H - pad, x2: W - pad, y2: H - pad, stroke: "#333" });
  add("line", { x1: pad, y1: pad, x2: pad, y2: H - pad, stroke: "#333" });
  for (let k = 0; k <= 4; k++) add("text", { x: 2, y: y((k * top) / 4) + 4 }, pct((k * top) / 4, 1));
  add("text", { x: pad, y: H - 8 }, when(t0));
  add("text", { x: W - pad - 130, y: H - 8 }, when(t1));
  add("text", { x: pad + 4, y: 14 }, `flagged share (red) vs expected rate (dashed) and its band at alpha ${data.alpha} (blue); source: ${data.source}`);
  return svg;
}

async function renderDrift() {
  const product = state.product;
  const hours = Number($("drift-hours").value);
  const data = await api("GET", `/v1/products/${enc(product)}/drift?hours=${hours}&buckets=48`);
  $("drift-chart").replaceChildren(driftChart(data));
  const live = data.live;
  const rows = live ? Object.entries(live.windows).map(([name, w]) => el("tr", { "data-testid": "drift-window", "data-state": w.state },
    el("td", { text: name }), el("td", { text: String(w.parts) }), el("td", { text: pct(w.flagged_share, 2) }),
    el("td", { text: pct(live.expected_rate, 2) }), el("td", { text: w.flag_p.toExponential(2) }),
    el("td", { text: w.score_quantiles.map((q) => fmt(q, 3)).join(" / ") }),
    el("td", { text: live.reference_quantiles.map((q) => fmt(q, 3)).join(" / ") }),
    el("td", { text: fmt(w.shift, 3) }), el("td", { class: `state ${w.state}`, text: w.state }))) : [];
  $("drift-body").replaceChildren(...rows);
  $("drift-hint").textContent = live ? `v${live.version}: windows of the parts this service scored since it started (a new version starts them afresh).`
    : "No part of this product scored since the service started.";
}
$("drift-hours").addEventListener("change", () => renderDrift().catch(showError));

// --- stations (serve/stations.py) --------------------------------------------------------------
const STATIONS_EVERY_MS = 2000;
let stationsTimer = null;

function stationRow(s) {
  const shown = s.silent ? "silent" : s.state;
  const last = s.last ? `${s.last.part_id}: ${s.last.verdict || s.last.status}${s.last.late ? " (late)" : ""}` : "–";
  const latency = s.latency_ms ? `${s.latency_ms.p50.toFixed(0)} / ${s.latency_ms.p99.toFixed(0)} ms` : "–";
  return el("tr", { "data-station": `${s.line}/${s.station}` },
    el("td", { text: s.line }), el("td", { text: s.station }),
    el("td", { text: s.version ? `${s.product} v${s.version}` : s.product }),
    el("td", { text: s.silent ? `silent (said ${s.state})` : s.state, class: `station-state ${shown}`, "data-testid": "station-state" }),
    el("td", { text: String(s.queue), class: s.queue ? "warn" : null }),
    ...["ok", "review", "reject", "timeout", "error"].map((v) => el("td", { text: String(s.parts[v] || 0) })),
    el("td", { text: last }), el("td", { text: latency }), el("td", { text: `${s.seen_s.toFixed(0)} s ago` }));
}

async function renderStations() {
  const { stations } = await api("GET", "/v1/stations");
  $("stations-body").replaceChildren(...stations.map(stationRow));
  $("stations-empty").hidden = stations.length > 0;
  clearTimeout(stationsTimer);
  stationsTimer = setTimeout(() => { if (state.view === "stations") renderStations().catch(showError); }, STATIONS_EVERY_MS);
}

// --- views ----------------------------------------------------------------------------------
const VIEWS = { products: renderProducts, inspect: async () => {}, recent: renderRecent, calibration: renderCalibration,
  versions: renderVersions, region: renderRegion, drift: renderDrift, stations: renderStations };
const NO_PRODUCT_NEEDED = new Set(["products", "stations"]);

async function render() {
  const view = VIEWS[location.hash.slice(1)] ? location.hash.slice(1) : "products";
  state.view = view;
  for (const name of Object.keys(VIEWS)) $(`view-${name}`).hidden = name !== view;
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.view === view);
  for (const s of document.querySelectorAll(".product-name")) s.textContent = state.product || "";
  if (!NO_PRODUCT_NEEDED.has(view) && !state.product) return showError(new ApiError(0, "no_product", "the store holds no product yet"));
  try { await VIEWS[view](); } catch (exc) { showError(exc); }
  document.body.dataset.ready = view;
}
window.addEventListener("hashchange", () => { notice(""); render(); });

(async () => {
  renderToken();
  try { await loadProducts(); } catch (exc) { showError(exc); }
  await render();
})();
