// The gateway's page: search, models (lineage, gate reports, promote / roll back, gallery
// migrations, upgrade plans) and jobs.
// Plain ES2020 module, no build step: it talks to the same JSON API as any client, with
// the API key the person typed (kept in sessionStorage, so it goes away with the tab).

import {
  ago, el, fmt, forcedList, galleriesTable, gateBadge, gateOf, gateReport, gateReports, isActive,
  lineageTree, migrationPanel, planBody, planPanel, plansTable, progressOf, statusBadge,
  versionFacts, versionGateBadge,
} from "./views.js";

const KEY_STORE = "nobackfill.apiKey";
const GALLERY_STORE = "nobackfill.gallery";
const POLL_MS = 1500;
const $ = (id) => document.getElementById(id);

const state = {
  tab: "search",
  galleries: [],
  versions: [],
  jobs: [],
  selected: null,   // version shown in the models detail panel
  openJob: null,    // job shown in the jobs detail panel
  migrations: {},   // gallery -> GET .../migration, for galleries with an open migration
  migrationForms: {},  // gallery -> {reason, force, drop} typed in its panel
  migrateForms: {},   // gallery -> {transform, order, switch, sample} of a new migration
  swapForms: {},    // version -> {gallery, reason, force} typed in its promote form
  plans: [],        // GET .../plans of the plan panel's gallery
  planGallery: null,  // the gallery the plan panel shows
  openPlan: null,   // plan shown in detail (default: the newest)
  planForms: {},    // plan id -> {force, reason} typed in its panel
  shown: {galleries: "", migrations: "", plans: ""},  // what was last drawn (redraw on change)
  pollTimer: null,
  planTimer: null,  // the plan panel's poll, while one of its plans runs
  planLoad: 0,      // bumped per load of the plans (a newer one wins)
  pollRun: 0,       // bumped on every stop, so a poll still in flight does not re-arm
  blobs: [],        // object URLs of thumbnails fetched with a key, revoked on re-render
};

// ------------------------------------------------------------------ API

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

const apiKey = () => sessionStorage.getItem(KEY_STORE) || "";

/** Call the gateway; a non-2xx answer throws with the server's error message. */
async function api(path, {method = "GET", json, form} = {}) {
  const headers = {};
  if (apiKey()) headers["X-API-Key"] = apiKey();
  let body;
  if (json !== undefined) {
    headers["Content-Type"] = "application/json";
    body = JSON.stringify(json);
  } else if (form) {
    body = form;
  }
  const response = await fetch(path, {method, headers, body});
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = null;
  }
  if (!response.ok) {
    const err = data && data.error;
    throw new ApiError(response.status, err?.code ?? "http_error",
      err?.message ?? `${response.status} ${response.statusText}`);
  }
  return data;
}

const enc = encodeURIComponent;

function setStatus(id, message, kind = "") {
  const node = $(id);
  node.textContent = message || "";
  node.className = `status ${kind}`;
}

/** Run an async action and show its error (the server's message) in a status line. */
async function guarded(statusId, action) {
  try {
    return await action();
  } catch (error) {
    setStatus(statusId, error.message || String(error), "error");
    return undefined;
  }
}

// ------------------------------------------------------------------ key and tabs

function showKeyState() {
  $("key-state").textContent = apiKey() ? "key set" : "no key";
  $("api-key").value = "";
  $("api-key").placeholder = apiKey() ? "•••••• (set)" : "admin or read key";
}

function setupKey() {
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const key = $("api-key").value.trim();
    if (key) sessionStorage.setItem(KEY_STORE, key);
    showKeyState();
    refreshAll();
  });
  $("key-clear").addEventListener("click", () => {
    sessionStorage.removeItem(KEY_STORE);
    showKeyState();
    refreshAll();
  });
  showKeyState();
}

function showTab(name) {
  state.tab = ["search", "models", "jobs"].includes(name) ? name : "search";
  for (const section of document.querySelectorAll(".tab")) {
    section.hidden = section.id !== `tab-${state.tab}`;
  }
  for (const link of document.querySelectorAll("nav a")) {
    link.classList.toggle("current", link.dataset.tab === state.tab);
  }
  stopPolling();
  if (state.tab === "models") loadModels();
  if (state.tab === "jobs") startPolling();
}

function refreshAll() {
  loadGalleries();
  showTab(state.tab);
}

/** Galleries for the pickers: the admin list, or for a read key the names /readyz gives
 * it. Without a key the page learns none (names are not public): the person types one. */
async function loadGalleries() {
  if (!apiKey()) return;
  let options;
  try {
    state.galleries = await api("/v1/galleries");
    options = state.galleries.map((g) => [g.name,
      `${g.name} (space ${g.space}, active ${g.active})`]);
  } catch {
    try {  // a read key cannot list galleries, but readiness names them to any key
      const ready = await api("/readyz");
      options = Object.entries(ready?.galleries ?? {}).map(([name, version]) =>
        [name, `${name} (served by ${version})`]);
    } catch {
      return;  // the text box still works
    }
  }
  $("gallery-options").replaceChildren(...options.map(([name, label]) =>
    el("option", {value: name}, label)));
  const names = options.map(([name]) => name);
  preselectGallery($("gallery"), names);
  preselectGallery($("job-form").elements.gallery, names);
}

/** Put the first known gallery into an empty picker, or into one holding a name the page
 * remembered that no longer exists; never over a name the person typed. */
function preselectGallery(input, names) {
  if (!names.length || names.includes(input.value)) return;
  if (!input.value || !input.dataset.typed) input.value = names[0];
}

/** Mark a picker as typed into by the person (preselection then leaves it alone). */
function trackTyping(input) {
  input.addEventListener("input", () => { input.dataset.typed = "1"; });
}

// ------------------------------------------------------------------ search

function setupSearch() {
  const input = $("gallery");
  input.value = localStorage.getItem(GALLERY_STORE) || "";
  trackTyping(input);
  $("search-form").addEventListener("submit", (event) => {
    event.preventDefault();
    runSearch();
  });
  $("query-image").addEventListener("change", () => {
    if ($("query-image").files.length) {
      $("query-text").value = "";
      runSearch();
    }
    showPreview();
  });
  $("query-text").addEventListener("input", () => {
    if ($("query-text").value && $("query-image").files.length) clearImage();
  });
  $("query-image-clear").addEventListener("click", clearImage);
  setupDrop($("search-form"));
}

function clearImage() {
  $("query-image").value = "";
  showPreview();
}

function showPreview() {
  const file = $("query-image").files[0];
  const preview = $("query-preview");
  if (preview.src.startsWith("blob:")) URL.revokeObjectURL(preview.src);
  preview.hidden = !file;
  $("query-image-clear").hidden = !file;
  preview.src = file ? URL.createObjectURL(file) : "";
}

/** Dropping an image file on the search form searches with it. */
function setupDrop(zone) {
  zone.addEventListener("dragover", (event) => {
    event.preventDefault();
    zone.classList.add("dropping");
  });
  zone.addEventListener("dragleave", () => zone.classList.remove("dropping"));
  zone.addEventListener("drop", (event) => {
    event.preventDefault();
    zone.classList.remove("dropping");
    const files = event.dataTransfer?.files;
    if (!files || !files.length) return;
    const transfer = new DataTransfer();
    transfer.items.add(files[0]);
    $("query-image").files = transfer.files;
    $("query-image").dispatchEvent(new Event("change"));
  });
}

/** The request of the form: multipart with the image file, or JSON with the text. */
function searchRequest() {
  const file = $("query-image").files[0];
  const topK = Number.parseInt($("top-k").value, 10) || 10;
  const kind = $("kind").value;
  if (file) {
    const form = new FormData();
    form.append("image", file, file.name);
    form.append("top_k", String(topK));
    form.append("kind", kind);
    return {form};
  }
  const text = $("query-text").value.trim();
  if (!text) throw new Error("Type a text or choose an image to search with.");
  return {json: {text, top_k: topK, kind}};
}

async function runSearch() {
  const gallery = $("gallery").value.trim();
  if (!gallery) {
    setStatus("search-status", "Pick or type a gallery name.", "error");
    return;
  }
  localStorage.setItem(GALLERY_STORE, gallery);
  setStatus("search-status", "Searching…");
  await guarded("search-status", async () => {
    const request = searchRequest();
    const started = performance.now();
    const answer = await api(`/v1/galleries/${enc(gallery)}/search`,
      {method: "POST", ...request});
    const ms = performance.now() - started;
    setStatus("search-status", "");
    renderAnswer(answer, ms);
  });
}

function renderAnswer(answer, ms) {
  const pair = (label, value) => el("span", {class: "pair"}, el("span", {class: "muted"}, label),
    " ", el("strong", {"data-field": label}, value ?? "?"));
  $("search-meta").replaceChildren(
    pair("gallery", answer.gallery), pair("version", answer.version),
    pair("route", answer.route), pair("space", answer.space), pair("kind", answer.kind),
    answer.reranked ? el("span", {class: "pair", "data-field": "reranked"},
      `reranked by the new model: top ${answer.reranked.k} of the route, ` +
      `${answer.reranked.read} read, ${answer.reranked.embedded} embedded now` +
      (answer.reranked.kept_route_place.length
        ? `, ${answer.reranked.kept_route_place.length} kept the route's place` : "")) : null,
    el("span", {class: "muted"}, `${answer.hits.length} hits in ${Math.round(ms)} ms`));
  for (const url of state.blobs) URL.revokeObjectURL(url);
  state.blobs = [];
  const cards = answer.hits.map((hit, rank) => hitCard(answer, hit, rank));
  $("results").replaceChildren(...(cards.length ? cards
    : [el("p", {class: "muted"}, "No hits: the gallery has no items of this kind.")]));
}

function hitCard(answer, hit, rank) {
  const img = el("img", {class: "thumb", alt: hit.id, width: 96, height: 96, loading: "lazy"});
  loadThumbnail(img, `/v1/galleries/${enc(answer.gallery)}/items/${enc(hit.id)}/thumbnail`);
  const payload = Object.entries(hit.payload || {}).slice(0, 3)
    .map(([k, v]) => el("div", {class: "small muted ellipsis"}, `${k}: ${fmt(v)}`));
  return el("figure", {class: "card", "data-id": hit.id},
    el("div", {class: "thumb-box"}, img),
    el("figcaption", {},
      el("div", {class: "score"}, el("span", {class: "muted small"}, `#${rank + 1}`),
        " ", hit.score.toFixed(4)),
      el("div", {class: "ellipsis", title: hit.id}, hit.id),
      hit.version !== answer.version
        ? el("div", {class: "small muted"}, `embedded by ${hit.version}`) : null,
      payload));
}

/** Plain src when no key is needed; with a key, fetch it (img tags cannot send headers). */
async function loadThumbnail(img, url) {
  const missing = () => img.closest(".thumb-box")?.classList.add("missing");
  img.addEventListener("error", missing);
  if (!apiKey()) {
    img.src = url;
    return;
  }
  try {
    const response = await fetch(url, {headers: {"X-API-Key": apiKey()}});
    if (!response.ok) throw new Error(String(response.status));
    const blobUrl = URL.createObjectURL(await response.blob());
    state.blobs.push(blobUrl);
    img.src = blobUrl;
  } catch {
    missing();
  }
}

// ------------------------------------------------------------------ models

/** Versions and galleries; ``quiet`` keeps the status line (e.g. "v2 now serves ..."). */
async function loadModels(quiet = false) {
  if (!apiKey()) {
    setStatus("models-status", "Models and jobs are admin views: enter an admin key above.",
      "error");
    return;
  }
  if (!quiet) setStatus("models-status", "Loading…");
  await guarded("models-status", async () => {
    const [versions, galleries] = await Promise.all([api("/v1/models"), api("/v1/galleries")]);
    state.versions = versions;
    state.galleries = galleries;
    state.migrations = await loadMigrations(galleries);
    if (!state.selected || !versions.some((v) => v.version_id === state.selected)) {
      state.selected = galleries[0]?.active ?? versions[0]?.version_id ?? null;
    }
    if (!quiet) setStatus("models-status", "");
    renderModels();
  });
  pollMigrations();
  await loadPlans();
}

/** GET .../migration of every gallery that has one open (404: it ended meanwhile). */
async function loadMigrations(galleries) {
  const open = galleries.filter((g) => g.migration);
  const views = await Promise.all(open.map((g) =>
    api(`/v1/galleries/${enc(g.name)}/migration`).catch((error) => {
      if (error.status === 404) return null;
      throw error;
    })));
  const out = {};
  open.forEach((g, n) => {
    if (views[n]) out[g.name] = views[n];
  });
  return out;
}

/** A migration whose numbers still move: backfilling, or switched progressively while
 * its job goes on backfilling. */
const JOB_GOING = new Set(["queued", "running", "applying"]);
const moving = (m) => m.state === "backfilling" ||
  (m.state === "switched" && JOB_GOING.has(m.job_status));

/** While a migration backfills, redraw the galleries and migrations every POLL_MS (the
 * rest of the models tab, where a person may be typing, stays as it is). */
function pollMigrations() {
  clearTimeout(state.pollTimer);
  const backfilling = Object.values(state.migrations).some(moving);
  if (state.tab !== "models" || !backfilling) return;
  const run = state.pollRun;
  state.pollTimer = setTimeout(async () => {
    if (run !== state.pollRun) return;
    if (!document.hidden) {
      try {
        const galleries = await api("/v1/galleries");
        const migrations = await loadMigrations(galleries);
        if (run !== state.pollRun) return;
        state.galleries = galleries;
        state.migrations = migrations;
        renderGalleries();
      } catch (error) {
        setStatus("models-status", error.message || String(error), "error");
      }
    }
    if (run === state.pollRun) pollMigrations();
  }, POLL_MS);
}

function renderModels() {
  state.shown = {galleries: "", migrations: "", plans: ""};
  renderGalleries();
  $("lineage").replaceChildren(lineageTree(state.versions, state.galleries, state.selected,
    (id) => {
      state.selected = id;
      renderModels();
    }));
  $("version-options").replaceChildren(...state.versions.map((v) =>
    el("option", {value: v.version_id})));
  renderPlanGalleries();
  const version = state.versions.find((v) => v.version_id === state.selected);
  $("version-detail").replaceChildren(version ? versionDetail(version)
    : el("p", {class: "muted"}, "Pick a version."));
}

/** The galleries table and a panel per open migration; each redrawn only when its data
 * changed, so a reason typed into a migration panel is not lost to a poll. */
function renderGalleries() {
  const spaces = state.versions.map((v) => [v.version_id, v.space]);
  const tableKey = JSON.stringify([state.galleries, spaces]);
  if (tableKey !== state.shown.galleries) {
    state.shown.galleries = tableKey;
    $("galleries").replaceChildren(galleriesTable(state.galleries,
      {versions: state.versions, onMigrate: startMigration, migrateForms: state.migrateForms}));
  }
  const migrationsKey = JSON.stringify(state.migrations);
  if (migrationsKey !== state.shown.migrations) {
    state.shown.migrations = migrationsKey;
    $("migrations").replaceChildren(...Object.values(state.migrations).map((view) => {
      if (!state.migrationForms[view.gallery]) state.migrationForms[view.gallery] = {};
      const form = state.migrationForms[view.gallery];
      return migrationPanel(view, migrationCalls(view), form);
    }));
  }
}

function migrationPath(gallery, action = "") {
  return `/v1/galleries/${enc(gallery)}/migration${action ? `/${action}` : ""}`;
}

/** Start a migration of the gallery into its active version's native space, with the
 * options of its row (``migrationBody``: only what was set). */
async function startMigration(gallery, body = {}) {
  setStatus("models-status", `Starting the migration of ${gallery}…`);
  await guarded("models-status", async () => {
    const job = await api(migrationPath(gallery), {method: "POST", json: body});
    delete state.migrateForms[gallery];
    setStatus("models-status", `Started migration job ${job.id} of ${gallery}.`, "ok");
  });
  await loadModels(true);
}

/** The operator calls of one migration panel; each shows the server's answer. */
function migrationCalls(view) {
  const gallery = view.gallery;
  const call = async (action, request, done) => {
    await guarded("models-status", async () => {
      const answer = await api(request.path, request);
      delete state.migrationForms[gallery];
      setStatus("models-status", done(answer), "ok");
    });
    await loadModels(true);
  };
  return {
    switch: (body) => call("switch", {path: migrationPath(gallery, "switch"), method: "POST",
      json: body}, (m) => `${gallery} now answers in space ${m.serving_space} (switched).`),
    rollback: (reason) => call("rollback", {path: migrationPath(gallery, "rollback"),
      method: "POST", json: {reason}},
    (m) => `${gallery} answers in space ${m.serving_space} again (rolled back).`),
    retire: () => call("retire", {path: migrationPath(gallery, "retire"), method: "POST"},
      (r) => `Retired: the ${r.dropped.space} side of ${gallery} was deleted; it stays in ` +
        `space ${r.space}.`),
    cancel: () => call("cancel", {path: migrationPath(gallery, "cancel"), method: "POST"},
      () => view.state === "backfilling"
        ? `Asked migration job ${view.job} to stop; its new side is dropped.`
        : `Asked migration job ${view.job} to stop; the sides stay (resume it later).`),
    pause: () => call("pause", {path: migrationPath(gallery, "pause"), method: "POST"},
      () => `The backfill of ${gallery} is paused: each shard stops at its cursor (reranked ` +
        `searches still fill the new side).`),
    keep: (mode, reason) => call("keep", {path: migrationPath(gallery, "keep"),
      method: "POST", json: {mode, reason}},
    (m) => `${gallery} keeps both sides, searches ranked by ${m.serving}.`),
    resume: () => call("resume", {path: migrationPath(gallery, "resume"), method: "POST"},
      (m) => view.progress?.paused
        ? `The backfill of ${gallery} goes on from where each shard paused.`
        : `The backfill of ${gallery} goes on (${m.result?.resumed_items ?? "?"} item(s) ` +
          `left to re-embed).`),
  };
}

// ------------------------------------------------------------------ upgrade plans

function setupPlans() {
  const form = $("plan-form");
  form.elements.gallery.addEventListener("change", () => {
    state.planGallery = form.elements.gallery.value;
    state.openPlan = null;
    loadPlans();
  });
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    startPlan(form);
  });
}

const plansPath = (gallery, rest = "") => `/v1/galleries/${enc(gallery)}/plans${rest}`;

/** The plan form's gallery picker: the one picked stays; else the search's gallery, else
 * the first. */
function renderPlanGalleries() {
  const names = state.galleries.map((g) => g.name);
  if (!names.includes(state.planGallery)) {
    state.planGallery = names.includes($("gallery").value) ? $("gallery").value
      : (names[0] ?? null);
  }
  const select = $("plan-form").elements.gallery;
  select.replaceChildren(...state.galleries.map((g) => el("option", {value: g.name},
    `${g.name} (active ${g.active})`)));
  select.value = state.planGallery ?? "";
}

/** The plans of the panel's gallery, drawn; polled every POLL_MS while one of them is
 * queued or running (the newest load wins: an older answer is dropped; an error is shown
 * and the poll goes on). */
async function loadPlans() {
  clearTimeout(state.planTimer);
  const gallery = state.planGallery;
  const run = state.pollRun;
  state.planLoad += 1;
  const load = state.planLoad;
  let plans = null;
  try {
    plans = gallery ? await api(plansPath(gallery)) : [];
  } catch (error) {
    setStatus("plan-status", error.message || String(error), "error");
  }
  if (load !== state.planLoad || run !== state.pollRun) return;
  if (plans) {
    state.plans = plans;
    renderPlans();
  }
  pollPlans(run);
}

function pollPlans(run) {
  if (run !== state.pollRun || state.tab !== "models" || !state.plans.some(isActive)) return;
  state.planTimer = setTimeout(() => (document.hidden ? pollPlans(run) : loadPlans()),
    POLL_MS);
}

/** The list and the open plan (the newest unless one was picked); redrawn only when they
 * changed, so a force or reason typed into the plan is not lost to a poll. */
function renderPlans() {
  const plans = state.plans;
  if (!plans.some((p) => p.id === state.openPlan)) state.openPlan = plans[0]?.id ?? null;
  const key = JSON.stringify([state.planGallery, state.openPlan, plans]);
  if (key === state.shown.plans) return;
  state.shown.plans = key;
  $("plans").replaceChildren(plansTable(plans, state.openPlan, (id) => {
    state.openPlan = id;
    renderPlans();
  }));
  const open = plans.find((p) => p.id === state.openPlan);
  if (open && !state.planForms[open.id]) state.planForms[open.id] = {};
  $("plan-detail").replaceChildren(...(open ? [planPanel(open,
    {apply: (option, how) => applyPlan(open, option, how)}, state.planForms[open.id])] : []));
}

/** POST a plan of the form's gallery (``planBody``: only what was set). */
async function startPlan(form) {
  const gallery = form.elements.gallery.value;
  if (!gallery) {
    setStatus("plan-status", "Pick a gallery.", "error");
    return;
  }
  const values = Object.fromEntries(new FormData(form));
  await guarded("plan-status", async () => {
    const job = await api(plansPath(gallery), {method: "POST", json: planBody(values)});
    setStatus("plan-status", `Started plan job ${job.id} of ${gallery}.`, "ok");
    state.openPlan = job.id;
  });
  await loadPlans();
}

/** Apply one option of a finished plan; the server's answer (the job it started) or its
 * refusal (stale, a migration before the candidate serves, no reason) in the status. */
async function applyPlan(plan, option, {force, reason}) {
  await guarded("plan-status", async () => {
    const answer = await api(plansPath(plan.gallery, `/${enc(plan.id)}/apply`),
      {method: "POST", json: {option, force, reason}});
    delete state.planForms[plan.id];
    setStatus("plan-status", `Applied ${answer.option}${answer.forced ? " (forced)" : ""}: ` +
      `started ${answer.job.kind} job ${answer.job.id}.`, "ok");
  });
  await loadPlans();
}

function versionDetail(version) {
  const id = version.version_id;
  return el("div", {},
    el("h2", {}, `Version ${id} `, versionGateBadge(version)),
    versionFacts(version),
    swapForm(id),
    el("h3", {}, "Gate report"),
    forcedList(version),
    gateReports(version),
    gateReport(gateOf(version)));
}

/** Promote the version into a gallery, or roll the gallery back to it. What is typed is
 * kept in ``state.swapForms`` so a redraw (a reload after another call) does not lose it;
 * a swap the server accepted clears it. */
function swapForm(versionId) {
  if (!state.swapForms[versionId]) state.swapForms[versionId] = {};
  const form = state.swapForms[versionId];
  const gallery = el("select", {name: "gallery",
    onchange: () => { form.gallery = gallery.value; }}, state.galleries.map((g) =>
    el("option", {value: g.name, selected: g.name === form.gallery},
      `${g.name} (active ${g.active})`)));
  const reason = el("input", {name: "reason", placeholder: "reason", value: form.reason ?? "",
    oninput: () => { form.reason = reason.value; }});
  const force = el("input", {type: "checkbox", name: "force", checked: !!form.force,
    onchange: () => { form.force = force.checked; }});
  const act = async (action) => {
    const done = await swap(action, versionId, gallery.value, reason.value.trim(),
      force.checked, "models-status");
    if (done) delete state.swapForms[versionId];
    await loadModels(true);
  };
  return el("div", {class: "swap"},
    el("label", {}, "Gallery ", gallery), reason,
    el("label", {class: "check"}, force, " force (skip the gate)"),
    el("button", {type: "button", class: "primary", onclick: () => act("promote")},
      `Promote ${versionId}`),
    el("button", {type: "button", onclick: () => act("rollback")}, `Roll back to ${versionId}`));
}

/** Send a promote or rollback; true when the server accepted it. */
async function swap(action, versionId, gallery, reason, force, statusId) {
  if (!gallery) {
    setStatus(statusId, "Pick a gallery.", "error");
    return false;
  }
  const body = action === "promote" ? {gallery, force, reason: reason || null}
    : {gallery, reason: reason || null};
  return await guarded(statusId, async () => {
    const record = await api(`/v1/models/${enc(versionId)}/${action}`,
      {method: "POST", json: body});
    setStatus(statusId, `${record.name} is now served by ${record.active}.`, "ok");
    return true;
  }) ?? false;
}

// ------------------------------------------------------------------ jobs

function setupJobs() {
  const form = $("job-form");
  const sync = () => {
    const kind = form.elements["job-kind"].value;
    for (const part of form.querySelectorAll("[data-kind]")) {
      part.hidden = !part.dataset.kind.split(" ").includes(kind);  // the kinds it belongs to
    }
    const from = form.elements.new_from.value;
    for (const part of form.querySelectorAll("[data-new]")) part.hidden = part.dataset.new !== from;
  };
  form.addEventListener("change", sync);
  trackTyping(form.elements.gallery);
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    startJob(form);
  });
  sync();
}

/** A field's text; empty is undefined, so the server's default (or its error) applies. */
const field = (form, name) => form.elements[name].value.trim() || undefined;
const optionalInt = (form, name) => {
  const n = Number.parseInt(field(form, name) ?? "", 10);
  return Number.isFinite(n) ? n : undefined;
};

/** The new model of an upgrade (xbt, adapter): a version, an arch + tag, or a config. */
function newModel(form) {
  const from = form.elements.new_from.value;
  return from === "version" ? {version: field(form, "new_version")}
    : from === "arch" ? {arch: field(form, "arch"), pretrained: field(form, "pretrained")}
      : {model_config: field(form, "model_config")};
}

/** A method's config fields from the form (``{name: value}``), or undefined when none is
 * set, so the server's defaults apply. */
function config(fields) {
  const set = Object.entries(fields).filter(([, v]) => v !== undefined);
  return set.length ? Object.fromEntries(set) : undefined;
}

/** The POST /v1/jobs body of the form (``params`` as each kind's Params class takes
 * them, ``service/jobkinds/``); empty optional fields are left to the server. */
function jobBody(form) {
  const kind = form.elements["job-kind"].value;
  let params;
  if (kind === "continual") {
    params = {method: field(form, "method"), data: field(form, "data"),
      domain: field(form, "domain") ?? null, language: field(form, "language") ?? null,
      steps: optionalInt(form, "steps"), batch_size: optionalInt(form, "batch_size")};
  } else if (kind === "xbt") {  // the step counts are XbtConfig fields: stage 1 and stage 2
    params = {new: newModel(form), corpus: field(form, "corpus"), pairs: field(form, "pairs"),
      config: config({pretrain_steps: optionalInt(form, "xbt_pretrain_steps"),
        steps: optionalInt(form, "xbt_steps")})};
  } else if (kind === "adapter") {
    params = {new: newModel(form), sample: optionalInt(form, "sample"),
      config: {method: field(form, "adapter_method")}};
  } else if (kind === "evaluate") {
    params = {version: field(form, "eval_version")};
  } else {
    params = {manifest: field(form, "manifest"),
      kinds: form.elements.ingest_kinds.value.split(" ")};
  }
  return {kind, gallery: field(form, "gallery") ?? "",
    auto_promote: kind !== "ingest" && form.elements.auto_promote.checked,
    params: JSON.parse(JSON.stringify(params))};  // drops the undefined fields
}

async function startJob(form) {
  await guarded("jobs-status", async () => {
    const job = await api("/v1/jobs", {method: "POST", json: jobBody(form)});
    setStatus("jobs-status", `Started ${job.kind} job ${job.id}.`, "ok");
    state.openJob = job.id;
    await pollJobs();
  });
}

function startPolling() {
  if (!apiKey()) {
    setStatus("jobs-status", "Models and jobs are admin views: enter an admin key above.",
      "error");
    return;
  }
  const form = $("job-form");
  if (!form.elements.gallery.value) form.elements.gallery.value = $("gallery").value;
  if (!state.versions.length) {
    api("/v1/models").then((v) => {
      state.versions = v;
      $("version-options").replaceChildren(...v.map((x) => el("option", {value: x.version_id})));
    }).catch(() => {});
  }
  const run = state.pollRun;
  const tick = async () => {
    if (!document.hidden) await pollJobs();
    if (run === state.pollRun) state.pollTimer = setTimeout(tick, POLL_MS);
  };
  tick();
}

function stopPolling() {
  state.pollRun += 1;
  clearTimeout(state.pollTimer);
  clearTimeout(state.planTimer);
  state.pollTimer = null;
  state.planTimer = null;
}

async function pollJobs() {
  try {
    const [jobs, galleries] = await Promise.all([api("/v1/jobs"), api("/v1/galleries")]);
    state.jobs = Array.isArray(jobs) ? jobs : (jobs?.jobs ?? jobs?.items ?? []);
    state.galleries = galleries;
    $("jobs-polled").textContent = `updated ${new Date().toLocaleTimeString()}`;
    renderJobs();
  } catch (error) {
    const missing = error.status === 404 || error.status === 405;
    setStatus("jobs-status", missing ? "This gateway has no jobs API yet." : error.message,
      "error");
  }
}

function renderJobs() {
  const jobs = [...state.jobs].sort((a, b) => String(b.created_at).localeCompare(
    String(a.created_at)));
  $("jobs").replaceChildren(jobs.length ? el("table", {class: "data jobs"},
    el("thead", {}, el("tr", {}, ["job", "gallery", "status", "progress", "result", "started",
      ""].map((h) => el("th", {}, h)))),
    el("tbody", {}, jobs.map(jobRow))) : el("p", {class: "muted"}, "No jobs yet."));
  const open = state.jobs.find((j) => j.id === state.openJob);
  $("job-detail").replaceChildren(...(open ? [jobDetail(open)] : []));
}

function jobRow(job) {
  return el("tr", {"data-job": job.id, class: job.id === state.openJob ? "selected" : ""},
    el("td", {}, el("button", {type: "button", class: "link", onclick: () => {
      state.openJob = job.id;
      renderJobs();
    }}, String(job.id).slice(0, 8)), " ", el("span", {class: "muted small"}, job.kind)),
    el("td", {}, job.gallery),
    el("td", {}, statusBadge(job.status)),
    el("td", {}, progressOf(job)),
    el("td", {}, job.version ?? "", " ", job.gate ? gateBadge(job.gate) : null,
      job.error ? el("div", {class: "bad-text small"}, job.error) : null),
    el("td", {class: "small muted"}, ago(job.started_at || job.created_at)),
    el("td", {class: "actions"}, jobActions(job)));
}

/** Cancel while it runs; once it produced a version: promote it, or roll the gallery back. */
function jobActions(job) {
  const buttons = [];
  if (isActive(job)) {
    buttons.push(el("button", {type: "button", onclick: () => cancelJob(job.id)}, "Cancel"));
  }
  const gallery = state.galleries.find((g) => g.name === job.gallery);
  if (job.status === "succeeded" && job.version && gallery) {
    if (gallery.active === job.version) {
      const previous = previousOf(gallery, job.version);
      if (previous) {
        buttons.push(el("button", {type: "button", onclick: () =>
          swap("rollback", previous, gallery.name, `undo job ${job.id}`, false, "jobs-status")
            .then(pollJobs)}, `Roll back to ${previous}`));
      }
    } else {
      buttons.push(el("button", {type: "button", class: "primary", onclick: () =>
        swap("promote", job.version, gallery.name, `job ${job.id}`, false, "jobs-status")
          .then(pollJobs)}, `Promote ${job.version}`));
    }
  }
  return buttons;
}

/** The version that served the gallery before ``version`` was last made active. */
function previousOf(gallery, version) {
  const history = Array.isArray(gallery.history) ? gallery.history : [];
  for (let i = history.length - 1; i >= 0; i -= 1) {
    if (history[i].version === version) return history[i].previous || null;
  }
  return null;
}

async function cancelJob(id) {
  await guarded("jobs-status", async () => {
    await api(`/v1/jobs/${enc(id)}`, {method: "DELETE"});
    setStatus("jobs-status", `Asked job ${id} to stop.`, "ok");
    await pollJobs();
  });
}

function jobDetail(job) {
  const times = [["created", job.created_at], ["started", job.started_at],
    ["ended", job.ended_at]].filter(([, t]) => t).map(([k, t]) => `${k} ${t}`).join(" · ");
  return el("div", {},
    el("h3", {}, `Job ${job.id} `, statusBadge(job.status)),
    el("p", {class: "small muted"}, `${job.kind} on ${job.gallery}`,
      job.auto_promote ? " · promotes when the gate passes" : "", times ? ` · ${times}` : ""),
    job.error ? el("pre", {class: "raw bad-text"}, job.error) : null,
    job.gate !== undefined && job.gate !== null ? [el("h4", {}, "Gate report"),
      gateReport(job.gate)] : null,
    el("details", {}, el("summary", {}, "raw job"),
      el("pre", {class: "raw"}, JSON.stringify(job, null, 2))));
}

// ------------------------------------------------------------------ start

function main() {
  setupKey();
  setupSearch();
  setupJobs();
  setupPlans();
  window.addEventListener("hashchange", () => showTab(location.hash.slice(1)));
  loadGalleries();
  showTab(location.hash.slice(1) || "search");
}

main();
