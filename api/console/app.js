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
  if (raw) return response.arrayBuffer();
  // 204 and other empty answers carry no JSON.
  const text = await response.text();
  return text ? JSON.parse(text) : null;
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
    sharing: () => (parts[1] ? membersPage(decodeURIComponent(parts[1])) : sharingPage()),
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

// The marker file that makes an empty folder exist (WebDAV's MKCOL and "New folder" write
// it); listings do not show it.
const FOLDER_MARKER = ".raftbox-folder";

// The caller's role on namespace `ns` (undefined: the personal one, or not listed).
async function roleOf(ns) {
  const entry = (await namespaces()).find((n) => n.namespaceId === ns || (!ns && n.kind === "user"));
  return entry ? entry.role : undefined;
}

async function filesPage(params) {
  const list = await namespaces();
  const ns = params.get("ns") || (list[0] && list[0].namespaceId);
  const folder = params.get("path") || "/";
  const canWrite = (await roleOf(ns)) !== "viewer";
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
            cell(el("button", { type: "button", className: "share-link", onclick: () => makeLink(ns, { folder: target }) }, "Link")),
          ),
        );
      } else if (entry.name !== FOLDER_MARKER) {
        tbody.append(fileRow(ns, folder, entry, canWrite));
      }
    }
    pageToken = page.nextPageToken || null;
    more.hidden = !pageToken;
    if (!tbody.childElementCount) tbody.append(el("tr", {}, el("td", { colspan: 5, className: "muted", text: "This folder is empty." })));
  };
  more.addEventListener("click", () => loadPage().catch((e) => showError(e.message)));
  await loadPage();
  const toolbar = el("div", { className: "toolbar" }, namespacePicker(list, ns, (picked) => go(filesHash(picked, "/"))));
  const parts = [el("h2", { text: "Files" }), toolbar, crumbs(ns, folder)];
  if (canWrite) {
    const picker = el("input", { type: "file", id: "upload-input", multiple: true, className: "visually-hidden" });
    picker.addEventListener("change", () => {
      const files = Array.from(picker.files);
      picker.value = "";
      uploadFiles(ns, folder, files);
    });
    const name = el("input", { type: "text", id: "new-folder-name", placeholder: "new folder name", spellcheck: "false" });
    const form = el("form", { id: "new-folder-form", className: "inline" }, name, el("button", { type: "submit", id: "new-folder" }, "New folder"));
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      newFolder(ns, folder, name.value.trim());
    });
    toolbar.append(el("label", { className: "button", for: "upload-input", id: "upload-button", tabindex: 0 }, "Upload files"), picker, form);
    const zone = el("div", { id: "drop-zone", className: "drop-zone" }, "Drop files here to upload them to this folder");
    zone.addEventListener("dragover", (event) => {
      event.preventDefault();
      zone.classList.add("over");
    });
    zone.addEventListener("dragleave", () => zone.classList.remove("over"));
    zone.addEventListener("drop", (event) => {
      event.preventDefault();
      zone.classList.remove("over");
      const files = Array.from((event.dataTransfer && event.dataTransfer.files) || []);
      if (files.length) uploadFiles(ns, folder, files);
    });
    parts.push(zone);
  }
  parts.push(
    el(
      "table",
      { id: "files" },
      el("thead", {}, el("tr", {}, ...["Name", "Kind", "Size", "Version", ""].map((h) => el("th", { text: h })))),
      tbody,
    ),
    more,
  );
  return el("div", {}, ...parts);
}

// One file's row: history, download and, for a writer, rename and delete (each confirmed
// in the row itself).
function fileRow(ns, folder, entry, canWrite) {
  const path = `${folder}${entry.name}`;
  const nameCell = cell(entry.name);
  const actions = el(
    "span",
    {},
    el("button", { type: "button", className: "history", onclick: () => go(historyHash(ns, path)) }, "History"),
    " ",
    el("button", { type: "button", className: "download", onclick: () => downloadCurrent(ns, path) }, "Download"),
  );
  if (canWrite) {
    const rename = el("button", { type: "button", className: "rename" }, "Rename");
    rename.addEventListener("click", () => {
      const input = el("input", { type: "text", className: "rename-input", value: entry.name, spellcheck: "false" });
      const form = el("form", { className: "inline" }, input, el("button", { type: "submit", className: "rename-save" }, "Save"));
      form.addEventListener("submit", (event) => {
        event.preventDefault();
        renameFile(ns, folder, entry, input.value.trim());
      });
      nameCell.replaceChildren(form);
      input.focus();
    });
    const remove = el("button", { type: "button", className: "delete" }, "Delete");
    remove.addEventListener("click", () => {
      if (!remove.classList.contains("confirm")) {
        remove.classList.add("confirm");
        remove.textContent = "Delete for sure?";
        return;
      }
      deleteFile(ns, path, entry.version);
    });
    actions.append(" ", rename, " ", remove);
  }
  actions.append(" ", el("button", { type: "button", className: "share-link", onclick: () => makeLink(ns, { path }) }, "Link"));
  return el("tr", { "data-file": entry.name }, nameCell, cell("file"), cell(bytes(entry.size), "num"), cell(entry.version, "num"), cell(actions));
}

// A change of files, then the page drawn again and what happened said.
// A change (`work`, an API call), then the page drawn again and `done(answer)` said; an
// error shown instead.
async function act(work, done) {
  showError("");
  try {
    const answer = await work();
    await render();
    showNotice(done(answer));
  } catch (e) {
    showError(e.message);
  }
}

function changeFiles(path, body, done) {
  return act(() => api(path, { method: "POST", body }), done);
}

function validName(name) {
  if (!name || name === "." || name === ".." || name.includes("/")) {
    showError("A name is not empty, not . or .., and has no /.");
    return false;
  }
  return true;
}

function withNamespace(ns, body) {
  if (ns) body.namespaceId = ns;
  return body;
}

// A folder exists once something is in it: an empty marker file makes it exist now.
function newFolder(ns, folder, name) {
  if (!validName(name)) return;
  const body = withNamespace(ns, { path: `${folder}${name}/${FOLDER_MARKER}`, chunks: [], baseVersion: 0, size: 0, mtime: Date.now() });
  changeFiles("/v1/files/commit", body, () => `Made folder ${folder}${name}/`);
}

function renameFile(ns, folder, entry, name) {
  if (!validName(name)) return;
  const from = `${folder}${entry.name}`;
  const to = `${folder}${name}`;
  changeFiles("/v1/files/move", withNamespace(ns, { from, to, baseVersion: entry.version }), () => `Renamed ${from} to ${to}`);
}

function deleteFile(ns, path, version) {
  changeFiles("/v1/files/delete", withNamespace(ns, { path, baseVersion: version }), () => `Deleted ${path} (its versions stay in its history)`);
}

// A share link to a file ({path}) or a folder ({folder}): its URL shown once, to copy.
async function makeLink(ns, target) {
  showError("");
  try {
    const made = await api("/v1/links", { method: "POST", body: withNamespace(ns, { ...target }) });
    const url = `${location.origin}${made.url}`;
    const shown = made.link.folder && made.link.path !== "/" ? `${made.link.path}/` : made.link.path;
    showNotice(`Share link to ${shown} (shown only now; revoke it under Sharing): ${url}`);
  } catch (e) {
    showError(e.message);
  }
}

// ---------------------------------------------------------------------------------------
// Uploads: each file in pieces of at most a block, each piece hashed by the node
// (POST /v1/blocks), then one commit naming them. The pieces stored so far are remembered in
// localStorage under the file's path, size and modification time, so choosing or dropping
// the same file again after a failure, a reload or a lost connection goes on from the first
// piece not stored. Progress is shown per file, by bytes sent.

const PIECE_BYTES = 4 * 1024 * 1024;
// Tries per piece when the node is unreachable or busy (0 or 503), a second apart.
const PIECE_TRIES = 3;

function postBlock(blob, onProgress) {
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open("POST", "/v1/blocks");
    xhr.setRequestHeader("Authorization", `Bearer ${token()}`);
    xhr.setRequestHeader("Content-Type", "application/octet-stream");
    xhr.upload.addEventListener("progress", (event) => onProgress(event.loaded));
    xhr.addEventListener("load", () => {
      let answer = null;
      try {
        answer = JSON.parse(xhr.responseText);
      } catch (_) {
        // not JSON: the status line says enough
      }
      if (xhr.status === 201 && answer && answer.hash) resolve(answer.hash);
      else if (answer && answer.title) reject(new ApiError(xhr.status, `${answer.status} ${answer.title}: ${answer.detail || ""}`));
      else reject(new ApiError(xhr.status, `${xhr.status} ${xhr.statusText}`));
    });
    xhr.addEventListener("error", () => reject(new ApiError(0, "cannot reach this node")));
    xhr.send(blob);
  });
}

async function postBlockWithRetries(blob, onProgress) {
  for (let attempt = 1; ; attempt += 1) {
    try {
      return await postBlock(blob, onProgress);
    } catch (e) {
      if (attempt >= PIECE_TRIES || !(e.status === 0 || e.status === 503)) throw e;
      await new Promise((resume) => setTimeout(resume, 1000));
    }
  }
}

async function uploadFiles(ns, folder, files) {
  showError("");
  // The panel outlives the page (redrawn when a batch ends); a new batch clears what ended.
  const box = byId("uploads");
  for (const row of box.querySelectorAll(".upload.done")) row.remove();
  let failed = 0;
  for (const file of files) {
    try {
      await uploadOne(ns, folder, file, box);
    } catch (e) {
      failed += 1;
      showError(`${file.name}: ${e.message}`);
    }
  }
  // What the user stores now, against their quota.
  whoAmI().catch((e) => showError(e.message));
  if (!failed) {
    await render();
    showNotice(`Uploaded ${files.length} file${files.length === 1 ? "" : "s"} to ${folder}`);
  }
}

// CRC-32 of a piece's bytes: what a resumed upload checks the file's pieces against, so a
// different file of the same name, size and time never reuses another's pieces.
const CRC_TABLE = (() => {
  const table = new Uint32Array(256);
  for (let n = 0; n < 256; n += 1) {
    let c = n;
    for (let k = 0; k < 8; k += 1) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    table[n] = c >>> 0;
  }
  return table;
})();

async function crc32(blob) {
  const bytes = new Uint8Array(await blob.arrayBuffer());
  let crc = 0xffffffff;
  for (let i = 0; i < bytes.length; i += 1) crc = CRC_TABLE[(crc ^ bytes[i]) & 0xff] ^ (crc >>> 8);
  return (crc ^ 0xffffffff) >>> 0;
}

const UPLOAD_KEY_PREFIX = "raftbox.upload:";

// The pieces of `file` an earlier upload stored, as long as the file's bytes still match
// them (checked piece by piece); none else.
async function storedPieces(key, file) {
  let record;
  try {
    record = JSON.parse(localStorage.getItem(key) || "null");
  } catch (_) {
    record = null;
  }
  if (!record || !Array.isArray(record.pieces)) return [];
  const kept = [];
  for (const [i, piece] of record.pieces.entries()) {
    const start = i * PIECE_BYTES;
    if (!piece || typeof piece.hash !== "string" || piece.crc !== (await crc32(file.slice(start, start + PIECE_BYTES)))) break;
    kept.push(piece);
  }
  return kept;
}

async function uploadOne(ns, folder, file, box, fresh = false) {
  const path = `${folder}${file.name}`;
  // Whose upload of what: the user, the namespace, the path, and the file's size and time.
  const key = `${UPLOAD_KEY_PREFIX}${currentUserId}:${ns || ""}:${path}:${file.size}:${file.lastModified}`;
  const pieceList = fresh ? [] : await storedPieces(key, file);
  const stored = pieceList.map((p) => p.hash);
  const resumedAt = stored.length;
  const pieces = Math.ceil(file.size / PIECE_BYTES);
  const bar = el("progress", { max: Math.max(file.size, 1), value: Math.min(resumedAt * PIECE_BYTES, file.size) });
  const label = el("span", { className: "upload-label" });
  const row = el("div", { className: "upload", "data-upload": file.name }, label, " ", bar);
  box.append(row);
  const show = (sent) => {
    bar.value = sent;
    const percent = file.size ? Math.floor((100 * sent) / file.size) : 100;
    const resumed = resumedAt ? ` (resumed at piece ${resumedAt + 1} of ${pieces})` : "";
    label.textContent = `${file.name}: ${percent}% of ${bytes(file.size)}${resumed}`;
  };
  show(Math.min(resumedAt * PIECE_BYTES, file.size));
  for (let i = stored.length; i < pieces; i += 1) {
    const start = i * PIECE_BYTES;
    const piece = file.slice(start, start + PIECE_BYTES);
    const hash = await postBlockWithRetries(piece, (loaded) => show(start + loaded));
    stored.push(hash);
    pieceList.push({ hash, crc: await crc32(piece) });
    localStorage.setItem(key, JSON.stringify({ pieces: pieceList }));
  }
  let base = 0;
  try {
    base = (await api(`/v1/files?${query({ namespaceId: ns, path })}`)).version;
  } catch (e) {
    if (e.status !== 404) throw e;
  }
  let answer;
  try {
    answer = await api("/v1/files/commit", {
      method: "POST",
      body: withNamespace(ns, { path, chunks: stored, baseVersion: base, size: file.size, mtime: file.lastModified }),
    });
  } catch (e) {
    // Pieces stored long ago may have been collected since: once, the upload starts over.
    if (e.status === 422 && resumedAt && !fresh) {
      localStorage.removeItem(key);
      row.remove();
      return uploadOne(ns, folder, file, box, true);
    }
    throw e;
  }
  localStorage.removeItem(key);
  show(file.size);
  label.textContent += `, stored as version ${answer.version}`;
  row.classList.add("done");
}

async function historyPage(params) {
  const ns = params.get("ns");
  const path = params.get("path");
  if (!path) throw new Error("no file path given");
  const folder = path.slice(0, path.lastIndexOf("/") + 1);
  // A viewer cannot restore (the API would refuse with 403): no button for it.
  const canWrite = (await roleOf(ns)) !== "viewer";
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
// Sharing: the caller's shared folders, invitations to answer, and each owned folder's
// members (users and groups, with roles).

// A cell of buttons, each [class, label, action].
function buttonsCell(...buttons) {
  const box = el("span", {});
  buttons.forEach(([className, label, onclick], i) => {
    if (i) box.append(" ");
    box.append(el("button", { type: "button", className, onclick }, label));
  });
  return cell(box);
}

function sharingHash(ns) {
  return ns ? `#/sharing/${encodeURIComponent(ns)}` : "#/sharing";
}

async function sharingPage() {
  namespacesCache = null;
  const list = (await namespaces()).filter((n) => n.kind !== "user");
  const rows = list.map((n) =>
    el(
      "tr",
      { "data-share": n.name },
      cell(n.name),
      cell(n.role),
      buttonsCell(
        ["open", "Open", () => go(filesHash(n.namespaceId, "/"))],
        ["members", "Members", () => go(sharingHash(n.namespaceId))],
      ),
    ),
  );
  if (!rows.length) rows.push(el("tr", {}, el("td", { colspan: 3, className: "muted", text: "No shared folders yet." })));
  const name = el("input", { type: "text", id: "share-name", placeholder: "folder name", spellcheck: "false" });
  const form = el("form", { id: "share-form", className: "inline" }, name, el("button", { type: "submit", id: "share-create" }, "New shared folder"));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const value = name.value.trim();
    if (!value) return;
    showError("");
    try {
      const made = await api("/v1/namespaces", { method: "POST", body: { name: value } });
      namespacesCache = null;
      go(sharingHash(made.namespaceId));
      showNotice(`Made the shared folder ${value}: invite people below`);
    } catch (e) {
      showError(e.message);
    }
  });
  const invitations = (await api("/v1/me/invitations")).invitations;
  const invitationRows = invitations.map((i) =>
    el(
      "tr",
      { "data-invitation": i.name },
      cell(i.name),
      cell(i.role),
      buttonsCell(
        ["accept", "Accept", () => answerInvitation(i.namespaceId, "accept")],
        ["decline", "Decline", () => answerInvitation(i.namespaceId, "decline")],
      ),
    ),
  );
  const parts = [el("h2", { text: "Shared folders" }), el("div", { className: "toolbar" }, form), table(["Folder", "Your role", ""], rows, "shares")];
  if (invitationRows.length) parts.push(el("h3", { text: "Invitations" }), table(["Folder", "Role", ""], invitationRows, "invitations"));
  parts.push(el("h3", { text: "Share links" }), await linksTable());
  return el("div", {}, ...parts);
}

// The caller's share links (first page), each revocable.
async function linksTable() {
  const page = await api("/v1/links");
  const rows = page.links.map((link) =>
    el(
      "tr",
      { "data-link": link.path },
      cell(`${link.path}${link.folder && link.path !== "/" ? "/" : ""}`),
      cell(link.expiresAt),
      cell(link.maxDownloads ? `${link.downloads} of ${link.maxDownloads}` : link.downloads, "num"),
      cell(link.passwordProtected ? "yes" : "no"),
      cell(link.active ? "active" : "ended"),
      buttonsCell(["revoke-link", "Revoke", () => revokeLink(link.linkId, link.path)]),
    ),
  );
  if (!rows.length) rows.push(el("tr", {}, el("td", { colspan: 6, className: "muted", text: "No share links. Make one with Link on a file or a folder." })));
  return table(["Shares", "Expires", "Downloads", "Password", "State", ""], rows, "links");
}

function revokeLink(id, path) {
  return act(
    () => api(`/v1/links/${encodeURIComponent(id)}`, { method: "DELETE" }),
    () => `Revoked the link to ${path}: it no longer works`,
  );
}

function answerInvitation(ns, answer) {
  return act(
    async () => {
      await api(`/v1/namespaces/${encodeURIComponent(ns)}/${answer}`, { method: "POST", body: {} });
      namespacesCache = null;
    },
    () => (answer === "accept" ? "Invitation accepted: the folder is in your list" : "Invitation declined"),
  );
}

async function membersPage(ns) {
  const acl = await api(`/v1/namespaces/${encodeURIComponent(ns)}/acl`);
  const owner = (await roleOf(ns)) === "owner";
  const rows = acl.entries.map((entry) => {
    const who = entry.groupId ? `group ${entry.groupName}` : entry.userName;
    const actions = el("span", {});
    if (owner && entry.role !== "owner") {
      const target = entry.groupId ? `groups/${encodeURIComponent(entry.groupId)}` : `users/${encodeURIComponent(entry.userId)}`;
      actions.append(
        el("button", { type: "button", className: "revoke", onclick: () => revokeMember(ns, target, who) }, "Remove"),
      );
    }
    return el("tr", { "data-member": who }, cell(who), cell(entry.role), cell(entry.pending ? "invited" : "member"), cell(actions));
  });
  const parts = [
    el("h2", {}, "Members of ", el("span", { id: "members-of", text: acl.name })),
    el("div", { className: "toolbar" }, el("a", { href: "#/sharing", id: "members-back", text: "All shared folders" })),
    table(["Who", "Role", "State", ""], rows, "members-list"),
  ];
  if (owner) {
    const kind = el("select", { id: "grant-kind" }, el("option", { value: "user", text: "user" }), el("option", { value: "group", text: "group" }));
    const name = el("input", { type: "text", id: "grant-name", placeholder: "name", spellcheck: "false" });
    const role = el("select", { id: "grant-role" }, el("option", { value: "viewer", text: "viewer" }), el("option", { value: "editor", text: "editor" }));
    const form = el("form", { id: "grant-form", className: "inline" }, kind, name, role, el("button", { type: "submit", id: "grant" }, "Invite"));
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const value = name.value.trim();
      if (!value) return;
      showError("");
      try {
        const body = kind.value === "group" ? { groupName: value, role: role.value } : { userName: value, role: role.value };
        await api(`/v1/namespaces/${encodeURIComponent(ns)}/acl`, { method: "PUT", body });
        await render();
        showNotice(`Invited ${kind.value} ${value} as ${role.value}`);
      } catch (e) {
        showError(e.message);
      }
    });
    parts.push(el("h3", { text: "Invite" }), form);
  }
  return el("div", {}, ...parts);
}

function revokeMember(ns, target, who) {
  return act(() => api(`/v1/namespaces/${encodeURIComponent(ns)}/acl/${target}`, { method: "DELETE" }), () => `Removed ${who}`);
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
          statusCell(job.paused ? "PAUSED" : job.status),
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

const FINAL_STATUSES = ["SUCCEEDED", "FAILED", "CANCELLED"];

// Pause or resume, and run now: the buttons a job that has not ended offers.
function jobMethods(job) {
  if (FINAL_STATUSES.includes(job.status)) return [];
  const call = (verb, done) => () =>
    act(() => api(`/v1/jobs/${encodeURIComponent(job.jobId)}:${verb}`, { method: "POST", body: {} }), () => done);
  const buttons = [
    job.paused
      ? el("button", { type: "button", id: "job-resume", onclick: call("resume", "Resumed: the next fire is its next scheduled time") }, "Resume")
      : el("button", { type: "button", id: "job-pause", onclick: call("pause", "Paused: no fire or retry starts until you resume it") }, "Pause"),
  ];
  if (!job.paused && job.status === "SCHEDULED") {
    buttons.push(el("button", { type: "button", id: "job-run", onclick: call("run", "Fired now: its run shows below once it starts") }, "Run now"));
  }
  return buttons;
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
      el("dd", { text: job.paused ? `${job.status} (paused)` : job.status, id: "job-status" }),
      el("dt", { text: "Next run" }),
      el("dd", { text: job.nextRunAt || "none", id: "job-next-run" }),
      el("dt", { text: "Schedule" }),
      el("dd", { text: scheduleText(job) }),
      el("dt", { text: "Attempts" }),
      el("dd", { text: job.attempts }),
    ),
    el("div", { className: "toolbar" }, el("a", { href: "#/jobs", id: "runs-back", text: "All jobs" }), ...jobMethods(job)),
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

// The logged-in user's id (what uploads remember their pieces under).
let currentUserId = "";

async function whoAmI() {
  const me = await api("/v1/me");
  currentUserId = me.userId;
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
  // What this browser remembers of unfinished uploads goes with the session.
  for (const key of Object.keys(localStorage)) {
    if (key.startsWith(UPLOAD_KEY_PREFIX)) localStorage.removeItem(key);
  }
  currentUserId = "";
  namespacesCache = null;
  byId("who-name").textContent = "";
  showNotice("");
  byId("uploads").replaceChildren();
  render();
}

document.addEventListener("DOMContentLoaded", () => {
  byId("login-form").addEventListener("submit", logIn);
  byId("password-form").addEventListener("submit", logInWithPassword);
  byId("logout").addEventListener("click", logOut);
  window.addEventListener("hashchange", () => {
    showNotice("");
    for (const row of byId("uploads").querySelectorAll(".upload.done")) row.remove();
    render();
  });
  if (token()) whoAmI().catch((e) => showError(e.message));
  render();
});
