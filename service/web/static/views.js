// Pure DOM renderers for the gateway page: they take API data and return elements, and
// never fetch. Everything the server sends is put in as text (never innerHTML), and every
// field is read defensively: gate reports are free-form JSON written by training jobs.

/** Build an element: el("td", {class: "x", onclick: fn}, "text", child, [more]). */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") {
      node.addEventListener(name.slice(2), value);
    } else if (name === "class") {
      node.className = value;
    } else if (name === "style" && typeof value === "object") {
      Object.assign(node.style, value);
    } else {
      node.setAttribute(name, value === true ? "" : String(value));
    }
  }
  appendAll(node, children);
  return node;
}

function appendAll(node, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : String(child));
  }
}

const isObject = (v) => v !== null && typeof v === "object" && !Array.isArray(v);
const isNumber = (v) => typeof v === "number" && Number.isFinite(v);

/** A number with 3 decimals; anything else as short text; missing as a dash. */
export function fmt(value) {
  if (isNumber(value)) return Number.isInteger(value) ? String(value) : value.toFixed(3);
  if (value === null || value === undefined) return "–";
  if (typeof value === "object") return JSON.stringify(value);
  return String(value);
}

/** "3 min ago"-style age of an ISO time, for tables people scan. */
export function ago(iso) {
  const t = Date.parse(iso);
  if (!iso || Number.isNaN(t)) return "";
  const s = Math.max(0, Math.round((Date.now() - t) / 1000));
  if (s < 60) return `${s}s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  return new Date(t).toLocaleDateString();
}

export function badge(text, kind = "") {
  return el("span", {class: `badge ${kind}`}, text);
}

/** The gate verdict of a report: passed / failed / none. */
export function gateBadge(gate) {
  if (!isObject(gate) || typeof gate.passed !== "boolean") return badge("no gate", "none");
  return gate.passed ? badge("gate passed", "ok") : badge("gate failed", "bad");
}

/** A version's newest gate report (every report, per gallery: ``gateReports``). The
 * service runs every gate it records; a report in an artifact's manifest was never
 * checked, so it is not shown as a verdict. */
export function gateOf(version) {
  return version?.gate ?? null;
}

/** A version's gate badge: "gate forced" when an operator promoted it past the gate. */
export function versionGateBadge(version) {
  if (version?.gate_status === "forced") return badge("gate forced", "forced");
  return gateBadge(gateOf(version));
}

/** Every gate report of a version, newest first: the gallery it was measured for, the
 * incumbent it was compared with, the validation set (its content digest) and criterion,
 * the verdict, and whether it still counts. A report goes stale when its gallery's
 * incumbent, validation set or criterion changes; only a current, passing report for
 * that gallery lets the version in without force. */
export function gateReports(version) {
  const gates = Array.isArray(version?.gates) ? version.gates.filter(isObject) : [];
  if (!gates.length) return null;
  const rows = gates.slice().reverse().map((g) => el("tr", {"data-gallery": g.gallery ?? ""},
    el("td", {}, g.gallery ?? "–"),
    el("td", {}, g.incumbent ?? "–"),
    el("td", {class: "small", title: g.validation ?? ""}, digestText(g.validation_digest)),
    el("td", {class: "small"}, isObject(g.criterion) ? Object.entries(g.criterion)
      .map(([k, v]) => `${k} ${fmt(v)}`).join(", ") : "–"),
    el("td", {}, gateBadge(g)),
    el("td", {class: "standing"}, g.current ? badge("current", "ok") : [badge("stale", "none"),
      el("div", {class: "small muted"}, (Array.isArray(g.stale) ? g.stale : []).join("; "))]),
    el("td", {class: "small"}, ago(g.measured_at))));
  return el("table", {class: "data gates"},
    el("thead", {}, el("tr", {}, ["gallery", "against", "validation set", "criterion",
      "verdict", "counts now", "measured"].map((h) => el("th", {}, h)))),
    el("tbody", {}, rows));
}

function digestText(digest) {
  if (typeof digest !== "string") return "no validation set";
  return digest.startsWith("sha256:") ? `${digest.slice(0, 19)}…` : digest;
}

/** Who forced the version past a check, when, into which gallery, and why. */
export function forcedList(version) {
  const forced = Array.isArray(version?.forced) ? version.forced : [];
  if (!forced.length) return null;
  return el("ul", {class: "forced"}, forced.map((f) => el("li", {},
    badge("forced", "forced"), ` into ${f.gallery} by ${f.by}, ${f.at}`,
    Array.isArray(f.overrides) && f.overrides.length ? ` (skipped: ${f.overrides.join(", ")})`
      : "", f.reason ? ` — ${f.reason}` : "")));
}

// ------------------------------------------------------------------ galleries

/** The native space of a version (from GET /v1/models), or null when it is not listed. */
export function nativeSpace(versions, versionId) {
  const found = (versions || []).find((v) => v.version_id === versionId);
  return found ? found.space : null;
}

/** A gallery can start a migration when none is open and its active version is native
 * to another space (it serves through a route). */
export function canMigrate(gallery, versions) {
  const native = nativeSpace(versions, gallery.active);
  return !gallery.migration && native !== null && native !== gallery.space;
}

/** Galleries: space, active version, what this replica serves, an open migration (state
 * and its spaces) and, where it applies, a "Start migration" button (``onMigrate``). */
export function galleriesTable(galleries, {versions = [], onMigrate = null,
  migrateForms = {}} = {}) {
  if (!galleries.length) return el("p", {class: "muted"}, "No galleries yet.");
  const rows = galleries.map((g) => el("tr", {"data-gallery": g.name},
    el("td", {}, el("strong", {}, g.name)),
    el("td", {class: "space"}, g.space),
    el("td", {class: "active-version"}, badge(g.active, "active")),
    el("td", {}, servingText(g.serving)),
    el("td", {class: "migration-cell"}, migrationCell(g, versions, onMigrate,
      migrateForms)),
    el("td", {class: "small"}, lastEvent(g.history))));
  return el("table", {class: "data"},
    el("thead", {}, el("tr", {}, ["gallery", "space", "active", "this replica serves",
      "migration", "last change"].map((h) => el("th", {}, h)))),
    el("tbody", {}, rows));
}

function migrationCell(g, versions, onMigrate, migrateForms = {}) {
  const m = isObject(g.migration) ? g.migration : null;
  if (m) {
    return [migrationBadge(m.state), el("div", {class: "small muted"},
      `${m.source_space ?? "?"} → ${m.target_space ?? "?"} (${m.version ?? "?"})`)];
  }
  if (!canMigrate(g, versions)) return el("span", {class: "muted small"}, "–");
  const native = nativeSpace(versions, g.active);
  if (!migrateForms[g.name]) migrateForms[g.name] = {};
  const form = migrateForms[g.name];
  return el("div", {class: "actions"},
    el("div", {class: "small muted"}, `${g.active} is native to ${native}`),
    onMigrate ? [migrationOptions(form),
      el("button", {type: "button", class: "primary", "data-action": "migrate",
        onclick: () => onMigrate(g.name, migrationBody(form))}, `Migrate to ${native}`)]
      : null);
}

/** The options of a new migration (``form`` keeps them across redraws): a transform
 * first, the backfill order, when to switch, the transform's sample, the validation set
 * (the gate's, and the transform's curve; default the gallery's). A learned order and
 * a progressive switch work on the transformed side, so they are offered only with it;
 * the candidate order (what users retrieve first) only without it. */
function migrationOptions(form) {
  const transform = el("input", {type: "checkbox", name: "transform"});
  transform.checked = Boolean(form.transform);
  const option = (value, label, needsTransform = false, withoutTransform = false) =>
    el("option", {value, "data-needs-transform": needsTransform ? "1" : null,
      "data-without-transform": withoutTransform ? "1" : null}, label);
  const order = el("select", {name: "order"}, option("id", "by id"),
    option("random", "random"), option("learned", "learned (worst first)", true),
    option("candidates", "what users retrieve first", false, true));
  const switchAt = el("select", {name: "switch"}, option("end", "at the end"),
    option("progressive", "progressive", true));
  const sample = el("input", {type: "number", name: "sample", min: 8, step: 1,
    max: 1000000,
    placeholder: "2% of items", value: form.sample ?? ""});
  const validation = el("input", {name: "validation", placeholder: "the gallery's",
    spellcheck: "false", value: form.validation ?? "",
    oninput: () => { form.validation = validation.value; }});
  const sync = () => {
    for (const select of [order, switchAt]) {
      for (const o of select.options) {
        o.disabled = transform.checked ? !!o.dataset.withoutTransform : !!o.dataset.needsTransform;
      }
      if (select.selectedOptions[0]?.disabled) select.value = select.options[0].value;
    }
    sample.disabled = !transform.checked;
    form.transform = transform.checked;
    form.order = order.value;
    form.switch = switchAt.value;
    form.sample = sample.value;
  };
  order.value = form.order ?? "id";
  switchAt.value = form.switch ?? "end";
  for (const input of [transform, order, switchAt]) input.addEventListener("change", sync);
  sample.addEventListener("input", sync);
  sync();
  return el("details", {class: "migrate-options small", open: form.open ? true : null,
    ontoggle: (event) => { form.open = event.target.open; }},
  el("summary", {}, "options"),
  el("label", {class: "check"}, transform, " transform first"),
  el("label", {}, "order ", order),
  el("label", {}, "switch ", switchAt),
  el("label", {}, "sample ", sample),
  el("label", {}, "validation set ", validation));
}

// MIGRATION BODY (tests/test_web_form.py runs this function under node)
/** The POST .../migration body of the options: only what the person set, and never a
 * combination the API refuses (learned / progressive / sample need the transform,
 * candidates refuses it). */
export function migrationBody(form = {}) {
  const transform = Boolean(form.transform);
  const body = {};
  if (transform) body.transform = true;
  if (form.order === "random" || (transform && form.order === "learned")
      || (!transform && form.order === "candidates")) body.order = form.order;
  if (transform && form.switch === "progressive") body.switch = "progressive";
  const sample = Number.parseInt(String(form.sample ?? ""), 10);
  if (transform && Number.isFinite(sample) && sample >= 8 && sample <= 1000000) {
    body.sample = sample;
  }
  const validation = String(form.validation ?? "").trim();
  if (validation) body.validation = validation;
  return body;
}
// END MIGRATION BODY

export function migrationBadge(state) {
  const kind = {backfilling: "run", switched: "ok", rolled_back: "none"}[state] || "";
  return el("span", {class: `badge ${kind}`, "data-migration-state": state ?? ""},
    state ?? "?");
}

function servingText(serving) {
  if (!isObject(serving)) return el("span", {class: "muted"}, "not loaded here");
  if (serving.problem) return el("span", {class: "bad-text"}, serving.problem);
  return `${serving.version ?? "?"} via ${serving.route ?? "?"}`;
}

function lastEvent(history) {
  if (!Array.isArray(history) || !history.length) return "";
  const e = history[history.length - 1];
  // Migration events keep the version and move the space: say where it went.
  const from = e.space ? ` into space ${e.space}`
    : (e.previous ? ` (from ${e.previous})` : "");
  const forced = e.forced ? ` FORCED (skipped: ${(e.overrides || []).join(", ")})` : "";
  return `${e.action} ${e.version}${from}${forced} by ${e.by}, ${ago(e.at)}` +
    (e.reason ? ` — ${e.reason}` : "");
}

// ------------------------------------------------------------------ lineage

/** Versions as a tree by manifest parent; a parent that is not registered starts a root. */
export function lineageTree(versions, galleries, selected, onSelect) {
  const byId = new Map(versions.map((v) => [v.version_id, v]));
  const children = new Map();
  const roots = [];
  for (const v of versions) {
    const parent = v.manifest?.parent;
    if (parent && byId.has(parent) && parent !== v.version_id) {
      if (!children.has(parent)) children.set(parent, []);
      children.get(parent).push(v);
    } else {
      roots.push(v);
    }
  }
  const activeIn = new Map();
  for (const g of galleries) {
    if (!activeIn.has(g.active)) activeIn.set(g.active, []);
    activeIn.get(g.active).push(g.name);
  }
  const seen = new Set();
  const branch = (list) => el("ul", {class: "tree"}, list.map((v) => {
    if (seen.has(v.version_id)) return null;  // a cycle in bad manifests: show once
    seen.add(v.version_id);
    const kids = children.get(v.version_id) || [];
    const parent = v.manifest?.parent;
    const lost = parent && !byId.has(parent) ? parent : null;
    return el("li", {}, versionNode(v, activeIn.get(v.version_id) || [],
      v.version_id === selected, onSelect, lost), kids.length ? branch(kids) : null);
  }));
  if (!versions.length) return el("p", {class: "muted"}, "No versions registered.");
  return branch(roots);
}

function versionNode(v, activeGalleries, isSelected, onSelect, lostParent) {
  const m = v.manifest || {};
  return el("button", {type: "button", class: `node${isSelected ? " selected" : ""}`,
    "data-version": v.version_id, onclick: () => onSelect(v.version_id)},
  el("strong", {}, v.version_id),
  m.kind ? badge(m.kind, "kind") : null,
  el("span", {class: "muted small"}, ` space ${v.space}`),
  versionGateBadge(v),
  activeGalleries.map((g) => badge(`active: ${g}`, "active")),
  lostParent ? el("span", {class: "muted small"}, ` from ${lostParent} (not registered)`) : null);
}

/** Key facts of a version for the detail panel. */
export function versionFacts(v) {
  const m = v.manifest || {};
  const spec = m.model_spec || {};
  const model = spec.arch ? `${spec.arch}${spec.pretrained ? ` / ${spec.pretrained}` : ""}`
    : (spec.config ? "config" : null);
  const facts = [
    ["kind", m.kind], ["parent", m.parent ?? "none"], ["space", v.space],
    ["routes", Array.isArray(v.routes) ? v.routes.join(", ") : v.routes],
    ["model", model], ["embed dim", m.embed_dim], ["created", m.created_at],
    ["registered", `${v.registered_at ?? ""} by ${v.registered_by ?? "?"}`],
  ];
  return definitionList(facts.filter(([, value]) => value !== undefined && value !== null));
}

function definitionList(pairs) {
  return el("dl", {class: "facts"}, pairs.map(([k, v]) => [el("dt", {}, k),
    el("dd", {}, isObject(v) || Array.isArray(v) ? el("code", {}, JSON.stringify(v)) : fmt(v))]));
}

// ------------------------------------------------------------------ gate report

/** The whole gate report: verdict, criterion, other fields, matrix table + heatmap, raw. */
export function gateReport(gate) {
  if (gate === null || gate === undefined) {
    return el("p", {class: "muted"}, "No gate report: the service has not gated this version " +
      "yet (an evaluate job runs the gate).");
  }
  if (!isObject(gate)) return el("pre", {class: "raw"}, JSON.stringify(gate, null, 2));
  const known = ["passed", "criterion", "matrix", "negative_flip", "positive_flip",
    "max_negative_flip"];
  const extra = Object.entries(gate).filter(([k]) => !known.includes(k));
  return el("div", {class: "gate"},
    el("p", {}, gateBadge(gate)),
    flips(gate),
    isObject(gate.criterion) ? [el("h4", {}, "Criterion"),
      definitionList(Object.entries(gate.criterion))] : null,
    extra.length ? [el("h4", {}, "Details"), definitionList(extra)] : null,
    isObject(gate.matrix) ? compatibility(gate.matrix) : null,
    el("details", {}, el("summary", {}, "raw report"),
      el("pre", {class: "raw"}, JSON.stringify(gate, null, 2))));
}

/** The negative-flip rates (queries the incumbent answered right at top-1 and the
 * candidate gets wrong), per direction, with the configured bound. */
export function flips(gate) {
  if (!isObject(gate.negative_flip)) return null;
  const pct = (v) => (typeof v === "number" ? `${(100 * v).toFixed(1)}%` : "-");
  const bound = typeof gate.max_negative_flip === "number"
    ? `bound ${pct(gate.max_negative_flip)}` : "no bound set";
  const dirs = Object.entries(gate.negative_flip).map(([d, v]) => `${d} ${pct(v)}`).join(", ");
  return el("p", {class: "flips"}, `Negative flips (regressions): ${dirs}; ${bound}.`);
}

/** Metric names present in a matrix: "t2i R@1", "i2t mAP@10", "rm" ... in a stable order. */
export function matrixMetrics(cells) {
  const names = new Set();
  for (const row of Object.values(isObject(cells) ? cells : {})) {
    for (const cell of Object.values(isObject(row) ? row : {})) {
      if (!isObject(cell)) continue;
      for (const [key, value] of Object.entries(cell)) {
        if (isNumber(value)) names.add(key);
        if (isObject(value)) {
          for (const [m, x] of Object.entries(value)) if (isNumber(x)) names.add(`${key} ${m}`);
        }
      }
    }
  }
  const order = (n) => (n.startsWith("t2i") ? 0 : n.startsWith("i2t") ? 1 : 2);
  return [...names].sort((a, b) => order(a) - order(b) || a.localeCompare(b, "en",
    {numeric: true}));
}

export function metricValue(cell, metric) {
  if (!isObject(cell)) return null;
  const [first, second] = metric.split(" ");
  const value = second === undefined ? cell[first] : cell[first]?.[second];
  return isNumber(value) ? value : null;
}

function matrixModels(matrix, cells) {
  if (Array.isArray(matrix.models) && matrix.models.length) return matrix.models.map(String);
  const ids = new Set(Object.keys(cells));
  for (const row of Object.values(cells)) {
    if (isObject(row)) Object.keys(row).forEach((k) => ids.add(k));
  }
  return [...ids];
}

/** The compatibility matrix twice: numbers in a table, and a heatmap of one metric. */
export function compatibility(matrix) {
  const cells = isObject(matrix.cells) ? matrix.cells : {};
  const models = matrixModels(matrix, cells);
  const metrics = matrixMetrics(cells);
  if (!models.length) return el("p", {class: "muted"}, "The matrix is empty.");
  const cellOf = (q, g) => (isObject(cells[q]) ? cells[q][g] : undefined);
  const shown = metrics.filter((m) => /R@1$|^rm$/.test(m));
  const table = grid(models, (q, g) => {
    const cell = cellOf(q, g);
    if (cell === null) return el("td", {class: "na"}, "no route");
    if (!isObject(cell)) return el("td", {class: "na"}, "–");
    return el("td", {}, (shown.length ? shown : metrics.slice(0, 3)).map((m) =>
      el("div", {class: "small"}, `${m} `, el("strong", {}, fmt(metricValue(cell, m))))));
  });
  const holder = el("div", {class: "heatmap-holder"});
  const pick = el("select", {class: "metric", onchange: () => draw(pick.value)},
    metrics.map((m) => el("option", {value: m}, m)));
  const draw = (metric) => holder.replaceChildren(heatmap(models, cellOf, metric));
  if (metrics.length) {
    pick.value = metrics.includes("t2i R@1") ? "t2i R@1" : metrics[0];
    draw(pick.value);
  }
  return el("div", {class: "matrix"},
    el("h4", {}, "Compatibility matrix ", el("span", {class: "muted small"},
      "rows: query version (through its route), columns: gallery version")),
    table,
    metrics.length ? [el("h4", {}, "Heatmap of ", pick), holder] : null);
}

function grid(models, cellFor) {
  return el("table", {class: "data matrix-table"},
    el("thead", {}, el("tr", {}, el("th", {}, "query \\ gallery"),
      models.map((g) => el("th", {}, g)))),
    el("tbody", {}, models.map((q) => el("tr", {}, el("th", {}, q),
      models.map((g) => cellFor(q, g))))));
}

function heatmap(models, cellOf, metric) {
  const values = [];
  for (const q of models) for (const g of models) {
    const v = metricValue(cellOf(q, g), metric);
    if (v !== null) values.push(v);
  }
  const unit = values.every((v) => v >= 0 && v <= 1);
  const lo = unit ? 0 : Math.min(...values);
  const hi = unit ? 1 : Math.max(...values);
  const table = grid(models, (q, g) => {
    const v = metricValue(cellOf(q, g), metric);
    if (v === null) return el("td", {class: "heat na", title: `${q} → ${g}: none`}, "·");
    const t = hi > lo ? (v - lo) / (hi - lo) : 1;
    return el("td", {class: "heat", title: `${q} → ${g}: ${metric} ${fmt(v)}`,
      style: {background: heatColour(t), color: t > 0.55 ? "#fff" : "#111"}}, fmt(v));
  });
  table.classList.add("heatmap");
  return el("div", {}, table, el("div", {class: "legend small muted"},
    el("span", {class: "swatch", style: {background: heatColour(0)}}), ` ${fmt(lo)} `,
    el("span", {class: "swatch", style: {background: heatColour(1)}}), ` ${fmt(hi)}`));
}

/** Light yellow (0) through teal to dark blue (1): readable and colour-blind safe. */
export function heatColour(t) {
  const x = Math.min(1, Math.max(0, t));
  const hue = 55 + x * 170;
  const light = 90 - x * 60;
  return `hsl(${hue.toFixed(0)}, 70%, ${light.toFixed(0)}%)`;
}

// ------------------------------------------------------------------ jobs

const ACTIVE = new Set(["queued", "running"]);
export const isActive = (job) => ACTIVE.has(job?.status);

/** Progress of a job as a bar plus "stage · step/total · loss · eta". */
export function progressOf(job) {
  const p = isObject(job.progress) ? job.progress : {};
  const bar = isNumber(p.total) && p.total > 0 && isNumber(p.step)
    ? el("progress", {max: p.total, value: Math.min(p.step, p.total)})
    : (isActive(job) ? el("progress", {}) : null);
  const parts = [p.stage, isNumber(p.step) ? `${p.step}/${fmt(p.total)}` : null,
    isNumber(p.loss) ? `loss ${p.loss.toFixed(4)}` : null,
    isNumber(p.eta_s) && isActive(job) ? `eta ${Math.round(p.eta_s)}s` : null].filter(Boolean);
  return el("div", {class: "progress"}, bar, el("span", {class: "small muted"}, parts.join(" · ")));
}

export function statusBadge(status) {
  const kind = {succeeded: "ok", failed: "bad", cancelled: "none", running: "run",
    queued: "none"}[status] || "";
  return badge(status ?? "?", kind);
}

// ------------------------------------------------------------------ migrations

/** Seconds as "42 s", "3.5 min" or "1.2 h". */
export function duration(seconds) {
  if (!isNumber(seconds)) return "–";
  if (seconds < 90) return `${Math.round(seconds)} s`;
  if (seconds < 5400) return `${(seconds / 60).toFixed(1)} min`;
  return `${(seconds / 3600).toFixed(1)} h`;
}

/** Which operator calls apply to a migration (GET .../migration) in its state. */
export function migrationActions(view) {
  if (Array.isArray(view?.options)) {  // the server's state machine says what is allowed
    const allowed = new Set(view.options);
    return Object.fromEntries(["cancel", "switch", "rollback", "retire", "pause", "resume",
      "keep"].map(
      (a) => [a, allowed.has(a)]));
  }
  const result = isObject(view?.result) ? view.result : {};
  const running = ACTIVE.has(view?.job_status) || view?.job_status === "applying";
  return {
    cancel: view?.state === "backfilling" && running,
    switch: view?.state === "backfilling" && view?.job_status === "succeeded" &&
      result.switched !== true,
    rollback: view?.state === "switched",
    // A progressive switch leaves the job backfilling: retire waits for it to end.
    retire: (view?.state === "switched" || view?.state === "rolled_back") && !running,
  };
}

/** One migration: state, sides, progress (done/total, items/s, ETA, stage, applied,
 * unreadable), the gate, the switch's outcome, and the buttons that apply now.
 * ``on`` holds the calls: {switch(body), rollback(reason), retire(), cancel()}. ``form``
 * keeps what the person typed across re-renders (the panel redraws while it runs). */
export function migrationPanel(view, on, form = {}) {
  const p = isObject(view.progress) ? view.progress : {};
  const result = isObject(view.result) ? view.result : {};
  const unreadable = Array.isArray(result.unreadable) ? result.unreadable : [];
  const unreadableCount = isNumber(result.unreadable_count) ? result.unreadable_count
    : (isNumber(p.unreadable) ? p.unreadable : unreadable.length);
  const total = isNumber(p.total) ? p.total : 0;
  const done = isNumber(p.done) ? p.done : 0;
  const bar = total > 0 ? el("progress", {max: total, value: Math.min(done, total)})
    : (view.state === "backfilling" ? el("progress", {}) : null);
  const running = ACTIVE.has(view.job_status) || view.job_status === "applying";
  const facts = [
    ["stage", p.stage], ["done", `${done}/${total}`],
    ["items/s", isNumber(p.items_per_s) ? p.items_per_s : null],
    ["ETA", running && isNumber(p.eta_s) ? duration(p.eta_s) : null],
    ["applied", isNumber(p.applied) ? p.applied : null],
    ["unreadable", unreadableCount],
  ];
  const actions = migrationActions(view);
  return el("div", {class: "migration panel-inner", "data-migration": view.gallery},
    el("h3", {}, `Migration of ${view.gallery} `, migrationBadge(view.state)),
    el("p", {class: "small"},
      `${view.source?.space ?? "?"} → ${view.target?.space ?? "?"} with ${view.version}`,
      el("span", {class: "muted"}, ` · serving space ${view.serving_space} · job ${view.job} `),
      statusBadge(view.job_status ?? "gone"),
      el("span", {class: "muted"}, ` · started by ${view.started_by} ${ago(view.started_at)}`)),
    el("div", {class: "progress"}, bar),
    el("dl", {class: "facts migration-progress"}, facts.map(([k, v]) => [el("dt", {}, k),
      el("dd", {"data-field": k}, v === null || v === undefined ? "–" : String(v))])),
    migrationGate(view.gate),
    Array.isArray(p.curve) && p.curve.length ? migrationCurve(p, view) : null,
    view.phase ? el("p", {class: "small", "data-field": "phase"},
      el("strong", {}, view.phase), ` · ${view.phase_note ?? ""}`) : null,
    view.serving ? el("p", {class: "small", "data-field": "serving-mode"},
      `searches: ${view.serving === "rerank"
        ? `reranked by ${view.version} (top ${view.rerank_k ?? 20} of the route), ` +
          `${p.filled_by_reads ?? 0} item(s) filled by reads`
        : view.serving === "hybrid" ? "hybrid: both sides' scores summed"
        : "the route's order"}${p.paused ? " · the bulk backfill is paused (lazy migration)"
        : ""}`) : null,
    p.candidates ? el("p", {class: "small", "data-field": "candidate-order"},
      `backfill order: what users retrieve first · ${p.candidates.first} of ` +
      `${p.candidates.left} item(s) planned first (counts as of the ${p.candidates.planned})`)
      : null,
    view.job_error ? el("p", {class: "bad-text small", "data-field": "job-error"},
      view.job_error) : null,
    result.switch_refused ? el("p", {class: "bad-text small", "data-field": "switch-refused"},
      `not switched: ${result.switch_refused}`) : null,
    migrationEnd(view.end),
    unreadable.length ? el("details", {class: "small"},
      el("summary", {}, `${unreadableCount} unreadable item(s)`),
      el("ul", {}, unreadable.slice(0, 20).map((u) => el("li", {},
        el("code", {}, String(u.id)), ` ${u.reason ?? ""}`)))) : null,
    migrationControls(view, actions, on, form, unreadable));
}

/** The end states the gate measured (``view.end``): each choice's R@1 per direction,
 * whether the native side alone is below it, and what keeping both sides costs. */
export function migrationEnd(end) {
  if (!isObject(end) || !Array.isArray(end.choices)) return null;
  const r1 = (c) => Object.entries(isObject(c["R@1"]) ? c["R@1"] : {})
    .map(([d, v]) => `${d} ${isNumber(v) ? v.toFixed(3) : "–"}`).join(", ");
  const cost = isObject(end.cost_of_keeping) ? end.cost_of_keeping : {};
  const mb = (b) => (isNumber(b) ? `${(b / 1e6).toFixed(1)} MB` : "–");
  return el("div", {class: "small", "data-field": "end"},
    el("p", {class: end.native_below_what_serves ? "bad-text" : ""},
      end.native_below_what_serves
        ? "The native side alone is below what serves now: switching would lower quality."
        : "End states measured by the gate on the validation set:"),
    el("ul", {}, end.choices.map((c) => el("li", {"data-end": c.end},
      el("strong", {}, c.end), ` R@1 ${r1(c)}`,
      c.native_below ? " (the native side is below it beyond the error)" : "",
      ` · ${c.action}`))),
    el("p", {class: "muted"}, `Keeping both sides: vectors ${mb(cost.vector_bytes_both)} ` +
      `against ${mb(cost.vector_bytes_one_side)} for one side, ` +
      `${cost.embeddings_per_write ?? 2} embeddings per write.`));
}

// ------------------------------------------------------------------ migration curve

const SVG_NS = "http://www.w3.org/2000/svg";

/** Build an SVG element (``el`` makes HTML ones): svg("line", {x1: 0, ...}, children). */
export function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    node.setAttribute(name, String(value));
  }
  appendAll(node, children);
  return node;
}

const DIRECTIONS = [["t2i", "text → image"], ["i2t", "image → text"]];
const CURVE_FLOOR = -0.1;  // shares below are drawn at this floor (and say so in a title)
const pct = (v) => (isNumber(v) ? `${(100 * v).toFixed(1)}%` : "–");

/** ``{share, se}`` of a curve point or of the route, per direction. */
function shareOf(entry) {
  const share = isObject(entry) ? entry.share : undefined;
  if (isNumber(share)) return {share, se: null};
  if (isObject(share) && isNumber(share.share)) {
    return {share: share.share, se: isNumber(share.se) ? share.se : null};
  }
  return null;
}

/** The validation curve of a transform migration: the side's share of the gain (y) as
 * the backfill goes (x), per direction, the route's share dashed, where the backfill is
 * now and where the gallery switches (or switched); beside it, the numbers. */
export function migrationCurve(p, view = {}) {
  const curve = p.curve.filter((point) => isObject(point) && isNumber(point.fraction));
  const W = 320;
  const H = 170;
  const left = 38;
  const right = 10;
  const top = 10;
  const bottom = 26;
  const x = (f) => left + Math.min(1, Math.max(0, f)) * (W - left - right);
  const y = (v) => top + (1 - (Math.min(1, Math.max(CURVE_FLOOR, v)) - CURVE_FLOOR) /
    (1 - CURVE_FLOOR)) * (H - top - bottom);
  const routed = isObject(p.routed) ? p.routed : {};
  const parts = [];
  for (const v of [0, 0.25, 0.5, 0.75, 1]) {  // grid and axis labels
    parts.push(svg("line", {class: "grid", x1: left, x2: W - right, y1: y(v), y2: y(v)}),
      svg("text", {class: "tick", x: left - 4, y: y(v) + 3, "text-anchor": "end"}, `${v * 100}%`));
  }
  for (const f of [0, 0.5, 1]) {
    parts.push(svg("text", {class: "tick", x: x(f), y: H - bottom + 12, "text-anchor": "middle"},
      `${f * 100}%`));
  }
  parts.push(svg("text", {class: "tick", x: (left + W - right) / 2, y: H - 3,
    "text-anchor": "middle"}, "share of the backfill done"));
  let drawn = 0;
  for (const [d, label] of DIRECTIONS) {
    const route = shareOf(routed[d]);
    if (route) {
      parts.push(svg("line", {class: `routed routed-${d}`, "data-direction": d, x1: left,
        x2: W - right, y1: y(route.share), y2: y(route.share)},
      svg("title", {}, `${label}: the route's share ${pct(route.share)}`)));
    }
    const points = curve.map((point) => [point.fraction, shareOf(point[d])])
      .filter(([, s]) => s !== null);
    if (!points.length) continue;
    drawn += 1;
    parts.push(svg("polyline", {class: `line line-${d}`, "data-direction": d,
      "data-points": points.length, fill: "none",
      points: points.map(([f, s]) => `${x(f).toFixed(1)},${y(s.share).toFixed(1)}`).join(" ")},
    svg("title", {}, `${label}: share of the gain on the validation set` +
      (points.some(([, s]) => s.share < CURVE_FLOOR) ? ` (below ${pct(CURVE_FLOOR)} drawn at it)`
        : ""))));
  }
  const fraction = isNumber(p.fraction) ? p.fraction : null;
  const switched = isNumber(p.switched_at_fraction) ? p.switched_at_fraction : null;
  const planned = isNumber(p.switch_at) ? p.switch_at : null;
  const marker = (f, kind, label) => svg("g", {class: `marker ${kind}`, "data-fraction": f},
    svg("line", {x1: x(f), x2: x(f), y1: top, y2: H - bottom}),
    svg("text", {x: f > 0.85 ? x(f) - 3 : x(f) + 3, y: top + (kind === "now" ? 9 : 20),
      "text-anchor": f > 0.85 ? "end" : "start"}, label),
    svg("title", {}, `${label} at ${pct(f)}`));
  if (switched !== null) parts.push(marker(switched, "switched", "switched"));
  else if (planned !== null) parts.push(marker(planned, "planned", "switch"));
  if (fraction !== null) parts.push(marker(fraction, "now", "now"));
  parts.push(svg("line", {class: "axis", x1: left, x2: left, y1: top, y2: H - bottom}),
    svg("line", {class: "axis", x1: left, x2: W - right, y1: y(0), y2: y(0)}));
  if (!drawn) {  // a share needs NEW better than OLD on the validation set
    parts.push(svg("text", {class: "tick no-share", x: (left + W - right) / 2, y: y(0.5),
      "text-anchor": "middle"}, "no share of the gain: on the validation set"),
    svg("text", {class: "tick no-share", x: (left + W - right) / 2, y: y(0.5) + 11,
      "text-anchor": "middle"}, "the new version is no better than the old"));
  }
  const chart = svg("svg", {class: "migration-curve", id: `migration-curve-${view.gallery ?? ""}`,
    viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img",
    "aria-label": "share of the gain against the share of the backfill done",
    "data-points": curve.length, "data-lines": drawn, "data-fraction": fraction ?? "",
    "data-switch-at": planned ?? "", "data-switched-at": switched ?? ""}, parts);
  return el("div", {class: "migration-curve-box"}, chart, curveFacts(p));
}

function curveFacts(p) {
  const estimate = isObject(p.share_estimate) ? p.share_estimate : {};
  const now = DIRECTIONS.map(([d]) => {
    const s = shareOf(estimate[d]);
    return s ? `${d} ${pct(s.share)}${s.se !== null ? ` ± ${pct(s.se)}` : ""}` : `${d} –`;
  }).join(", ");
  const routed = isObject(p.routed) ? p.routed : {};
  const route = DIRECTIONS.map(([d]) => `${d} ${pct(shareOf(routed[d])?.share)}`).join(", ");
  let switchText;
  if (isNumber(p.switched_at_fraction)) {
    switchText = `switched at ${pct(p.switched_at_fraction)}` +
      (p.switched_at ? ` (${p.switched_at})` : "");
  } else if (isNumber(p.switch_at)) {
    switchText = p.switch === "progressive" ? `switches at ${pct(p.switch_at)}`
      : `the side beats the route from ${pct(p.switch_at)} (switch: ${p.switch ?? "end"})`;
  } else {
    switchText = "no progressive switch (the side never beats the route on validation)";
  }
  const transform = isObject(p.transform) ? p.transform : {};
  const facts = [
    ["re-embedded", pct(p.fraction)],
    ["transformed", isNumber(p.transformed) ? String(p.transformed) : "–"],
    ["share now", now],
    ["route's share", route],
    ["order", p.order ?? "–"],
    ["map", transform.method ? `${transform.method}` +
      (isNumber(transform.sample) ? `, sample ${transform.sample}` : "") : "–"],
  ];
  return el("div", {class: "curve-facts small"},
    el("dl", {class: "facts"}, facts.map(([k, v]) => [el("dt", {}, k),
      el("dd", {"data-field": k}, v)])),
    el("p", {"data-field": "switch-plan"}, switchText),
    el("p", {class: "legend muted"},
      el("span", {class: "swatch-line swatch-t2i"}), " t2i ",
      el("span", {class: "swatch-line swatch-i2t"}),
      " i2t · dashed: the route · share of the gain on the validation set"));
}

function migrationGate(gate) {
  if (!isObject(gate)) return el("p", {class: "small muted"}, "gate: not run yet");
  const checks = Array.isArray(gate.checks) ? gate.checks : [];
  return el("div", {class: "migration-gate small"}, "gate ", gateBadge(gate),
    checks.map((c) => el("span", {class: "check"}, ` ${c.direction}: migrated ${fmt(c.migrated)}` +
      ` vs routed ${fmt(c.routed)}${c.passed === false ? " ✗" : ""};`)),
    !checks.length && gate.reason ? ` ${gate.reason}` : null);
}

function migrationControls(view, actions, on, form, unreadable) {
  if (!Object.values(actions).some(Boolean)) return null;
  const reason = el("input", {name: "reason", placeholder: "reason (recorded)",
    value: form.reason ?? "", oninput: () => { form.reason = reason.value; }});
  const force = el("input", {type: "checkbox", name: "force",
    onchange: () => { form.force = force.checked; }});
  force.checked = Boolean(form.force);
  const drop = el("input", {type: "checkbox", name: "drop",
    onchange: () => { form.drop = drop.checked; }});
  drop.checked = Boolean(form.drop);
  const button = (action, label, handler, primary = false) => el("button", {type: "button",
    class: primary ? "primary" : "", "data-action": action, onclick: handler}, label);
  const text = () => reason.value.trim() || null;
  return el("div", {class: "swap migration-actions"},
    actions.switch || actions.rollback || actions.keep ? reason : null,
    actions.switch ? el("label", {class: "check"}, force, " force (skip the gate)") : null,
    actions.switch && unreadable.length ? el("label", {class: "check"}, drop,
      ` drop the ${unreadable.length} unreadable item(s)`) : null,
    actions.switch ? button("switch", `Switch to ${view.target?.space ?? "the new side"}`,
      () => on.switch({drop: drop.checked ? unreadable.map((u) => u.id) : [],
        force: force.checked, reason: text()}), true) : null,
    actions.rollback ? button("rollback", `Roll back to ${view.source?.space ?? "the old side"}`,
      () => on.rollback(text())) : null,
    actions.retire ? button("retire", `Retire the ${view.state === "switched"
      ? view.source?.space : view.target?.space} side`, () => on.retire()) : null,
    actions.keep ? button("keep-rerank", "Keep both sides (rerank)",
      () => on.keep("rerank", text())) : null,
    actions.keep ? button("keep-hybrid", "Keep both sides (hybrid)",
      () => on.keep("hybrid", text())) : null,
    actions.pause ? button("pause", "Pause the backfill", () => on.pause()) : null,
    actions.resume ? button("resume", "Resume the backfill", () => on.resume(), true) : null,
    actions.cancel ? button("cancel", view.state === "backfilling" ? "Cancel migration"
      : "Stop the backfill", () => on.cancel()) : null);
}

// ------------------------------------------------------------------ upgrade plans

// PLAN BODY (tests/test_web_form.py runs this function under node)
const PLAN_CONSTRAINTS = ["max_added_latency_ms", "max_negative_flip", "budget",
  "budget_gpu_hours"];

/** The POST /v1/galleries/{gallery}/plans body of the plan form's values (strings, as
 * typed): the candidate version, the objective, and the optional fields that were set, so
 * the server's defaults apply to the rest. A number out of its range is sent as typed: the
 * server's message says what to change (a constraint dropped in silence would let the
 * plan recommend what the person meant to rule out). */
export function planBody(values = {}) {
  const number = (name) => {
    const text = String(values[name] ?? "").trim();
    return text !== "" && Number.isFinite(Number(text)) ? Number(text) : undefined;
  };
  const body = {new: {version: String(values.version ?? "").trim()}};
  const sample = number("sample");
  if (sample !== undefined) body.sample = sample;
  if (["lower", "mean", "t2i", "i2t"].includes(values.objective)) {
    body.objective = values.objective;
  }
  const constraints = Object.fromEntries(PLAN_CONSTRAINTS.map((name) => [name, number(name)])
    .filter(([, value]) => value !== undefined));
  if (Object.keys(constraints).length) body.constraints = constraints;
  return body;
}
// END PLAN BODY

/** ``{share, se}`` of a share of the gain as a plan writes it (``se`` null when absent). */
function gainOf(value) {
  if (!isObject(value) || !isNumber(value.share)) return null;
  return {share: value.share, se: isNumber(value.se) ? value.se : null};
}

const gainText = (g) => (g ? `${pct(g.share)}${g.se !== null ? ` ± ${pct(g.se)}` : ""}` : "–");

/** Bytes as "512 B", "3.1 kB", "12.4 MB", "1.2 GB". */
function bytes(n) {
  if (!isNumber(n)) return "–";
  const units = ["B", "kB", "MB", "GB", "TB"];
  let value = n;
  let unit = 0;
  while (Math.abs(value) >= 1000 && unit < units.length - 1) {
    value /= 1000;
    unit += 1;
  }
  return unit ? `${value.toFixed(1)} ${units[unit]}` : `${value} B`;
}

/** A compute fraction of a full backfill: "0.0031×", "1.62×", "164×". */
function times(fraction) {
  if (!isNumber(fraction)) return "–";
  return `${fraction >= 10 ? fraction.toFixed(0) : Number(fraction.toPrecision(3))}×`;
}

/** The gallery's plans, newest first: status, progress, candidate, whether stale. */
export function plansTable(plans, openId, onOpen) {
  if (!plans.length) return el("p", {class: "muted small"}, "No plans for this gallery yet.");
  const rows = plans.map((p) => el("tr", {"data-plan": p.id,
    class: p.id === openId ? "selected" : ""},
  el("td", {}, el("button", {type: "button", class: "link", onclick: () => onOpen(p.id)},
    String(p.id).slice(0, 12))),
  el("td", {}, p.params?.new?.version ?? p.params?.new?.arch ?? "?"),
  el("td", {class: "plan-status"}, statusBadge(p.status),
    p.stale?.length ? badge("stale", "forced") : null),
  el("td", {}, isActive(p) ? progressOf(p) : (p.plan?.recommendation?.option ?? "")),
  el("td", {class: "small muted"}, ago(p.created_at))));
  return el("table", {class: "data plans"},
    el("thead", {}, el("tr", {}, ["plan", "candidate", "status", "progress / recommended",
      "started"].map((h) => el("th", {}, h)))),
    el("tbody", {}, rows));
}

/** One plan: what it measured, its progress while it runs, then the recommendation and
 * why, why it is stale (if it is), the chart, the table of options with an Apply button
 * per applicable option, and what was applied. ``on.apply(option, {force, reason})``;
 * ``form`` keeps the force and reason typed in across redraws. */
export function planPanel(view, on, form = {}) {
  const plan = isObject(view.plan) ? view.plan : null;
  const params = isObject(view.params) ? view.params : {};
  const stale = Array.isArray(view.stale) ? view.stale : [];
  return el("div", {class: "plan panel-inner", "data-plan": view.id},
    el("h3", {}, `Plan ${view.id} `, statusBadge(view.status),
      stale.length ? badge("stale", "forced") : null),
    el("p", {class: "small muted"},
      `candidate ${params.new?.version ?? params.new?.arch ?? "?"} · objective ` +
      `${params.objective ?? "lower"} · sample ${params.sample ?? "default"} · started ` +
      `${ago(view.created_at)}${view.ended_at ? ` · ended ${ago(view.ended_at)}` : ""}`),
    isActive(view) ? progressOf(view) : null,
    view.error ? el("pre", {class: "raw bad-text"}, view.error) : null,
    stale.length ? el("div", {class: "plan-stale bad-text small", "data-field": "stale"},
      el("strong", {}, "Stale: "), "this plan no longer describes the gallery. ",
      el("ul", {}, stale.map((reason) => el("li", {}, reason)))) : null,
    plan ? [recommendation(plan), planChart(plan), planApply(view, stale, form),
      planTable(plan, view.status === "succeeded" ? on.apply : null, stale, form),
      planFacts(plan)] : null,
    appliedList(view.applied));
}

function recommendation(plan) {
  const rec = isObject(plan.recommendation) ? plan.recommendation : {};
  const set = Object.entries(isObject(rec.constraints) ? rec.constraints : {})
    .filter(([, v]) => v !== null && v !== undefined).map(([k, v]) => `${k} ${fmt(v)}`);
  return el("div", {class: "plan-recommendation", "data-option": rec.option ?? ""},
    el("p", {}, el("strong", {}, "Recommended: "),
      rec.option ? el("code", {}, rec.option) : el("span", {class: "muted"}, "none")),
    el("p", {class: "small", "data-field": "why"}, rec.why ?? ""),
    el("p", {class: "small muted"}, `constraints: ${set.length ? set.join(", ") : "none"}` +
      ` · objective ${plan.objective ?? "lower"}`),
    rec.rule ? el("details", {class: "small muted"}, el("summary", {}, "the rule"), rec.rule)
      : null);
}

/** Force and reason, shown only when the plan is stale (the API refuses it otherwise). */
function planApply(view, stale, form) {
  if (!stale.length || view.status !== "succeeded") return null;
  const force = el("input", {type: "checkbox", name: "force",
    onchange: () => { form.force = force.checked; }});
  force.checked = Boolean(form.force);
  const reason = el("input", {name: "reason", placeholder: "reason (recorded)",
    value: form.reason ?? "", oninput: () => { form.reason = reason.value; }});
  return el("div", {class: "swap plan-force"},
    el("label", {class: "check"}, force, " force (apply the stale plan)"), reason);
}

const OPTION_COLUMNS = ["option", "share t2i", "share i2t", "negative flip", "added ms",
  "compute", "storage", "why not", ""];

/** The options: share of the gain per direction (± its standard error), negative flip,
 * added query latency, compute, storage, why it was not chosen; Apply where applicable
 * (``apply`` null: the plan is not finished). */
function planTable(plan, apply, stale, form) {
  const options = Array.isArray(plan.options) ? plan.options.filter(isObject) : [];
  const onApply = apply && ((name) => apply(name, {force: stale.length > 0 && Boolean(form.force),
    reason: String(form.reason ?? "").trim() || null}));
  return el("div", {class: "table-scroll"}, el("table", {class: "data plan-options"},
    el("thead", {}, el("tr", {}, OPTION_COLUMNS.map((h) => el("th", {}, h)))),
    el("tbody", {}, options.map((o) => optionRow(o, onApply)))));
}

/** ["t2i 1.5%", "i2t 0.0%"] of a per-direction value. */
const perDirection = (v, format) => (isObject(v) ? DIRECTIONS.filter(([d]) => d in v)
  .map(([d]) => `${d} ${format(v[d])}`) : []);

/** A cell's parts one under the other: the columns stay narrow enough for the table,
 * its Apply column included, to fit a laptop screen (1366 px) without scrolling. */
const stacked = (parts) => (parts.length ? parts.map((part) => el("div", {}, part)) : "–");

function optionRow(o, onApply) {
  const latency = o.added_latency_ms;
  const storage = isObject(o.storage) && Object.keys(o.storage).length ? o.storage : null;
  return el("tr", {"data-option": o.name, class: o.recommended ? "recommended" : ""},
    el("td", {}, el("code", {}, o.name), o.recommended ? badge("recommended", "ok") : null,
      o.measured ? null : badge("estimated", "none"),
      el("div", {class: "small muted"}, o.label ?? "")),
    DIRECTIONS.map(([d]) => el("td", {class: "num", "data-field": `share-${d}`},
      gainText(gainOf(o.share?.[d])))),
    el("td", {class: "num small"}, stacked(perDirection(o.negative_flip, pct))),
    el("td", {class: "num small"}, isObject(latency)
      ? stacked([`text ${fmt(latency.text)}`, `image ${fmt(latency.image)}`]) : "–"),
    el("td", {class: "num", title: `${fmt(o.compute?.seconds)} s`}, times(o.compute?.fraction),
      el("div", {class: "small muted"}, duration(o.compute?.seconds))),
    el("td", {class: "num small"}, storage ? stacked([`gallery ${bytes(storage.gallery_bytes)}`,
      `model ${bytes(storage.model_bytes)}`]) : "–"),
    el("td", {class: "small"}, o.why_not ?? "",
      o.note ? el("div", {class: "muted"}, o.note) : null,
      isObject(o.end) ? el("div", {class: o.end.native_below_kept ? "bad-text" : "muted",
        "data-field": "end"}, `at the end: native ${DIRECTIONS.map(([d]) =>
        gainText(gainOf(o.end.native?.[d]))).join(" / ")}, both sides kept ` +
        `${DIRECTIONS.map(([d]) => gainText(gainOf(o.end.kept?.[d]))).join(" / ")}` +
        (o.end.native_below_kept ? " (the native side is below: the switch asks you)" : ""))
        : null,
      isObject(o.warm) ? el("div", {class: "muted", "data-field": "warm"},
        `warm (80% of searches) on your last ${o.warm.searches} searches: read-through ` +
        `alone at ${pct(o.warm.read_through?.warm_80_at_filled)} of the gallery filled, ` +
        `with the backfill in candidate order at ` +
        `${(o.warm.candidates ?? []).map((c) => pct(c.warm_80_at_filled)).join(" / ")}` +
        (o.apply?.params?.order === "candidates" ? " (applied with it)" : "")) : null),
    el("td", {class: "actions"}, onApply && o.applicable ? el("button", {type: "button",
      class: o.recommended ? "primary" : "", "data-action": "apply", "data-option": o.name,
      onclick: () => onApply(o.name)}, "Apply") : null));
}

function planFacts(plan) {
  const backfill = isObject(plan.backfill) ? plan.backfill : {};
  const base = isObject(plan.baseline) ? plan.baseline : {};
  const r1 = (v) => (isObject(v) ? DIRECTIONS.map(([d]) => `${d} ${fmt(v[d])}`).join(", ")
    : "–");
  return el("dl", {class: "facts plan-facts small"}, [
    ["full backfill", `${fmt(backfill.items)} items at ${fmt(backfill.items_per_s)} items/s: ` +
      `${duration(backfill.seconds)}`],
    ["R@1 old → old", r1(base["old->old"])], ["R@1 new → new", r1(base["new->new"])],
    ["sample", `${fmt(plan.sample?.items)} items`],
    ["validation", `${fmt(plan.validation?.items)} items`],
  ].map(([k, v]) => [el("dt", {}, k), el("dd", {"data-field": k}, v)]));
}

function appliedList(applied) {
  if (!Array.isArray(applied) || !applied.length) return null;
  return el("div", {class: "plan-applied small"}, el("h4", {}, "Applied"),
    el("ul", {}, applied.map((a) => el("li", {"data-option": a.option},
      el("code", {}, a.option), ` → ${a.kind ?? "job"} job ${a.job} by ${a.by}, ${ago(a.at)}`,
      a.forced ? [" ", badge("forced", "forced"), a.reason ? ` — ${a.reason}` : ""] : null))));
}

// ------------------------------------------------------------------ plan chart

const COMPUTE_FLOOR = 1e-4;  // a compute fraction below (0 too) is drawn at this floor
const SHAPES = {t2i: "circle", i2t: "square"};

/** Ticks of a log axis from 10^logLo to 10^logHi: the decades inside (1e-4, 0.001, ...
 * 1, 10, ...), with 2 and 5 times each when fewer than two decades fall inside. */
function logTicks(logLo, logHi) {
  const inside = (v) => Math.log10(v) >= logLo - 1e-9 && Math.log10(v) <= logHi + 1e-9;
  const steps = [];
  for (let e = Math.floor(logLo); e <= Math.ceil(logHi); e += 1) steps.push(e);
  const decadesIn = steps.map((e) => 10 ** e).filter(inside);
  if (decadesIn.length >= 2) return decadesIn;
  return steps.flatMap((e) => [1, 2, 5].map((m) => m * 10 ** e)).filter(inside);
}

const tickText = (v) => (v >= 1e-3 && v < 1e5 ? String(Number(v.toPrecision(1)))
  : v.toExponential(0));

/** The measured points of the chart: per option and direction, its share of the gain at
 * its compute; the migration's curve per direction. */
function chartData(plan) {
  const options = Array.isArray(plan.options) ? plan.options.filter(isObject) : [];
  const markers = [];
  for (const o of options) {
    if (!o.measured || !isNumber(o.compute?.fraction)) continue;
    for (const [d] of DIRECTIONS) {
      const gain = gainOf(o.share?.[d]);
      if (gain) markers.push({option: o, direction: d, x: o.compute.fraction, ...gain});
    }
  }
  const curve = isObject(plan.curve) && Array.isArray(plan.curve.points)
    ? plan.curve.points.filter((p) => isObject(p) && isNumber(p.compute)) : [];
  const lines = DIRECTIONS.map(([d]) => [d, curve.map((p) => [p.compute, gainOf(p[d])])
    .filter(([, g]) => g !== null)]).filter(([, points]) => points.length);
  return {markers, lines};
}

const PLAN_BOX = {W: 520, H: 250, left: 44, right: 14, top: 12, bottom: 34};

/** The chart's scales: x the log of compute (padded off the axes, a full backfill always
 * in view), y the share of the gain (0 to 100% always in view, error bars included). */
function planScale(markers, lines, box = PLAN_BOX) {
  const xs = [...markers.map((m) => m.x), ...lines.flatMap(([, ps]) => ps.map(([c]) => c)), 1]
    .map((c) => Math.log10(Math.max(COMPUTE_FLOOR, c)));
  const pad = Math.max(0.15, 0.04 * (Math.max(...xs) - Math.min(...xs)));
  const logLo = Math.min(...xs) - pad;
  const logHi = Math.max(...xs) + pad;
  const ys = [...markers.flatMap((m) => [m.share - (m.se ?? 0), m.share + (m.se ?? 0)]),
    ...lines.flatMap(([, ps]) => ps.map(([, g]) => g.share)), 0, 1];
  const yLo = Math.max(-1, Math.floor(Math.min(...ys) * 4) / 4);
  const yHi = Math.min(2, Math.ceil(Math.max(...ys) * 4) / 4);
  const {W, H, left, right, top, bottom} = box;
  return {logLo, logHi, yLo, yHi,
    x: (c) => left + (Math.log10(Math.max(COMPUTE_FLOOR, c)) - logLo) / (logHi - logLo) *
      (W - left - right),
    y: (v) => top + (1 - (Math.min(yHi, Math.max(yLo, v)) - yLo) / (yHi - yLo)) *
      (H - top - bottom)};
}

/** Grid, ticks, axis titles, the axes and a dashed line at one full backfill. */
function planAxes({x, y, logLo, logHi, yLo, yHi}, box = PLAN_BOX) {
  const {W, H, left, right, top, bottom} = box;
  const parts = [];
  for (let v = yLo; v <= yHi + 1e-9; v += yHi - yLo > 1.5 ? 0.5 : 0.25) {
    parts.push(svg("line", {class: "grid", x1: left, x2: W - right, y1: y(v), y2: y(v)}),
      svg("text", {class: "tick", x: left - 4, y: y(v) + 3, "text-anchor": "end"},
        `${Math.round(v * 100)}%`));
  }
  for (const c of logTicks(logLo, logHi)) {
    parts.push(svg("line", {class: "grid", x1: x(c), x2: x(c), y1: top, y2: H - bottom}),
      svg("text", {class: "tick", x: x(c), y: H - bottom + 12, "text-anchor": "middle"},
        tickText(c)));
  }
  return [...parts,
    svg("line", {class: "backfill-line", x1: x(1), x2: x(1), y1: top, y2: H - bottom},
      svg("title", {}, "a full backfill")),
    svg("text", {class: "tick", x: (left + W - right) / 2, y: H - 4, "text-anchor": "middle"},
      "compute, × a full backfill (log scale)"),
    svg("text", {class: "tick", x: 0, y: 0, "text-anchor": "middle",
      transform: `translate(10 ${(top + H - bottom) / 2}) rotate(-90)`}, "share of the gain"),
    svg("line", {class: "axis", x1: left, x2: left, y1: top, y2: H - bottom}),
    svg("line", {class: "axis", x1: left, x2: W - right, y1: y(0), y2: y(0)})];
}

/** Share of the gain (y) against compute as a fraction of a full backfill (x, log): a
 * marker per measured option and direction (t2i a circle, i2t a square) with its error
 * bar, the recommended option ringed, and the migration's curve as it backfills. */
export function planChart(plan) {
  const {markers, lines} = chartData(plan);
  const {W, H, left, right} = PLAN_BOX;
  const scale = planScale(markers, lines);
  const {x, y} = scale;
  const option = isObject(plan.curve) ? plan.curve.option : null;
  const curves = lines.map(([d, points]) => svg("polyline", {class: `plan-curve curve-${d}`,
    "data-direction": d, "data-option": option, "data-points": points.length, fill: "none",
    points: points.map(([c, g]) => `${x(c).toFixed(1)},${y(g.share).toFixed(1)}`).join(" ")},
  svg("title", {}, `${option}: ${d} share of the gain as the backfill goes`)));
  const empty = markers.length ? null : svg("text", {class: "tick no-share",
    x: (left + W - right) / 2, y: y(0.5), "text-anchor": "middle"},
  "no share of the gain to draw: see the recommendation");
  const chart = svg("svg", {class: "plan-chart", viewBox: `0 0 ${W} ${H}`, width: W,
    height: H, role: "img", "aria-label": "share of the gain against compute",
    "data-markers": markers.length, "data-lines": lines.length},
  planAxes(scale), curves, markers.map((m) => planMarker(m, x, y, W)), empty);
  return el("div", {class: "plan-chart-box"}, chart, planLegend(option));
}

/** One option's marker in one direction; ``width``: the chart's (a label near its right
 * edge goes on the marker's left). */
function planMarker(m, x, y, width) {
  const cx = x(m.x);
  const cy = y(m.share);
  const flip = cx > 0.8 * width;
  const rec = Boolean(m.option.recommended);
  const shape = SHAPES[m.direction] === "circle"
    ? svg("circle", {class: "dot", cx, cy, r: 4})
    : svg("rect", {class: "dot", x: cx - 3.5, y: cy - 3.5, width: 7, height: 7});
  return svg("g", {class: `option-marker marker-${m.direction}`, "data-option": m.option.name,
    "data-direction": m.direction, "data-recommended": rec ? "true" : null,
    "data-share": m.share, "data-compute": m.x},
  m.se ? svg("line", {class: "error-bar", x1: cx, x2: cx, y1: y(m.share - m.se),
    y2: y(m.share + m.se)}) : null,
  shape,
  rec ? svg("circle", {class: "ring", cx, cy, r: 8}) : null,
  rec && m.direction === "t2i" ? svg("text", {class: "rec-label", x: flip ? cx - 10 : cx + 10,
    y: cy < 20 ? cy + 16 : cy - 8, "text-anchor": flip ? "end" : "start"}, "recommended")
    : null,
  svg("title", {}, `${m.option.name} · ${m.direction}: share ${gainText(m)} at compute ` +
    `${times(m.x)} a full backfill${m.x < COMPUTE_FLOOR ? " (drawn at the floor)" : ""}` +
    `${rec ? " · recommended" : ""}`));
}

function planLegend(option) {
  return el("p", {class: "legend small muted plan-legend"},
    el("span", {class: "swatch-dot swatch-t2i"}), " t2i ",
    el("span", {class: "swatch-square swatch-i2t"}), " i2t · bars: ± standard error · ",
    el("span", {class: "swatch-ring"}), " recommended",
    option ? [" · lines: ", el("code", {}, option), " as it backfills"] : null);
}
