// The page an emailed decision link opens. The one-time token is in the URL fragment
// (never sent to a server, never in a Referer); this script reads it, removes it from
// the address bar, and sends it only in POST bodies: one that shows the request and
// changes nothing, and, when the approver clicks Confirm, one that decides.

import { localTime, localTimes } from "/assets/time.js";

const $ = (id) => document.getElementById(id);

function show(text, kind = "error") {
  const message = $("message");
  message.hidden = false;
  message.className = `notice ${kind}`;
  // The server's messages carry UTC times; show the reader's.
  message.textContent = localTimes(text);
}

const token = new URLSearchParams(location.hash.slice(1)).get("t");
if (location.hash) history.replaceState(null, "", location.pathname);

async function post(path, body) {
  const response = await fetch(path, {
    method: "POST",
    headers: { "content-type": "application/json", accept: "application/json" },
    credentials: "omit",
    body: JSON.stringify(body),
  });
  const data = await response.json().catch(() => ({}));
  if (!response.ok) {
    throw new Error((data.error && data.error.message) || `HTTP ${response.status}`);
  }
  return data;
}

function when(iso) {
  return localTime(iso);
}

function row(key, value) {
  const tr = document.createElement("tr");
  const th = document.createElement("th");
  th.textContent = key;
  const td = document.createElement("td");
  td.textContent = value;
  tr.append(th, td);
  return tr;
}

function render(data) {
  const r = data.request;
  $("request").hidden = false;
  $("description").textContent = r.action_description;
  const details = $("details");
  details.replaceChildren(
    ...Object.entries(r.action_details || {}).map(([k, v]) => row(k, v)),
  );
  const meta = $("meta");
  meta.replaceChildren(
    `Asked by ${r.requested_by} at ${when(r.requested_at)}`,
    document.createElement("br"),
    `Expires ${when(r.expires_at)}; not approved unless someone approves it`,
    document.createElement("br"),
    `Request ${r.request_id}`,
  );
  if (!data.can_decide) {
    $("decide").hidden = true;
    show(data.outcome || `This request is ${r.status}.`, "info");
    return;
  }
  $("message").hidden = true;
  $("decide").hidden = false;
  $("as").textContent =
    `You are deciding as ${data.approver.display_name} (${data.approver.username}). This link works once, until ${when(data.token_expires_at)}.`;
  const fields = $("fields");
  fields.replaceChildren();
  for (const name of r.requested_fields || []) {
    const label = document.createElement("label");
    label.textContent = `${name} (required to approve)`;
    const input = document.createElement("input");
    input.dataset.field = name;
    label.append(input);
    fields.append(label);
  }
}

async function decide(decision) {
  for (const b of document.querySelectorAll("#decide button")) b.disabled = true;
  const fields = {};
  if (decision === "approve") {
    for (const input of document.querySelectorAll("#fields input")) {
      fields[input.dataset.field] = input.value.trim();
    }
  }
  try {
    const data = await post("/email/api/decision", {
      token,
      decision,
      comment: $("comment").value,
      fields,
    });
    $("decide").hidden = true;
    show(`Done. ${data.outcome}.`, "ok");
  } catch (err) {
    show(err.message);
    for (const b of document.querySelectorAll("#decide button")) b.disabled = false;
  }
}

$("approve").addEventListener("click", () => decide("approve"));
$("reject").addEventListener("click", () => decide("reject"));

if (!token) {
  show("This page needs the link from your email (it carries a one-time code after #).");
} else {
  post("/email/api/request", { token }).then(render, (err) => show(err.message));
}
