// The approver's dashboard: what needs you, history, rooms and (for admins) users.
// Live through Server-Sent Events; every state change is a POST carrying the CSRF token.

import { createRooms } from "/assets/rooms.js";
import { localTime, localTimes } from "/assets/time.js";

const state = {
  me: null,
  csrf: null,
  view: "needs",
  requests: [],
  selected: null,
  detail: null,
  users: [],
  notify: false,
  lastPendingIds: new Set(),
  // Batch decisions: the selected pending requests, by id, at the version shown.
  batch: new Map(),
  batchConfirm: null,
  batchNotice: null,
};

const $ = (id) => document.getElementById(id);
const el = (tag, attrs = {}, ...children) => {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
};

async function api(path, options = {}) {
  const headers = { accept: "application/json" };
  if (options.body !== undefined) headers["content-type"] = "application/json";
  if (options.method && options.method !== "GET") headers["x-csrf-token"] = state.csrf;
  const response = await fetch(path, {
    method: options.method || "GET",
    headers,
    credentials: "same-origin",
    body: options.body === undefined ? undefined : JSON.stringify(options.body),
  });
  if (response.status === 401) {
    location.assign("/login");
    throw new Error("signed out");
  }
  const data = await response.json().catch(() => ({}));
  if (!response.ok) {
    // The server writes times into its messages in UTC; people read them in theirs.
    const error = new Error(localTimes((data.error && data.error.message) || `HTTP ${response.status}`));
    error.status = response.status;
    error.code = data.error && data.error.code;
    throw error;
  }
  return data;
}

// ---- time -------------------------------------------------------------------------

function fmtTime(iso) {
  return localTime(iso);
}

function remaining(iso) {
  const ms = new Date(iso).getTime() - Date.now();
  if (ms <= 0) return { text: "expired", soon: true };
  const s = Math.floor(ms / 1000);
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  const sec = s % 60;
  const text = h > 0 ? `${h}h ${String(m).padStart(2, "0")}m` : `${m}m ${String(sec).padStart(2, "0")}s`;
  return { text: `${text} left`, soon: ms < 5 * 60 * 1000 };
}

function countdown(iso) {
  const span = el("span", { class: "countdown", "data-expires": iso });
  paintCountdown(span);
  return span;
}

function paintCountdown(span) {
  const r = remaining(span.dataset.expires);
  span.textContent = r.text;
  span.classList.toggle("soon", r.soon);
}

setInterval(() => document.querySelectorAll(".countdown").forEach(paintCountdown), 1000);

// ---- lists ------------------------------------------------------------------------

function detailsPreview(details) {
  return Object.entries(details || {})
    .slice(0, 4)
    .map(([k, v]) => `${k}: ${v}`)
    .join(" · ");
}

function card(request) {
  return el(
    "button",
    {
      class: "card",
      type: "button",
      "aria-current": state.selected === request.request_id ? "true" : "false",
      "data-id": request.request_id,
      onclick: () => select(request.request_id),
    },
    el("div", { class: "desc" }, request.action_description),
    el("div", { class: "details" }, detailsPreview(request.action_details)),
    el(
      "div",
      { class: "meta" },
      el("span", { class: `status ${request.status}` }, request.status.replace("_", " ")),
      el("span", {}, request.requested_by.replace(/^(token|stdio|local):/, "")),
      el("span", {}, fmtTime(request.requested_at)),
      request.status === "pending" ? countdown(request.expires_at) : null,
      request.why ? el("span", { class: "why-mark" }, whyMark(request.why)) : null,
      request.quorum ? el("span", { class: "quorum-mark" }, `${request.quorum.approvals.length} of ${request.quorum.required} approvals`) : null,
      request.outcome && request.outcome.status === "unknown" ? el("span", { class: "outcome-mark unknown" }, "outcome unknown") : null,
    ),
  );
}

// ---- outcome: what came of an approved action -------------------------------------

const OUTCOME_WORDS = { succeeded: "Succeeded", failed: "Failed", partial: "Partly done", unknown: "Unknown" };

function outcomeSection(r) {
  const o = r.outcome;
  const parts = [];
  if (o.status === "unknown") {
    parts.push(el("div", { class: "notice warn", role: "status" },
      "Whether this action ran is unknown: it was sent, and no answer came back (the gateway stopped, or the upstream never answered). It will not be sent again; check the system it was sent to."));
  }
  parts.push(kvTable([
    ["Outcome", el("span", { class: `outcome ${o.status}` }, OUTCOME_WORDS[o.status] || o.status)],
    ["Summary", o.summary || "—"],
    ["Recorded", fmtTime(o.recorded_at)],
  ]));
  return el("div", { class: "outcome-section" }, ...parts);
}

// ---- quorum: how many approvals a request needs, and who gave them ----------------

function quorumSummary(q) {
  let line = `${q.approvals.length} of ${q.required} approvals`;
  if (q.still_needed > 0) line += `; ${q.still_needed} more needed${q.group ? `, from ${q.group}` : ""}`;
  return line;
}

function quorumSection(q) {
  return el(
    "section",
    { class: "quorum", id: "quorum", "aria-label": "Approvals", "data-required": String(q.required), "data-approvals": String(q.approvals.length) },
    el("h4", {}, quorumSummary(q)),
    q.approvals.length
      ? el("ul", {}, q.approvals.map((a) => el("li", {}, `${a.approver.display_name} via ${a.approver.channel}`, a.approver.account ? ` (account ${a.approver.account})` : "", ` at ${fmtTime(a.approved_at)}`)))
      : el("p", { class: "muted" }, "No approvals yet."),
  );
}

// ---- why: the policies behind a request -------------------------------------------
// Policy text is the operator's and is shown as text only (text nodes, never HTML).

function policyIds(why) {
  return why.policies.map((p) => p.id).join(", ");
}

function whyMark(why) {
  switch (why.kind) {
    case "held": return `held by policy ${policyIds(why)}`;
    case "policy": return `decided by policy ${policyIds(why)}`;
    case "fallback": return `fallback by policy ${policyIds(why)}`;
    default: return "no policy matched";
  }
}

const ON_TIMEOUT = {
  approve: "approve (a timeout becomes a signed approval, by fallback)",
  reject: "reject (a timeout becomes a signed rejection, by fallback)",
};

function requirementRows(req) {
  const rows = [];
  if (req.timeout_hours !== undefined) rows.push(["@timeout_hours", `${req.timeout_hours} (people have ${req.timeout_hours} h at most)`]);
  if (req.on_timeout !== undefined) rows.push(["@on_timeout", ON_TIMEOUT[req.on_timeout] || req.on_timeout]);
  if (req.approvals !== undefined) rows.push(["@approvals", `${req.approvals} (that many distinct accounts must approve)`]);
  for (const group of req.approvers || []) rows.push(["@approvers", `${group} (every approver's account must be in it)`]);
  return rows;
}

function whyPolicy(p, why) {
  const parts = [el("h5", {}, el("code", {}, p.id), p.effect ? ` (${p.effect})` : null)];
  if (p.reason) parts.push(el("p", { class: "reason" }, p.reason));
  const rows = requirementRows(p.requirements || {});
  if (rows.length) parts.push(kvTable(rows));
  if (p.text !== undefined) parts.push(el("pre", { class: "policy-text" }, el("code", {}, p.text)));
  else if (why.in_force) parts.push(el("p", { class: "muted" }, "This policy is not in the set in force."));
  return el("li", { class: "why-policy", "data-policy-id": p.id }, ...parts);
}

function whySection(r, why) {
  if (!why) return null;
  const pending = r.status === "pending";
  const setLine = why.in_force
    ? el("p", { class: "muted" }, "Policy set ", el("code", {}, why.policy_set), " (in force).")
    : el("p", { class: "muted" }, "Policy set ", el("code", {}, why.policy_set),
      ", no longer in force: its text is in the log's policy_set_loaded entry with that digest.");
  let title;
  let note = null;
  if (why.kind === "held") {
    title = pending ? "A person decides because:" : "A person was asked to decide because:";
    // Held with no policy named: a policy could not be evaluated (its error is in the
    // server's log), and countersign fails closed.
    if (!why.policies.length) note = el("p", {}, "A policy could not be evaluated for this request (the server's log says why), so a person decides: countersign never approves by a rule it could not check.");
  }
  else if (why.kind === "policy") title = `Decided by policy ${policyIds(why)}`;
  else if (why.kind === "fallback") {
    title = `Decided by policy ${policyIds(why)}`;
    note = el("p", {}, "Nobody decided in time; the policy's @on_timeout decided (fallback).");
  } else {
    title = pending ? "No policy matched, so one person decides." : "No policy matched, so one person decided.";
    if ((r.requested_fields || []).length) note = el("p", { class: "muted" }, "A policy never approves a request that asks for reply fields: a person fills them in.");
  }
  return el(
    "section",
    { class: "why", id: "why", "aria-label": "Why", "data-kind": why.kind },
    el("h4", {}, title),
    note,
    why.policies.length ? el("ul", { class: "why-policies" }, why.policies.map((p) => whyPolicy(p, why))) : null,
    setLine,
  );
}

async function loadList() {
  const items = $("items");
  if (state.view === "rooms") return undefined;
  if (state.view === "users") return loadUsers();
  if (state.view === "tokens") return loadTokens();
  if (state.view === "operations") return loadOperations();
  if (state.view === "grants") return loadGrants();
  if (state.view === "records") return loadRecords();
  const params = new URLSearchParams();
  if (state.view === "needs") params.set("view", "pending");
  else {
    params.set("view", "history");
    if ($("q").value) params.set("q", $("q").value);
    if ($("agent").value) params.set("agent", $("agent").value);
    if ($("status-filter").value) params.set("status", $("status-filter").value);
  }
  try {
    const data = await api(`/ui/api/requests?${params}`);
    state.requests = data.requests;
  } catch (err) {
    items.replaceChildren(el("p", { class: "notice error" }, err.message));
    return;
  }
  if (state.view === "needs") {
    $("needs-count").textContent = state.requests.length;
    $("needs-count").classList.toggle("zero", state.requests.length === 0);
    announceNew(state.requests);
  }
  // Re-rendering replaces the cards; keep the keyboard where it was.
  const focused = document.activeElement && document.activeElement.closest && document.activeElement.closest(".card");
  const focusedId = focused ? focused.dataset.id : null;
  // A selected request that changed since it was ticked stays selected at the version
  // ticked: the batch reports it rather than deciding it (the bar counts it).
  const needs = state.view === "needs";
  items.replaceChildren(
    ...(needs && state.requests.length ? [batchBar()] : []),
    ...(state.requests.length
      ? state.requests.map((r) => (needs && r.can_decide ? selectable(r) : card(r)))
      : [el("p", { class: "empty" }, needs ? "Nothing needs you right now." : "No requests match.")]),
  );
  if (focusedId) {
    const again = [...items.querySelectorAll(".card")].find((c) => c.dataset.id === focusedId);
    if (again) again.focus();
  }
}

// ---- batch decisions: many requests, one confirmation -------------------------------

function selectable(request) {
  const box = el("input", {
    type: "checkbox",
    class: "select",
    "aria-label": `Select ${request.action_description}`,
    "data-id": request.request_id,
    checked: state.batch.has(request.request_id),
    onchange: (event) => {
      if (event.target.checked) state.batch.set(request.request_id, request.version);
      else state.batch.delete(request.request_id);
      state.batchConfirm = null;
      state.batchNotice = null;
      refreshBatchBar();
    },
  });
  return el("div", { class: "card-row" }, box, card(request));
}

function refreshBatchBar() {
  const bar = document.getElementById("batch");
  if (bar) bar.replaceWith(batchBar());
}

/** Selects every pending request from the same agent for the same tool as the first one
 * selected (what a person approving "all of these" usually means). */
function selectLikeFirst() {
  const first = state.requests.find((r) => state.batch.has(r.request_id));
  if (!first) return;
  const tool = (first.action_details || {}).tool;
  for (const r of state.requests) {
    if (r.can_decide && r.requested_by === first.requested_by && (r.action_details || {}).tool === tool) state.batch.set(r.request_id, r.version);
  }
  state.batchConfirm = null;
  loadList();
}

async function sendBatch(decision) {
  const requests = [...state.batch].map(([id, version]) => ({ id, version }));
  try {
    const result = await api("/ui/api/requests/decisions", { method: "POST", body: { decision, requests } });
    const word = decision === "approved" ? "Approved" : "Rejected";
    const lines = [`${word} ${result.decided.length} of ${requests.length}, each with its own proof.`];
    for (const n of result.not_decided) lines.push(`Not decided: ${n.request_id}: ${n.message}`);
    state.batchNotice = { kind: result.not_decided.length ? "error" : "ok", lines };
  } catch (err) {
    state.batchNotice = { kind: "error", lines: [err.message] };
  }
  state.batch.clear();
  state.batchConfirm = null;
  await loadList();
}

function batchBar() {
  const n = state.batch.size;
  const notice = state.batchNotice
    ? el("div", { class: `notice ${state.batchNotice.kind}`, role: "status", id: "batch-notice" }, state.batchNotice.lines.map((l) => el("div", {}, l)))
    : null;
  if (!n) return el("div", { class: "batch", id: "batch" }, notice, el("p", { class: "muted" }, "Tick requests to decide several at once."));
  const button = (decision, label) => {
    const confirming = state.batchConfirm === decision;
    return el("button", {
      class: `btn small ${decision === "approved" ? "approve" : "reject"}`,
      type: "button",
      id: `batch-${decision}`,
      onclick: () => {
        if (confirming) return sendBatch(decision);
        state.batchConfirm = decision;
        refreshBatchBar();
        return undefined;
      },
    }, confirming ? `Confirm: ${label.toLowerCase()} ${n} request${n === 1 ? "" : "s"}` : `${label} ${n}`);
  };
  const shown = new Map(state.requests.map((r) => [r.request_id, r.version]));
  const changed = [...state.batch].filter(([id, version]) => shown.get(id) !== version).length;
  return el(
    "div",
    { class: "batch", id: "batch", "data-selected": String(n), "data-changed": String(changed) },
    notice,
    el("span", {}, `${n} selected`, changed ? ` (${changed} changed since: it will be reported, not decided)` : ""),
    el("button", { class: "btn small", type: "button", id: "batch-like", onclick: selectLikeFirst }, "Select all like the first"),
    button("approved", "Approve"),
    button("rejected", "Reject"),
    el("button", { class: "btn small", type: "button", onclick: () => { state.batch.clear(); state.batchConfirm = null; loadList(); } }, "Clear"),
  );
}

function announceNew(pending) {
  const ids = new Set(pending.map((r) => r.request_id));
  if (state.notify && state.lastPendingIds.size) {
    for (const r of pending) {
      if (!state.lastPendingIds.has(r.request_id)) {
        new Notification("countersign: approval needed", { body: r.action_description, tag: r.request_id });
      }
    }
  }
  state.lastPendingIds = ids;
}

// ---- detail -----------------------------------------------------------------------

async function select(id) {
  state.selected = id;
  history.replaceState(null, "", `/requests/${encodeURIComponent(id)}`);
  document.querySelectorAll(".card").forEach((c) => c.setAttribute("aria-current", c.dataset.id === id ? "true" : "false"));
  await loadDetail();
  $("detail").classList.add("open");
}

async function loadDetail(notice) {
  if (!state.selected) return;
  const body = $("detail-body");
  try {
    const id = encodeURIComponent(state.selected);
    const [detail, why] = await Promise.all([api(`/ui/api/requests/${id}`), api(`/ui/api/requests/${id}/why`)]);
    state.detail = detail;
    state.why = why.why;
  } catch (err) {
    body.replaceChildren(el("p", { class: "notice error" }, err.message));
    return;
  }
  // A decision this page just made arrives over the live feed too: it is ours, not
  // "elsewhere", whichever of the two reloads lands last.
  if (state.decidedHere && state.decidedHere.id === state.detail.request_id) notice = state.decidedHere.notice;
  renderDetail(notice);
}

function kvTable(rows) {
  return el("table", { class: "kv" }, el("tbody", {}, rows.map(([k, v]) => el("tr", {}, el("th", { scope: "row" }, k), el("td", {}, v)))));
}

function renderDetail(notice) {
  const r = state.detail;
  const parts = [
    el("h3", {}, r.action_description),
    el("span", { class: `status ${r.status}` }, r.status.replace("_", " ")),
  ];
  if (notice) parts.push(el("div", { class: `notice ${notice.kind}`, role: "status" }, notice.text));
  const why = whySection(r, state.why);
  if (why) parts.push(why);
  if (r.quorum) parts.push(quorumSection(r.quorum));
  const detailRows = Object.entries(r.action_details || {});
  parts.push(
    detailRows.length ? kvTable(detailRows) : el("p", { class: "empty" }, "No details."),
    kvTable([
      ["Requested by", r.requested_by],
      ["Requested", fmtTime(r.requested_at)],
      ["Expires", r.status === "pending" ? el("span", {}, fmtTime(r.expires_at), " · ", countdown(r.expires_at)) : fmtTime(r.expires_at)],
      ["Request id", r.request_id],
      ["Action digest", r.action_digest],
    ]),
  );
  if (r.decision) {
    const d = r.decision;
    const who = d.authorization_type === "human"
      ? d.approvers.map((a) => `${a.display_name} via ${a.channel}`).join(", ")
      : `${d.authorization_type === "fallback" ? "fallback, " : ""}policy ${d.policy ? d.policy.id : "?"}`;
    parts.push(
      el("div", { class: `notice ${r.status === "approved" ? "ok" : "error"}` }, `${r.status === "approved" ? "Approved" : "Rejected"} by ${who} at ${fmtTime(d.decided_at)}`),
      kvTable([
        ["Comment", d.comment || "—"],
        ...Object.entries(d.fields || {}).map(([k, v]) => [k, v]),
        ["Usable until", fmtTime(d.valid_until)],
        ["Used", r.used ? `${r.used.tool} at ${fmtTime(r.used.recorded_at)}` : "not yet"],
      ]),
    );
    if (r.outcome) parts.push(outcomeSection(r));
  } else if (r.status !== "pending") {
    parts.push(el("div", { class: "notice error" }, r.status === "timed_out" ? "Timed out without a decision: not approved." : "Cancelled by the agent."));
  }
  if (r.proof) parts.push(proofTools(r));
  if (r.status === "pending" && r.can_decide) parts.push(decisionForm(r));
  else if (r.status === "pending") parts.push(el("div", { class: "notice info" }, r.cannot_decide_reason || "You cannot decide this request."));
  $("detail-body").replaceChildren(...parts);
}

function proofTools(r) {
  const download = () => {
    const blob = new Blob([JSON.stringify(r.proof, null, 2)], { type: "application/json" });
    const a = el("a", { href: URL.createObjectURL(blob), download: `${r.request_id}.proof.json` });
    a.click();
    URL.revokeObjectURL(a.href);
  };
  const command = `countersign verify ${r.request_id}.proof.json --server ${location.origin}`;
  const copy = async (event) => {
    await navigator.clipboard.writeText(command);
    event.target.textContent = "Copied";
  };
  return el(
    "div",
    {},
    el("div", { class: "proof-tools" },
      el("button", { class: "btn small", type: "button", onclick: download }, "Download proof"),
      el("button", { class: "btn small", type: "button", onclick: copy }, "Copy verify command")),
    el("code", { class: "cmd" }, command),
  );
}

// ---- grants: "yes to this kind of thing for a while" -------------------------------

const NUMBER = /^-?[0-9]+(\.[0-9]+)?$/;

/** The "also allow" part of the decision form: a standing grant of the request's agent
 * and tool, given with the approval. None for a request without a tool or with a quorum
 * (a grant cannot stand in for one). */
function grantFields(r) {
  const details = r.action_details || {};
  const tool = details.tool;
  if (!tool || r.quorum) return null;
  const agent = r.requested_by;
  const enable = el("input", { type: "checkbox", id: "grant-enable" });
  const hours = el("input", { id: "grant-hours", type: "number", min: "0.01", max: "720", step: "any", value: "1" });
  const uses = el("input", { id: "grant-uses", type: "number", min: "1", max: "10000", step: "1", placeholder: "any number" });
  const keys = Object.keys(details).filter((k) => k !== "tool");
  const pins = keys.map((key) => ({ key, box: el("input", { type: "checkbox", id: `grant-exact-${key}`, checked: !NUMBER.test(details[key]) }) }));
  const ceilings = keys.filter((k) => NUMBER.test(details[k])).map((key) => ({ key, input: el("input", { id: `grant-max-${key}`, inputmode: "decimal", value: details[key] }) }));
  const body = el(
    "div",
    { class: "grant-terms", hidden: true },
    el("label", { for: "grant-hours" }, "For how many hours"), hours,
    el("label", { for: "grant-uses" }, "At most this many requests"), uses,
    ...pins.map((p) => el("label", { class: "check", for: p.box.id }, p.box, ` only with ${p.key} = ${details[p.key]}`)),
    ...ceilings.map((c) => [el("label", { for: c.input.id }, `${c.key} at most (empty: any)`), c.input]),
  );
  enable.addEventListener("change", () => { body.hidden = !enable.checked; });
  const element = el(
    "fieldset",
    { class: "grant", id: "grant" },
    el("legend", {}, "Standing grant"),
    el("label", { class: "check", for: "grant-enable" }, enable, ` Also allow ${agent} to use ${tool} without asking`),
    body,
  );
  const value = () => {
    if (!enable.checked) return undefined;
    const max = {};
    for (const c of ceilings) if (c.input.value.trim()) max[c.key] = c.input.value.trim();
    return {
      for_seconds: Math.max(1, Math.round(Number(hours.value || "1") * 3600)),
      max_uses: uses.value ? Number(uses.value) : undefined,
      exact: pins.filter((p) => p.box.checked).map((p) => p.key),
      max,
    };
  };
  return { element, value };
}

function grantBounds(g) {
  const parts = [
    ...Object.entries(g.exact || {}).map(([k, v]) => `${k} = ${v}`),
    ...Object.entries(g.max || {}).map(([k, v]) => `${k} ≤ ${v}`),
  ];
  return parts.length ? parts.join(", ") : "any details";
}

async function loadGrants() {
  const items = $("items");
  let data;
  try {
    data = await api("/ui/api/grants");
  } catch (err) {
    items.replaceChildren(el("p", { class: "notice error" }, err.message));
    return;
  }
  if (!data.grants.length) {
    items.replaceChildren(el("p", { class: "empty" }, "No standing grants. Give one while approving a request (\u201calso allow\u201d)."));
    return;
  }
  const revoke = (g) => el("button", {
    class: "btn small", type: "button",
    onclick: async (event) => {
      event.target.disabled = true;
      try {
        await api(`/ui/api/grants/${encodeURIComponent(g.id)}/revoke`, { method: "POST", body: {} });
      } catch (err) {
        items.prepend(el("p", { class: "notice error" }, err.message));
      }
      await loadGrants();
    },
  }, "Revoke");
  items.replaceChildren(...data.grants.map((g) =>
    el("div", { class: "card grant-card", "data-grant-id": g.id, "data-status": g.status },
      el("div", { class: "desc" },
        el("span", { class: "grant-agent" }, g.agent.replace(/^(token|stdio|local):/, "")), " may use ",
        el("code", { class: "grant-tool" }, g.tool)),
      el("div", { class: "details grant-bounds" }, grantBounds(g)),
      el("div", { class: "meta" },
        el("span", { class: `status grant-status ${g.status}` }, g.status.replace("_", " ")),
        el("span", { class: "grant-uses" }, `${g.uses}${g.max_uses ? ` of ${g.max_uses}` : ""} used`),
        el("span", {}, `until ${fmtTime(g.expires_at)}`),
        el("span", {}, `by ${g.granted_by.display_name}`),
        g.status === "active" ? revoke(g) : null),
    )));
}

// ---- records: what the bridged processes did (records.json, docs/bridge.md) ---------

const amount = (n) => (n === null || n === undefined ? "\u2013" : String(Math.round(n * 1e9) / 1e9));

function recordsTable(rows, cls) {
  if (!rows.length) return el("p", { class: "empty" }, "None.");
  const head = ["id", "type", "state", "outcome", "cost", "result", "request", "label"];
  return el("table", { class: `records-table ${cls}` },
    el("thead", {}, el("tr", {}, ...head.map((h) => el("th", { scope: "col" }, h)))),
    el("tbody", {}, ...rows.map((r) => el("tr", { "data-record-id": r.id || "" },
      el("td", {}, r.id || "\u2013"),
      el("td", {}, r.record_type || "\u2013"),
      el("td", { class: r.resolved ? "resolved" : "open" }, r.resolved ? "resolved" : "open"),
      el("td", {}, r.outcome || "\u2013"),
      el("td", { class: "num" }, amount(r.cost)),
      el("td", { class: "num" }, amount(r.result)),
      el("td", { class: "record-request" }, r.request
        ? el("a", { href: `/requests/${encodeURIComponent(r.request.request_id)}` }, `${r.request.status}${r.request.outcome ? ` (${r.request.outcome})` : ""}`)
        : "\u2013"),
      el("td", {}, r.label || "")))));
}

async function loadRecords() {
  const items = $("items");
  let data;
  try {
    data = await api("/ui/api/records");
  } catch (err) {
    items.replaceChildren(el("p", { class: "notice error" }, err.message));
    return;
  }
  if (!data.bridges.length) {
    items.replaceChildren(el("p", { class: "empty" }, "No bridged processes. Add a [[bridge]] to the config (docs/bridge.md)."));
    return;
  }
  items.replaceChildren(...data.bridges.map((b) => {
    const t = b.totals;
    if (b.error) {
      return el("div", { class: "card records-card", "data-bridge": b.bridge },
        el("div", { class: "desc" }, b.bridge), el("p", { class: "notice error" }, b.error));
    }
    const types = el("table", { class: "records-types" },
      el("thead", {}, el("tr", {}, ...["type", "records", "resolved", "open", "cost", "result", "exposure"].map((h) => el("th", { scope: "col" }, h)))),
      el("tbody", {}, ...b.by_type.map((row) => el("tr", {},
        el("td", {}, row.record_type), el("td", { class: "num" }, String(row.records)),
        el("td", { class: "num" }, String(row.resolved)), el("td", { class: "num" }, String(row.open)),
        el("td", { class: "num" }, amount(row.cost)), el("td", { class: "num" }, amount(row.result)),
        el("td", { class: "num" }, amount(row.exposure))))));
    return el("div", { class: "card records-card", "data-bridge": b.bridge },
      el("div", { class: "desc" }, b.bridge, " ", el("code", {}, b.records_file)),
      el("div", { class: "meta records-totals" },
        el("span", { class: "records-count" }, `${t.records} records: ${t.resolved} resolved, ${t.open} open`),
        el("span", { class: "records-exposure" }, `exposure ${amount(t.exposure)}`),
        el("span", {}, `cost ${amount(t.cost)}, result ${amount(t.result)}`),
        el("span", {}, `${t.countersign_approved} approved through countersign`),
        el("span", {}, `${b.awaiting_decision} awaiting a decision`)),
      types,
      el("h3", {}, `Open records (exposure ${amount(t.exposure)})`),
      recordsTable(b.open, "records-open"),
      el("h3", {}, "Latest records"),
      recordsTable(b.recent, "records-latest"));
  }));
}

function decisionForm(r) {
  const comment = el("textarea", { id: "comment", rows: "2", maxlength: "4096" });
  const grant = grantFields(r);
  const fieldInputs = (r.requested_fields || []).map((name) => ({
    name,
    input: el("input", { id: `field-${name}`, name, required: true }),
  }));
  const approve = el("button", { class: "btn approve", type: "button", id: "approve" }, "Approve");
  const reject = el("button", { class: "btn reject", type: "button", id: "reject" }, "Reject");
  const status = el("div", { role: "alert" });
  const send = async (decision) => {
    const fields = {};
    for (const f of fieldInputs) {
      if (decision === "approved" && !f.input.value.trim()) {
        status.className = "notice error";
        status.textContent = `Fill in ${f.name} to approve.`;
        f.input.focus();
        return;
      }
      if (f.input.value.trim()) fields[f.name] = f.input.value.trim();
    }
    approve.disabled = reject.disabled = true;
    try {
      const body = { decision, comment: comment.value || null, fields, expected_version: r.version };
      if (decision === "approved" && grant && grant.value()) body.grant = grant.value();
      const after = await api(`/ui/api/requests/${encodeURIComponent(r.request_id)}/decision`, { method: "POST", body });
      const recorded = decision === "approved" && after && after.status === "pending" && after.quorum;
      let text = recorded ? `Your approval is recorded: ${quorumSummary(after.quorum)}.` : decision === "approved" ? "Approved. The agent has its proof." : "Rejected. The agent has been told.";
      if (after && after.grant) text += ` Grant ${after.grant.id}: ${after.grant.tool} allowed until ${fmtTime(after.grant.expires_at)}.`;
      if (after && after.grant_error) text += ` ${after.grant_error}`;
      const done = { kind: "ok", text };
      state.decidedHere = { id: r.request_id, notice: done };
      await loadDetail(done);
      await loadList();
    } catch (err) {
      approve.disabled = reject.disabled = false;
      if (err.status === 409) {
        await loadDetail({ kind: "error", text: err.message });
      } else {
        status.className = "notice error";
        status.textContent = err.message;
      }
    }
  };
  approve.addEventListener("click", () => send("approved"));
  reject.addEventListener("click", () => send("rejected"));
  return el(
    "form",
    { class: "decide", onsubmit: (e) => e.preventDefault() },
    ...fieldInputs.map((f) => [el("label", { for: f.input.id }, f.name), f.input]),
    el("label", { for: "comment" }, "Comment (for a rejection, the reason the agent receives)"),
    comment,
    grant ? grant.element : null,
    status,
    el("div", { class: "actions" }, approve, reject),
  );
}

// ---- users (admins) ---------------------------------------------------------------

async function loadUsers() {
  const items = $("items");
  let data;
  try {
    data = await api("/ui/api/users");
  } catch (err) {
    items.replaceChildren(el("p", { class: "notice error" }, err.message));
    return;
  }
  const username = el("input", { id: "invite-username", required: true });
  const role = el("select", { id: "invite-role" }, el("option", { value: "approver" }, "approver"), el("option", { value: "admin" }, "admin"));
  const result = el("div", { role: "status" });
  // The last link created stays on screen across re-renders (live updates reload this
  // view), or the admin would never get to copy it.
  if (state.lastInvite) {
    result.className = "notice ok";
    result.replaceChildren(`Send this one-time link to ${state.lastInvite.username} (it expires in 24 hours): `, el("code", { class: "cmd" }, state.lastInvite.link));
  }
  const invite = async () => {
    try {
      const made = await api("/ui/api/users/invite", { method: "POST", body: { username: username.value, role: role.value } });
      state.lastInvite = { username: made.user.username, link: made.link };
      await loadUsers();
    } catch (err) {
      result.className = "notice error";
      result.textContent = err.message;
    }
  };
  const rows = data.users.map((u) =>
    el("tr", {},
      el("td", {}, u.username),
      el("td", {}, u.display_name),
      el("td", {}, u.role),
      el("td", {}, u.disabled ? "disabled" : u.active ? "active" : "invited"),
      el("td", {}, u.disabled || u.id === state.me.id ? "" : el("button", {
        class: "btn small", type: "button",
        onclick: async () => {
          await api(`/ui/api/users/${encodeURIComponent(u.id)}/disable`, { method: "POST", body: {} });
          await loadUsers();
        },
      }, "Disable"))));
  items.replaceChildren(
    el("table", { class: "users" },
      el("thead", {}, el("tr", {}, ["Username", "Name", "Role", "State", ""].map((h) => el("th", { scope: "col" }, h)))),
      el("tbody", {}, rows)),
    el("form", { class: "decide", onsubmit: (e) => { e.preventDefault(); invite(); } },
      el("label", { for: "invite-username" }, "Invite an approver: username"), username,
      el("label", { for: "invite-role" }, "Role"), role,
      el("div", { class: "actions" }, el("button", { class: "btn primary", type: "submit" }, "Create invitation link")),
      result),
  );
}

// ---- process operations ------------------------------------------------------------

async function loadOperations() {
  const items = $("items");
  let data;
  try {
    data = await api("/ui/api/operations");
  } catch (err) {
    items.replaceChildren(el("p", { class: "notice error" }, err.message));
    return;
  }
  if (!data.operations.length) {
    items.replaceChildren(el("p", { class: "empty" }, `No process operations among the ${data.scanned} newest requests. Restarts, commands and parameter changes asked for through the approval-gate profile, the CLI or /api/v1/operate appear here.`));
    return;
  }
  const decided = (o) => {
    if (!o.decision) return o.status;
    const who = o.decision.approvers.map((a) => a.display_name).join(", ") || o.decision.authorization_type;
    return `${o.decision.decision} by ${who}`;
  };
  const outcome = (o) => {
    if (!o.outcome) return o.status === "approved" ? "not run yet" : "";
    const exit = o.outcome.details && o.outcome.details.exit_code !== undefined ? ` (exit ${o.outcome.details.exit_code})` : "";
    return `${o.outcome.status}${exit}${o.outcome.summary ? `: ${o.outcome.summary}` : ""}`;
  };
  const rows = data.operations.map((o) =>
    el("tr", { "data-id": o.request_id },
      el("td", {}, el("time", { datetime: o.requested_at }, fmtTime(o.requested_at))),
      el("td", {}, el("button", { class: "link", type: "button", onclick: () => select(o.request_id) }, o.action_description)),
      el("td", {}, o.requested_by),
      el("td", { class: "op-decision" }, decided(o)),
      el("td", { class: "op-outcome" }, outcome(o))));
  items.replaceChildren(
    el("table", { class: "users operations" },
      el("thead", {}, el("tr", {}, ["Asked", "Operation", "Asked by", "Decision", "What came of it"].map((h) => el("th", { scope: "col" }, h)))),
      el("tbody", {}, rows)));
}

// ---- tokens (admins) --------------------------------------------------------------

async function loadTokens() {
  const items = $("items");
  let data;
  try {
    data = await api("/ui/api/tokens");
  } catch (err) {
    items.replaceChildren(el("p", { class: "notice error" }, err.message));
    return;
  }
  const name = el("input", { id: "token-name", required: true, maxlength: "64", autocomplete: "off" });
  const role = el("select", { id: "token-role" }, ["agent", "approver", "executor", "admin"].map((r) => el("option", { value: r }, r)));
  const scopes = el("input", { id: "token-scopes", placeholder: "all of the role's", autocomplete: "off" });
  const expires = el("input", { id: "token-expires", placeholder: "never (e.g. 30d, 12h)", autocomplete: "off" });
  const result = el("div", { role: "status", id: "token-result" });
  // The secret is shown once: it stays on screen across re-renders (live updates
  // reload this view) until the admin leaves the view, and is never fetched again.
  if (state.lastToken) {
    result.className = "notice ok";
    result.replaceChildren(
      `Token for ${state.lastToken.name} (${state.lastToken.role}). Copy it now: it is shown only once and stored only as a hash. `,
      el("code", { class: "cmd", id: "token-secret" }, state.lastToken.token));
  }
  const create = async () => {
    const body = { name: name.value, role: role.value };
    if (scopes.value.trim()) body.scopes = scopes.value.split(",").map((s) => s.trim()).filter(Boolean);
    if (expires.value.trim()) body.expires = expires.value.trim();
    try {
      state.lastToken = await api("/ui/api/tokens", { method: "POST", body });
      await loadTokens();
    } catch (err) {
      result.className = "notice error";
      result.textContent = err.message;
    }
  };
  const rows = data.tokens.map((t) =>
    el("tr", { "data-name": t.name },
      el("td", {}, t.name),
      el("td", {}, t.role),
      el("td", {}, t.scoped ? t.scopes : "all"),
      el("td", {}, t.expires_at ? el("time", { datetime: t.expires_at }, t.expires_at) : "never"),
      el("td", { class: "token-status" }, t.status),
      el("td", {}, t.status !== "active" ? "" : el("button", {
        class: "btn small", type: "button", "aria-label": `Revoke ${t.name}`,
        onclick: async () => {
          try {
            await api(`/ui/api/tokens/${encodeURIComponent(t.id)}/revoke`, { method: "POST", body: {} });
          } catch (err) {
            result.className = "notice error";
            result.textContent = err.message;
            return;
          }
          await loadTokens();
        },
      }, "Revoke"))));
  items.replaceChildren(
    el("table", { class: "users tokens" },
      el("thead", {}, el("tr", {}, ["Name", "Role", "Scopes", "Expires", "State", ""].map((h) => el("th", { scope: "col" }, h)))),
      el("tbody", {}, rows)),
    el("form", { class: "decide", onsubmit: (e) => { e.preventDefault(); create(); } },
      el("label", { for: "token-name" }, "New token: name (an agent's, a service's or an approver's)"), name,
      el("label", { for: "token-role" }, "Role"), role,
      el("label", { for: "token-scopes" }, "Scopes (comma-separated, optional)"), scopes,
      el("label", { for: "token-expires" }, "Expires (optional)"), expires,
      el("div", { class: "actions" }, el("button", { class: "btn primary", type: "submit" }, "Create token")),
      result),
  );
}

// ---- live updates -----------------------------------------------------------------

function connect() {
  const source = new EventSource("/ui/events");
  source.addEventListener("open", () => {
    $("conn").textContent = "live";
    $("conn").classList.remove("down");
    loadList();
    loadDetail();
  });
  source.addEventListener("change", (event) => {
    const change = JSON.parse(event.data);
    if (state.rooms) state.rooms.onChange(change);
    loadList();
    if (change.subject && change.subject === state.selected) {
      const notice = change.type === "request_decided" && state.detail && state.detail.status === "pending"
        ? { kind: "info", text: "This request was just decided elsewhere." }
        : undefined;
      loadDetail(notice);
    }
  });
  source.addEventListener("error", () => {
    $("conn").textContent = "reconnecting…";
    $("conn").classList.add("down");
    // EventSource retries by itself; if the session ended, go to sign-in.
    if (source.readyState === EventSource.CLOSED) setTimeout(connect, 2000);
  });
}

// ---- start ------------------------------------------------------------------------

function setView(view) {
  state.view = view;
  document.querySelectorAll("nav.side button[data-view]").forEach((b) => {
    if (b.dataset.view === view) b.setAttribute("aria-current", "page");
    else b.removeAttribute("aria-current");
  });
  if (view !== "tokens") state.lastToken = undefined;
  $("list-title").textContent = { needs: "Needs you", history: "History", users: "Users", tokens: "Tokens", operations: "Operations", rooms: "Rooms", grants: "Grants", records: "Records" }[view];
  $("filters").hidden = view !== "history";
  if (view === "rooms") {
    state.rooms.show();
    return;
  }
  state.rooms.hide();
  if (location.search) history.replaceState(null, "", "/");
  loadList();
}

async function start() {
  const me = await api("/ui/api/me");
  state.me = me.user;
  state.csrf = me.csrf_token;
  $("who").textContent = `${me.user.display_name} (${me.user.role})`;
  $("nav-users").hidden = me.user.role !== "admin";
  $("nav-tokens").hidden = me.user.role !== "admin";
  document.querySelectorAll("nav.side button[data-view]").forEach((b) => b.addEventListener("click", () => setView(b.dataset.view)));
  state.rooms = createRooms({
    api,
    me: me.user,
    openRequest: (id) => {
      setView("needs");
      select(id);
    },
  });
  const roomLink = await state.rooms.init();
  for (const id of ["q", "agent", "status-filter"]) $(id).addEventListener("input", () => loadList());
  $("sheet-close").addEventListener("click", () => $("detail").classList.remove("open"));
  $("logout").addEventListener("click", async () => {
    await api("/ui/logout", { method: "POST", body: {} }).catch(() => {});
    location.assign("/login");
  });
  $("logout-all").addEventListener("click", async () => {
    await api("/ui/logout-all", { method: "POST", body: {} }).catch(() => {});
    location.assign("/login");
  });
  $("notify").addEventListener("click", async () => {
    if (!("Notification" in window)) return;
    state.notify = (await Notification.requestPermission()) === "granted";
    $("notify").textContent = state.notify ? "Notifications on" : "Notify me";
  });
  const match = location.pathname.match(/^\/requests\/(.+)$/);
  if (match) state.selected = decodeURIComponent(match[1]);
  if (roomLink) setView("rooms");
  else await loadList();
  if (state.selected) select(state.selected);
  connect();
}

// The installable app's service worker (sw.js): the shell offline, never a decision.
if ("serviceWorker" in navigator) {
  navigator.serviceWorker.register("/sw.js", { scope: "/" }).catch(() => {});
}

start().catch((err) => {
  if (err.message !== "signed out") $("detail-body").replaceChildren(el("p", { class: "notice error" }, err.message));
});
