// raftbox web console: plain DOM, no framework, no build step.
//
// Every page is built from DOM nodes with textContent (never HTML from server data), so a
// file name or a job error is shown as text whatever it holds. The token is kept in
// sessionStorage (this tab only) and sent as `Authorization: Bearer` to this node's API.
// Pages are addressed by the fragment (#/cluster, #/files?ns=…&path=…, #/history?…,
// #/jobs, #/jobs/<id>), so back and reload work.
"use strict";

const TOKEN_KEY = "raftbox.token";

// ---------------------------------------------------------------------------------------
// DOM helpers

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "text") node.textContent = String(value);
    else if (name === "onclick") node.addEventListener("click", value);
    else if (name === "className") node.className = value;
    else node.setAttribute(name, String(value));
  }
  for (const child of children) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function byId(id) {
  return document.getElementById(id);
}

function table(headers, rows, id) {
  return el(
    "table",
    { id },
    el("thead", {}, el("tr", {}, ...headers.map((h) => el("th", { text: h })))),
    el("tbody", {}, ...rows),
  );
}

function cell(value, className) {
  return el("td", { className }, value === undefined || value === null ? "—" : value);
}

function bytes(n) {
  if (typeof n !== "number") return "—";
  if (n < 1024) return `${n} B`;
  const units = ["KiB", "MiB", "GiB", "TiB"];
  let value = n / 1024;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${value.toFixed(1)} ${units[unit]}`;
}

function showError(message) {
  const box = byId("error");
  box.textContent = message;
  box.hidden = !message;
}

function showNotice(message) {
  const box = byId("notice");
  box.textContent = message;
  box.hidden = !message;
}

// ---------------------------------------------------------------------------------------
// The API

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

// A fresh Idempotency-Key: 128 random bits in hex (crypto.randomUUID exists only in secure
// contexts, and a console may be served over plain HTTP on a private address).
function idempotencyKey() {
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

// A request to this node's API; JSON in, JSON (or an ArrayBuffer) out. An error answer
// (problem+json) becomes an ApiError naming status, title and detail.
async function api(path, { method = "GET", body, raw = false, auth = true } = {}) {
  const headers = {};
  if (auth) headers.Authorization = `Bearer ${token()}`;
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    headers["Idempotency-Key"] = idempotencyKey();
  }
  let response;
  try {
    response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: "no-store",
      credentials: "omit",
    });
  } catch (e) {
    throw new ApiError(0, `cannot reach this node: ${e.message}`);
  }
  if (!response.ok) {
    let message = `${response.status} ${response.statusText}`;
    try {
      const problem = await response.json();
      message = `${problem.status || response.status} ${problem.title || ""}: ${problem.detail || ""}`;
    } catch (_) {
      // not JSON: keep the status line
    }
    if (response.status === 401) message += " — log in again with a valid token";
    throw new ApiError(response.status, message);
  }
  return raw ? response.arrayBuffer() : response.json();
}

function query(params) {
  const search = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== "") search.set(name, value);
  }
  return search.toString();
}

// ---------------------------------------------------------------------------------------
// Routing

function route() {
  const hash = location.hash.replace(/^#/, "") || "/cluster";
  const [path, search] = hash.split("?");
  return { parts: path.split("/").filter(Boolean), params: new URLSearchParams(search || "") };
}

function go(hash) {
  if (location.hash === hash) render();
  else location.hash = hash;
}

let renderSeq = 0;
let refreshTimer = null;
// The cluster page refreshes itself this often (ms).
const CLUSTER_REFRESH_MS = 5000;

// Draws the page the fragment names. `quiet` (the cluster page's own refresh) keeps the
// current content until the new one is ready.
async function render(quiet = false) {
  const seq = ++renderSeq;
  clearTimeout(refreshTimer);
  if (!quiet) showError("");
  const loggedIn = Boolean(token());
  byId("login").hidden = loggedIn;
  byId("nav").hidden = !loggedIn;
  byId("who").hidden = !loggedIn;
  const view = byId("view");
  if (!loggedIn) {
    view.replaceChildren();
    byId("token").focus();
    return;
  }
  const { parts, params } = route();
  for (const link of byId("nav").querySelectorAll("a")) {
    link.classList.toggle("active", link.id === `nav-${parts[0] === "history" ? "files" : parts[0]}`);
  }
  const page = {
    cluster: clusterPage,
    files: () => filesPage(params),
    history: () => historyPage(params),
    jobs: () => (parts[1] ? runsPage(decodeURIComponent(parts[1])) : jobsPage()),
  }[parts[0]];
  if (!quiet) view.replaceChildren(el("p", { className: "muted", text: "Loading…" }));
  try {
    const content = page ? await page() : el("p", { text: "No such page." });
    if (seq !== renderSeq) return;
    view.replaceChildren(content);
    if (quiet) showError("");
  } catch (e) {
    if (seq !== renderSeq) return;
    if (!quiet) view.replaceChildren();
    showError(e.message);
  }
  if (parts[0] === "cluster") {
    refreshTimer = setTimeout(() => render(true), CLUSTER_REFRESH_MS);
  }
}

// ---------------------------------------------------------------------------------------
// Cluster

async function clusterPage() {
  const info = await api("/v1/cluster", { auth: false });
  const replication = new Map((info.replication || []).map((r) => [r.nodeId, r]));
  const facts = el(
    "dl",
    { className: "facts", id: "cluster-facts" },
    el("dt", { text: "This node" }),
    el("dd", { text: info.nodeId }),
    el("dt", { text: "Role" }),
    el("dd", { text: info.role, id: "cluster-role" }),
    el("dt", { text: "Leader" }),
    el("dd", { text: info.leaderId ?? "none", id: "cluster-leader" }),
    el("dt", { text: "Term" }),
    el("dd", { text: info.term, id: "cluster-term" }),
    el("dt", { text: "Applied index" }),
    el("dd", { text: info.lastApplied, id: "cluster-applied" }),
    el("dt", { text: "Last log index" }),
    el("dd", { text: info.lastLogIndex }),
    el("dt", { text: "Snapshot index" }),
    el("dd", { text: info.snapshotIndex ?? "none" }),
    el("dt", { text: "Votes" }),
    el("dd", { text: info.votes ? "yes" : "no (awaiting re-adding)" }),
  );
  const rows = info.members.map((m) => {
    const r = replication.get(m.id);
    const badges = el("span", {});
    if (m.id === info.leaderId) badges.append(el("span", { className: "badge leader", text: "leader" }), " ");
    if (m.id === info.nodeId) badges.append(el("span", { className: "badge", text: "this node" }));
    return el(
      "tr",
      { "data-node": m.id },
      cell(m.id),
      cell(m.role),
      cell(badges),
      cell(el("span", { className: "mono", text: m.httpAddr })),
      cell(el("span", { className: "mono", text: m.grpcAddr })),
      cell(r ? r.matchedIndex ?? "none yet" : m.id === info.nodeId && replication.size ? info.lastLogIndex : null, "num"),
      cell(r ? r.lag : m.id === info.nodeId && replication.size ? 0 : null, "num"),
    );
  });
  const parts = [
    el("h2", { text: "Cluster" }),
    el(
      "div",
      { className: "toolbar" },
      el("button", { type: "button", id: "cluster-refresh", onclick: () => render() }, "Refresh"),
      el("span", { className: "muted", text: `Refreshes every ${CLUSTER_REFRESH_MS / 1000} s` }),
    ),
    facts,
    el("h3", { text: "Members" }),
    table(["Node", "Kind", "", "HTTP", "gRPC", "Matched index", "Lag (entries)"], rows, "members"),
  ];
  if (!info.replication) {
    const leader = info.members.find((m) => m.id === info.leaderId);
    const note = el("p", { className: "muted" }, "Replication lag is known to the leader only. ");
    if (leader) {
      const href = `${location.protocol}//${leader.httpAddr}/#/cluster`;
      note.append("Open the leader's console: ", el("a", { href, rel: "noreferrer", text: href }));
    }
    parts.push(note);
  }
  return el("div", {}, ...parts);
}

// ---------------------------------------------------------------------------------------
// Files

let namespacesCache = null;

async function namespaces() {
  if (!namespacesCache) namespacesCache = (await api("/v1/namespaces")).namespaces;
  return namespacesCache;
}

function filesHash(ns, path) {
  return `#/files?${query({ ns, path })}`;
}

function historyHash(ns, path) {
  return `#/history?${query({ ns, path })}`;
}

function namespacePicker(list, current, onPick) {
  const select = el("select", { id: "namespace" });
  for (const n of list) {
    const label = `${n.kind === "user" ? "Personal" : n.name} (${n.role})`;
    const option = el("option", { value: n.namespaceId, text: label });
    if (n.namespaceId === current) option.selected = true;
    select.append(option);
  }
  select.addEventListener("change", () => onPick(select.value));
  return el("label", {}, "Namespace ", select);
}

function crumbs(ns, folder) {
  const box = el("div", { className: "crumbs", id: "crumbs" });
  box.append(el("button", { type: "button", className: "linkish", text: "/", onclick: () => go(filesHash(ns, "/")) }));
  let prefix = "/";
  for (const name of folder.split("/").filter(Boolean)) {
    prefix += `${name}/`;
    const target = prefix;
    box.append(el("button", { type: "button", className: "linkish", text: name, onclick: () => go(filesHash(ns, target)) }), "/");
  }
  return box;
}

async function filesPage(params) {
  const list = await namespaces();
  const ns = params.get("ns") || (list[0] && list[0].namespaceId);
  const folder = params.get("path") || "/";
  const tbody = el("tbody", {});
  const more = el("button", { type: "button", id: "files-more", hidden: true }, "More");
  let pageToken = null;
  const loadPage = async () => {
    const page = await api(`/v1/files/list?${query({ namespaceId: ns, path: folder, pageToken })}`);
    for (const entry of page.entries) {
      if (entry.type === "folder") {
        const target = `${folder}${entry.name}/`;
        tbody.append(
          el(
            "tr",
            { "data-folder": entry.name },
            cell(el("button", { type: "button", className: "linkish", text: `${entry.name}/`, onclick: () => go(filesHash(ns, target)) })),
            cell("folder"),
            cell(null),
            cell(null),
            cell(null),
          ),
        );
      } else {
        const path = `${folder}${entry.name}`;
        tbody.append(
          el(
            "tr",
            { "data-file": entry.name },
            cell(entry.name),
            cell("file"),
            cell(bytes(entry.size), "num"),
            cell(entry.version, "num"),
            cell(
              el(
                "span",
                {},
                el("button", { type: "button", className: "history", onclick: () => go(historyHash(ns, path)) }, "History"),
                " ",
                el("button", { type: "button", className: "download", onclick: () => downloadCurrent(ns, path) }, "Download"),
              ),
            ),
          ),
        );
      }
    }
    pageToken = page.nextPageToken || null;
    more.hidden = !pageToken;
    if (!tbody.childElementCount) tbody.append(el("tr", {}, el("td", { colspan: 5, className: "muted", text: "This folder is empty." })));
  };
  more.addEventListener("click", () => loadPage().catch((e) => showError(e.message)));
  await loadPage();
  return el(
    "div",
    {},
    el("h2", { text: "Files" }),
    el("div", { className: "toolbar" }, namespacePicker(list, ns, (picked) => go(filesHash(picked, "/")))),
    crumbs(ns, folder),
    el(
      "table",
      { id: "files" },
      el("thead", {}, el("tr", {}, ...["Name", "Kind", "Size", "Version", ""].map((h) => el("th", { text: h })))),
      tbody,
    ),
    more,
  );
}

async function historyPage(params) {
  const ns = params.get("ns");
  const path = params.get("path");
  if (!path) throw new Error("no file path given");
  const folder = path.slice(0, path.lastIndexOf("/") + 1);
  // A viewer cannot restore (the API would refuse with 403): no button for it.
  const role = (await namespaces()).find((n) => n.namespaceId === ns || (!ns && n.kind === "user"));
  const canWrite = !role || role.role !== "viewer";
  const tbody = el("tbody", {});
  const more = el("button", { type: "button", id: "history-more", hidden: true }, "More");
  let pageToken = null;
  let current = null;
  const loadPage = async () => {
    const page = await api(`/v1/files/history?${query({ namespaceId: ns, path, pageToken })}`);
    for (const v of page.versions) {
      if (current === null) current = v.version;
      const actions = el("span", {});
      if (!v.deleted) {
        actions.append(
          el("button", { type: "button", className: "download", onclick: () => download(path, v) }, "Download"),
        );
        if (v.version !== current && canWrite) {
          actions.append(" ", el("button", { type: "button", className: "restore", onclick: () => restore(ns, path, v.version) }, "Restore"));
        }
      }
      tbody.append(
        el(
          "tr",
          { "data-version": v.version },
          cell(v.version, "num"),
          cell(v.deleted ? "deleted" : bytes(v.size), "num"),
          cell(v.mtime),
          cell(v.createdAt),
          cell(v.device),
          cell(actions),
        ),
      );
    }
    pageToken = page.nextPageToken || null;
    more.hidden = !pageToken;
  };
  more.addEventListener("click", () => loadPage().catch((e) => showError(e.message)));
  await loadPage();
  return el(
    "div",
    {},
    el("h2", {}, "History of ", el("span", { className: "mono", id: "history-path", text: path })),
    el("div", { className: "toolbar" }, el("button", { type: "button", id: "history-back", onclick: () => go(filesHash(ns, folder)) }, "Back to folder")),
    el(
      "table",
      { id: "history" },
      el("thead", {}, el("tr", {}, ...["Version", "Size", "Modified", "Committed", "Device", ""].map((h) => el("th", { text: h })))),
      tbody,
    ),
    more,
  );
}

// The file's bytes: its chunks fetched in order from this node and joined.
async function download(path, version) {
  showError("");
  showNotice(`Downloading ${path}…`);
  try {
    const parts = [];
    for (const hash of version.chunks) {
      parts.push(await api(`/v1/blocks/${encodeURIComponent(hash)}`, { raw: true }));
    }
    const blob = new Blob(parts, { type: "application/octet-stream" });
    const url = URL.createObjectURL(blob);
    const link = el("a", { href: url, download: path.slice(path.lastIndexOf("/") + 1) });
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60_000);
    showNotice(`Downloaded ${path}, version ${version.version}: ${blob.size} bytes`);
  } catch (e) {
    showNotice("");
    showError(e.message);
  }
}

async function downloadCurrent(ns, path) {
  try {
    const current = await api(`/v1/files?${query({ namespaceId: ns, path })}`);
    await download(path, current);
  } catch (e) {
    showError(e.message);
  }
}

async function restore(ns, path, version) {
  showError("");
  try {
    const body = { path, version };
    if (ns) body.namespaceId = ns;
    const answer = await api("/v1/files/restore", { method: "POST", body });
    await render();
    showNotice(`Restored version ${version} of ${path} as version ${answer.version}`);
  } catch (e) {
    showError(e.message);
  }
}

// ---------------------------------------------------------------------------------------
// Jobs

function statusCell(status) {
  return cell(el("span", { className: `status-${status}`, text: status }));
}

function scheduleText(job) {
  const s = job.schedule || {};
  if (s.runAt) return `once at ${s.runAt}`;
  if (s.cron) return `cron ${s.cron} (${s.timezone || "UTC"})`;
  if (s.everyMs) return `every ${s.everyMs} ms`;
  return job.scheduleKind;
}

async function jobsPage() {
  const tbody = el("tbody", {});
  const more = el("button", { type: "button", id: "jobs-more", hidden: true }, "More");
  let pageToken = null;
  const loadPage = async () => {
    const page = await api(`/v1/jobs?${query({ pageToken })}`);
    for (const job of page.jobs) {
      tbody.append(
        el(
          "tr",
          { "data-job": job.jobId },
          cell(
            el("a", { href: `#/jobs/${encodeURIComponent(job.jobId)}`, className: "mono job-link", text: job.jobId }),
          ),
          cell(job.type),
          cell(job.target || null),
          statusCell(job.status),
          cell(scheduleText(job)),
          cell(job.nextRunAt),
          cell(job.attempts, "num"),
          cell(job.lastError, "wrap"),
        ),
      );
    }
    pageToken = page.nextPageToken || null;
    more.hidden = !pageToken;
    if (!tbody.childElementCount) tbody.append(el("tr", {}, el("td", { colspan: 8, className: "muted", text: "No jobs." })));
  };
  more.addEventListener("click", () => loadPage().catch((e) => showError(e.message)));
  await loadPage();
  return el(
    "div",
    {},
    el("h2", { text: "Jobs" }),
    el(
      "table",
      { id: "jobs" },
      el(
        "thead",
        {},
        el("tr", {}, ...["Job", "Type", "Target", "Status", "Schedule", "Next run", "Attempts", "Last error"].map((h) => el("th", { text: h }))),
      ),
      tbody,
    ),
    more,
  );
}

async function runsPage(jobId) {
  const job = await api(`/v1/jobs/${encodeURIComponent(jobId)}`);
  const tbody = el("tbody", {});
  const more = el("button", { type: "button", id: "runs-more", hidden: true }, "More");
  let pageToken = null;
  const loadPage = async () => {
    const page = await api(`/v1/jobs/${encodeURIComponent(jobId)}/runs?${query({ pageToken })}`);
    for (const run of page.runs) {
      const result = run.result
        ? [run.result.httpStatus ? `HTTP ${run.result.httpStatus}` : "", run.result.excerpt || ""].filter(Boolean).join(": ")
        : null;
      tbody.append(
        el(
          "tr",
          { "data-run": run.runId },
          cell(el("span", { className: "mono", text: run.runId })),
          cell(run.attempt, "num"),
          statusCell(run.status),
          cell(run.scheduledFor),
          cell(run.startedAt),
          cell(run.finishedAt),
          cell(run.workerId),
          cell(result, "wrap"),
          cell(run.error, "wrap"),
        ),
      );
    }
    pageToken = page.nextPageToken || null;
    more.hidden = !pageToken;
    if (!tbody.childElementCount) tbody.append(el("tr", {}, el("td", { colspan: 9, className: "muted", text: "No runs yet." })));
  };
  more.addEventListener("click", () => loadPage().catch((e) => showError(e.message)));
  await loadPage();
  return el(
    "div",
    {},
    el("h2", {}, "Runs of job ", el("span", { className: "mono", id: "runs-job", text: job.jobId })),
    el(
      "dl",
      { className: "facts" },
      el("dt", { text: "Type" }),
      el("dd", { text: job.type }),
      el("dt", { text: "Status" }),
      el("dd", { text: job.status, id: "job-status" }),
      el("dt", { text: "Schedule" }),
      el("dd", { text: scheduleText(job) }),
      el("dt", { text: "Attempts" }),
      el("dd", { text: job.attempts }),
    ),
    el("div", { className: "toolbar" }, el("a", { href: "#/jobs", id: "runs-back", text: "All jobs" })),
    el(
      "table",
      { id: "runs" },
      el(
        "thead",
        {},
        el("tr", {}, ...["Run", "Attempt", "Status", "Scheduled for", "Started", "Finished", "Worker", "Result", "Error"].map((h) => el("th", { text: h }))),
      ),
      tbody,
    ),
    more,
  );
}

// ---------------------------------------------------------------------------------------
// Login

async function whoAmI() {
  const me = await api("/v1/me");
  byId("who-name").textContent = `${me.name} (${me.userId})`;
  // What the user stores, against their quota (an admin has none).
  const quota = me.quotaBytes === undefined ? "" : ` of ${bytes(me.quotaBytes)}`;
  byId("who-storage").textContent = `${bytes(me.storedBytes)}${quota} stored`;
}

// Keeps `value` as this tab's token if the node takes it (true); else drops it and shows why.
async function startSession(value) {
  sessionStorage.setItem(TOKEN_KEY, value);
  try {
    await whoAmI();
  } catch (e) {
    sessionStorage.removeItem(TOKEN_KEY);
    showError(e.message);
    return false;
  }
  namespacesCache = null;
  render();
  return true;
}

async function logIn(event) {
  event.preventDefault();
  const input = byId("token");
  const value = input.value.trim();
  if (!value) return;
  if (await startSession(value)) input.value = "";
}

// Name and password: POST /v1/login hands back a session token, kept as a pasted one is.
async function logInWithPassword(event) {
  event.preventDefault();
  const name = byId("login-name").value.trim();
  const password = byId("login-password");
  if (!name || !password.value) return;
  let session;
  try {
    session = await api("/v1/login", { method: "POST", body: { name, password: password.value }, auth: false });
  } catch (e) {
    showError(e.message);
    return;
  }
  password.value = "";
  await startSession(session.token);
}

function logOut() {
  sessionStorage.removeItem(TOKEN_KEY);
  namespacesCache = null;
  byId("who-name").textContent = "";
  showNotice("");
  render();
}

document.addEventListener("DOMContentLoaded", () => {
  byId("login-form").addEventListener("submit", logIn);
  byId("password-form").addEventListener("submit", logInWithPassword);
  byId("logout").addEventListener("click", logOut);
  window.addEventListener("hashchange", () => {
    showNotice("");
    render();
  });
  if (token()) whoAmI().catch((e) => showError(e.message));
  render();
});
