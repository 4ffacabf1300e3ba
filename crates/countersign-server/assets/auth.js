// Sign-in, first-admin setup and invitations. Plain fetch with JSON; the server sets the
// session cookie (HttpOnly, SameSite=Strict) and answers with where to go next.

import { localTimes } from "/assets/time.js";

const form = document.querySelector("form.auth");
const message = document.getElementById("message");

function show(text, kind = "error") {
  message.className = `notice ${kind}`;
  // The server's messages carry UTC times (an invitation's expiry); show the reader's.
  message.textContent = localTimes(text);
}

const params = new URLSearchParams(location.search);
const token = params.get("token");
if (form.id === "setup-form") {
  // The token travels in the URL fragment-free query only until we read it; remove it
  // from the address bar so it does not linger in history or get shared by accident.
  history.replaceState(null, "", location.pathname);
  if (!token) show("This page needs the link from your invitation or from the server's log.");
  if (params.get("kind") === "invite") {
    document.getElementById("setup-title").textContent = "Join countersign";
  }
  if (params.get("username")) {
    document.getElementById("username").value = params.get("username");
  }
}

form.addEventListener("submit", async (event) => {
  event.preventDefault();
  const body = Object.fromEntries(new FormData(form).entries());
  if (token) body.token = token;
  const button = form.querySelector("button[type=submit]");
  button.disabled = true;
  try {
    const response = await fetch(form.dataset.action, {
      method: "POST",
      headers: { "content-type": "application/json" },
      credentials: "same-origin",
      body: JSON.stringify(body),
    });
    const data = await response.json().catch(() => ({}));
    if (response.ok) {
      // Back to the page that sent us here (a request from an emailed link), if it is
      // one of this server's own paths.
      const next = params.get("next");
      const local = next && /^\/requests\/[A-Za-z0-9_-]+$/.test(next);
      location.assign(form.id === "login-form" && local ? next : data.next || "/");
      return;
    }
    show((data.error && data.error.message) || `Failed (${response.status})`);
  } catch (err) {
    show(`Could not reach countersign: ${err.message}`);
  } finally {
    button.disabled = false;
  }
});
