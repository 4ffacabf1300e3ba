// End-to-end tests of the approver's dashboard in real headless Chromium (Debian's
// `chromium`, driven by playwright-core) against a real `countersign serve`.
//
//   COUNTERSIGN_BIN=target/debug/countersign node tests/browser/run.mjs [--screenshots DIR]
//
// Starts its own `countersign serve --listen 127.0.0.1:0` in a temporary data directory,
// runs the tests in order (they share the server and its accounts), saves screenshots at
// phone (390x844) and desktop (1440x900) sizes to DIR (default: target/screenshots, or
// $SCREENSHOTS_DIR), and exits non-zero when a test fails. Tests skipped for a known bug
// run too with RUN_KNOWN_BUGS=1.

import assert from "node:assert/strict";
import fs from "node:fs";
import http from "node:http";
import os from "node:os";
import path from "node:path";
import { after, before, test as nodeTest } from "node:test";
import { fileURLToPath } from "node:url";

import { contrasts, controlCount, misplacedAriaSelected, unlabelledControls, unnamedButtons } from "./lib/a11y.mjs";
import { DESKTOP, PHONE, expectViolations, launch, newContext, problems, recordedViolations } from "./lib/browser.mjs";
import { McpClient, statementOf } from "./lib/mcp.mjs";
import { Countersign, killChildren } from "./lib/server.mjs";

const HERE = path.dirname(fileURLToPath(import.meta.url));
const REPO = path.resolve(HERE, "..", "..");

function screenshotsDir() {
  const i = process.argv.indexOf("--screenshots");
  if (i >= 0 && process.argv[i + 1]) return path.resolve(process.argv[i + 1]);
  if (process.env.SCREENSHOTS_DIR) return path.resolve(process.env.SCREENSHOTS_DIR);
  return path.join(REPO, "target", "screenshots");
}

const SHOTS = screenshotsDir();
const ADMIN = { username: "ada", name: "Ada Lovelace", password: "analytical-engine-1843" };
const APPROVER = { username: "grace", name: "Grace Hopper", password: "cobol-and-nanoseconds" };
const LOCKED = { username: "carol", password: "carols-own-password" };

/** What the tests share: the server, tokens, the browser and the admin's signed-in state. */
const s = {
  server: null,
  browser: null,
  agentToken: null,
  approverToken: null,
  adminState: null,
  approverState: null,
  startedAt: Date.now(),
  shots: [],
};

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// Under a parent that holds our stdin open (crates/countersign/tests/it/browser.rs), its
// closing means "stop now": the parent gave up or died. Close Chromium, kill serve, exit.
if (process.env.BROWSER_TESTS_STDIN_WATCHDOG === "1") {
  const stop = async () => {
    console.error("# stdin closed: the parent is gone; stopping the browser suite");
    await Promise.race([s.browser?.close().catch(() => {}), sleep(3_000)]);
    killChildren();
    s.server?.cleanup();
    process.exit(1);
  };
  process.stdin.on("end", stop);
  process.stdin.on("error", stop);
  process.stdin.resume();
  process.stdin.unref(); // the watch alone does not keep the suite running
}

/** A context signed in as the admin (sharing the admin's session). */
const adminContext = (size = DESKTOP) =>
  newContext(s.browser, { ...size, baseURL: s.server.base, storageState: s.adminState });

/** Opens `path` and waits until the page's live connection (SSE) is open. */
async function openLive(context, p) {
  return gotoLive(await context.newPage(), p);
}

/** Navigates `page` to `path` and waits until its live connection (SSE) is open. */
async function gotoLive(page, p) {
  const live = page.waitForResponse((r) => r.url().endsWith("/ui/events") && r.status() === 200);
  await page.goto(p);
  await live;
  return page;
}

/** The request as an approver sees it through REST. */
async function restRequest(id) {
  const r = await s.server.http("GET", `/api/v1/requests/${id}`, { token: s.approverToken });
  assert.equal(r.status, 200, r.text);
  return r.body;
}

/** A room message through REST as the agent token; returns its id. */
async function roomPost(room, text, type = "note") {
  const r = await s.server.http("POST", `/api/v1/rooms/${room}/messages`, { token: s.agentToken, json: { text, type } });
  assert.equal(r.status, 200, r.text);
  return r.body.id;
}

/** A blocker reported over MCP by the agent token; returns its id. */
async function roomBlocker(room, description) {
  const agent = await mcpAgent();
  return (await agent.callTool("report_blocker", { room, description })).blocker_id;
}

/** A request through REST as the agent token (for tests that are not about MCP). */
let seq = 0;
function createRequest(description, details = {}, extra = {}) {
  seq += 1;
  return s.server.createRequest(s.agentToken, {
    action_description: description,
    action_details: details,
    idempotency_key: `browser-test-${seq}-${Date.now()}`,
    ...extra,
  });
}

/** An MCP agent over Streamable HTTP at /mcp. */
async function mcpAgent() {
  const client = new McpClient(s.server.url("/mcp"), s.agentToken);
  await client.initialize();
  return client;
}

/** Starts a call and tracks whether it has finished. */
function inFlight(promise) {
  const tracked = { settled: false, value: undefined, error: undefined };
  tracked.promise = promise.then(
    (value) => {
      tracked.settled = true;
      tracked.value = value;
      return value;
    },
    (error) => {
      tracked.settled = true;
      tracked.error = error;
      throw error;
    },
  );
  tracked.promise.catch(() => {});
  return tracked;
}

/** Waits until the signed checkpoint stops growing (appends are batched for 100 ms). */
async function stableLogSize() {
  let last = await s.server.logSize();
  for (let i = 0; i < 20; i++) {
    await sleep(300);
    const now = await s.server.logSize();
    if (now === last) return now;
    last = now;
  }
  return last;
}

async function shot(page, name) {
  const file = path.join(SHOTS, `${name}.png`);
  await page.screenshot({ path: file, fullPage: false });
  s.shots.push(file);
}

/**
 * A test whose pages are photographed when it fails (to SHOTS/failures/) and whose browser
 * contexts are closed either way, so one failure does not leak into the next test.
 */
function test(name, options, fn) {
  if (typeof options === "function") [options, fn] = [{}, options];
  // RUN_KNOWN_BUGS=1 runs the tests skipped for a reported bug (to check a fix).
  if (options.skip && process.env.RUN_KNOWN_BUGS === "1") options = { ...options, skip: false };
  nodeTest(name, options, async (t) => {
    try {
      await fn(t);
    } catch (error) {
      const dir = path.join(SHOTS, "failures");
      fs.mkdirSync(dir, { recursive: true });
      const slug = name.replace(/[^a-z0-9]+/gi, "-").slice(0, 60).replace(/-$/, "");
      let n = 0;
      for (const context of s.browser?.contexts() ?? []) {
        for (const page of context.pages()) {
          n += 1;
          const file = path.join(dir, `${slug}-${n}.png`);
          if (await page.screenshot({ path: file }).then(() => true, () => false)) {
            console.log(`# failure screenshot of ${page.url()}: ${file}`);
          }
        }
      }
      throw error;
    } finally {
      for (const context of s.browser?.contexts() ?? []) await context.close().catch(() => {});
    }
  });
}

// ---- setup ---------------------------------------------------------------------------

before(async () => {
  fs.mkdirSync(SHOTS, { recursive: true });
  fs.rmSync(path.join(SHOTS, "failures"), { recursive: true, force: true });
  s.server = await new Countersign(process.env.COUNTERSIGN_BIN).start();
  s.agentToken = await s.server.token("agent", "billing-agent");
  s.approverToken = await s.server.token("approver", "ops-oncall");
  s.server.readToken = s.approverToken;
  s.browser = await launch();
});

after(async () => {
  if (s.browser) await s.browser.close().catch(() => {});
  if (s.server) s.server.cleanup();
  killChildren();
  if (s.shots.length) {
    console.log(`\nscreenshots (${s.shots.length}) in ${SHOTS}:`);
    for (const file of s.shots) console.log(`  ${file}`);
  }
  console.log(`browser run took ${((Date.now() - s.startedAt) / 1000).toFixed(1)} s`);
});

// ---- sign-in -------------------------------------------------------------------------

test("the first admin signs up through serve's setup link, signs out, and signs in with the password", async () => {
  const context = await newContext(s.browser, { ...DESKTOP, baseURL: s.server.base });
  const page = await context.newPage();
  // Before anyone signs in, the dashboard sends you to sign in.
  await page.goto("/");
  assert.equal(new URL(page.url()).pathname, "/login");

  await page.goto(s.server.setupLink);
  await page.getByRole("heading", { name: "Create your account" }).waitFor();
  assert.equal(new URL(page.url()).search, "", "the setup token stays in the address bar");
  await page.getByLabel("Username").fill(ADMIN.username);
  await page.getByLabel("Your name").fill(ADMIN.name);
  await page.getByLabel("Password").fill(ADMIN.password);
  await page.getByRole("button", { name: "Create account" }).click();
  await page.waitForURL((u) => u.pathname === "/");
  await page.locator("#who", { hasText: `${ADMIN.name} (admin)` }).waitFor();
  await page.getByRole("button", { name: "Users" }).waitFor();

  // The session cookie is HttpOnly and SameSite=Strict.
  const cookies = await context.cookies();
  const session = cookies.find((c) => c.name === "cs_session");
  assert.ok(session, `no session cookie among ${JSON.stringify(cookies)}`);
  assert.equal(session.httpOnly, true);
  assert.equal(session.sameSite, "Strict");

  // Sign out from the menu: the session ends.
  await page.locator("summary", { hasText: "Menu" }).click();
  await page.getByRole("button", { name: "Sign out", exact: true }).click();
  await page.waitForURL((u) => u.pathname === "/login");
  await page.goto("/");
  assert.equal(new URL(page.url()).pathname, "/login", "still signed in after signing out");

  // The setup link works once.
  const again = await context.newPage();
  await again.goto(s.server.setupLink);
  await again.getByLabel("Username").fill("mallory");
  await again.getByLabel("Your name").fill("Mallory");
  await again.getByLabel("Password").fill("mallory-password-123");
  await again.getByRole("button", { name: "Create account" }).click();
  await again.locator("#message.error").waitFor();
  assert.equal(new URL(again.url()).pathname, "/setup");
  await again.close();

  // Sign in with the password.
  await page.getByLabel("Username").fill(ADMIN.username);
  await page.getByLabel("Password").fill(ADMIN.password);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.waitForURL((u) => u.pathname === "/");
  await page.locator("#who", { hasText: `${ADMIN.name} (admin)` }).waitFor();
  s.adminState = await context.storageState();
  await context.close();
});

test("an invited approver joins through the invitation link from `countersign user add`", async () => {
  const printed = new URL(await s.server.invite(APPROVER.username, "approver"));
  assert.equal(printed.pathname, "/invite");
  // The CLI does not know the port of a `serve` started on port 0; it prints the
  // configured public URL. Open the same path and query on the running server.
  const link = s.server.url(printed.pathname + printed.search);
  const context = await newContext(s.browser, { ...DESKTOP, baseURL: s.server.base });
  const page = await context.newPage();
  await page.goto(link);
  await page.getByRole("heading", { name: "Join countersign" }).waitFor();
  assert.equal(await page.getByLabel("Username").inputValue(), APPROVER.username);
  await page.getByLabel("Your name").fill(APPROVER.name);
  await page.getByLabel("Password").fill(APPROVER.password);
  await page.getByRole("button", { name: "Create account" }).click();
  await page.waitForURL((u) => u.pathname === "/");
  await page.locator("#who", { hasText: `${APPROVER.name} (approver)` }).waitFor();
  assert.equal(await page.getByRole("button", { name: "Users" }).isVisible(), false, "an approver sees the Users view");
  s.approverState = await context.storageState();
  await context.close();
});

// Regression: the Users view's own refresh (and the live update of the invitation) used to
// rebuild the view and wipe the one-time link the admin must send.
test("an admin invites an approver from the Users view and is shown the link to send", async () => {
  const context = await adminContext();
  const page = await openLive(context, "/");
  await page.getByRole("button", { name: "Users" }).click();
  await page.getByLabel("Invite an approver: username").fill("erin");
  const answered = page.waitForResponse((r) => r.url().endsWith("/ui/api/users/invite"));
  await page.getByRole("button", { name: "Create invitation link" }).click();
  const response = await answered;
  assert.equal(response.status(), 200);
  const { link } = await response.json();
  await page.locator("table.users", { hasText: "erin" }).waitFor();
  await sleep(1000); // past the view's refresh and the live update
  const shown = page.locator("code.cmd", { hasText: "/invite?" });
  assert.equal(await shown.count(), 1, "the invitation link is not on the page");
  assert.equal((await shown.textContent()).trim(), link);
  assert.equal(new URL(link).origin, s.server.base, `the link ${link} does not point at this server`);
});

test("an admin creates a token in the Tokens view, sees it once, and revokes it; it works only in between", async () => {
  const context = await adminContext();
  const page = await openLive(context, "/");
  await page.getByRole("button", { name: "Tokens" }).click();
  await page.getByLabel("New token: name", { exact: false }).fill("dash-made-bot");
  await page.getByLabel("Role").selectOption("agent");
  await page.getByLabel("Scopes (comma-separated, optional)").fill("request");
  await page.getByLabel("Expires (optional)").fill("30d");
  const answered = page.waitForResponse((r) => r.url().endsWith("/ui/api/tokens") && r.request().method() === "POST");
  await page.getByRole("button", { name: "Create token" }).click();
  const response = await answered;
  assert.equal(response.status(), 201);
  const made = await response.json();
  assert.match(made.token, /^cs_/);
  const row = page.locator('table.tokens tr[data-name="dash-made-bot"]');
  await row.waitFor();
  assert.equal(await row.locator(".token-status").textContent(), "active");
  assert.match(await row.textContent(), /request/);
  await sleep(1000); // past the view's refresh and the live update
  assert.equal((await page.locator("#token-secret").textContent()).trim(), made.token, "the secret stays on screen once made");
  // It is stored hashed: the list never carries it.
  const listed = await page.evaluate(async () => (await fetch("/ui/api/tokens")).text());
  assert.ok(!listed.includes(made.token), "the list carries no secret");
  // It works: an agent creates a request with it.
  const created = await s.server.http("POST", "/api/v1/requests", { token: made.token, json: { action_description: "made with a dashboard token" } });
  assert.equal(created.status, 201, created.text);
  // Leaving the view forgets the secret.
  await page.getByRole("button", { name: "History" }).click();
  await page.getByRole("button", { name: "Tokens" }).click();
  await row.waitFor();
  assert.equal(await page.locator("#token-secret").count(), 0, "the secret is shown only once");
  await row.getByRole("button", { name: "Revoke dash-made-bot" }).click();
  await page.locator('table.tokens tr[data-name="dash-made-bot"] .token-status', { hasText: "revoked" }).waitFor();
  const refused = await s.server.http("POST", "/api/v1/requests", { token: made.token, json: { action_description: "after the revocation" } });
  assert.equal(refused.status, 401, refused.text);
  // A forged cross-site form cannot make one.
  const forged = await s.server.http("POST", "/ui/api/tokens", { json: { name: "forged", role: "admin" }, headers: { origin: "http://evil.example" } });
  assert.equal(forged.status, 403, forged.text);
  await context.close();
});

test("a wrong password shows an error; five failures lock the account, answered like any refusal", async () => {
  // carol is invited from the terminal and sets her password through the invitation.
  const link = new URL(await s.server.invite(LOCKED.username, "approver"));
  const accepted = await s.server.http("POST", "/ui/accept", {
    json: { token: link.searchParams.get("token"), password: LOCKED.password },
  });
  assert.equal(accepted.status, 200, accepted.text);

  const context = await newContext(s.browser, { ...DESKTOP, baseURL: s.server.base });
  const page = await context.newPage();
  await page.goto("/login");
  const attempt = async (username, password) => {
    await page.getByLabel("Username").fill(username);
    await page.getByLabel("Password").fill(password);
    const answered = page.waitForResponse((r) => r.url().endsWith("/ui/login"));
    await page.getByRole("button", { name: "Sign in" }).click();
    await answered;
    const message = page.locator("#message");
    await message.locator("xpath=self::*[normalize-space(.) != '']").waitFor();
    return (await message.textContent()).trim();
  };

  // An unknown account and a wrong password look the same.
  assert.match(await attempt("nobody", "whatever-password"), /wrong username or password/);
  for (let i = 1; i <= 5; i++) {
    const text = await attempt(LOCKED.username, `wrong-password-${i}`);
    assert.match(text, /wrong username or password/, `attempt ${i}`);
    assert.equal(new URL(page.url()).pathname, "/login");
  }
  // Now even the right password is refused. The page says what every refusal says
  // (that accounts lock after five failures), so a guesser cannot tell a locked account
  // from an unknown one; the session was not opened.
  const text = await attempt(LOCKED.username, LOCKED.password);
  const unknown = await attempt("nobody-else", "whatever-password");
  assert.match(text, /locks for 15 minutes after 5/, `after five failures the page says: ${text}`);
  assert.equal(text, unknown, "a locked account is answered like an unknown one");
  assert.equal(new URL(page.url()).pathname, "/login");
  assert.equal(await page.locator("#message").getAttribute("role"), "alert");
  await context.close();
});

// ---- deciding ------------------------------------------------------------------------

test("a request from an MCP client appears live; approving it with the requested PO number returns the proof to the agent's wait_for_approval", async () => {
  const context = await adminContext();
  const page = await openLive(context, "/");
  await page.evaluate(() => {
    window.__sameDocument = true;
  });
  const before = Number(await page.locator("#needs-count").textContent());

  const agent = await mcpAgent();
  const asked = await agent.callTool("request_approval", {
    action_description: "Pay invoice INV-2291 from Globex Corporation",
    action_details: { amount: "4250.00", currency: "EUR", vendor: "Globex Corporation", invoice: "INV-2291" },
    requested_fields: ["po_number"],
    timeout_seconds: 600,
  });
  assert.equal(asked.status, "pending");
  const id = asked.request_id;

  // It appears in NEEDS YOU without a reload, pushed over SSE.
  const card = page.locator(`.card[data-id="${id}"]`);
  await card.waitFor({ timeout: 5_000 });
  assert.match(await card.textContent(), /INV-2291/);
  assert.equal(await page.evaluate(() => window.__sameDocument), true, "the page reloaded");
  await page.locator("#needs-count", { hasText: String(before + 1) }).waitFor();

  // The agent waits (a real, blocking MCP call).
  const waiter = inFlight(mcpAgent().then((a) => a.callTool("wait_for_approval", { request_id: id, timeout_seconds: 60 }, { timeoutMs: 70_000 })));

  await card.click();
  const detail = page.locator("#detail-body");
  await detail.getByRole("heading", { name: "Pay invoice INV-2291 from Globex Corporation" }).waitFor();
  for (const value of ["4250.00", "EUR", "Globex Corporation", "billing-agent"]) {
    assert.ok((await detail.textContent()).includes(value), `the detail does not show ${value}`);
  }
  assert.equal(new URL(page.url()).pathname, `/requests/${id}`);

  // Approving without the requested field is refused by the page.
  await detail.getByRole("button", { name: "Approve" }).click();
  await detail.getByRole("alert").filter({ hasText: "Fill in po_number to approve." }).waitFor();
  await sleep(300);
  assert.equal(waiter.settled, false, "wait_for_approval returned before anyone decided");

  await detail.getByLabel("po_number").fill("PO-7781");
  await detail.getByLabel(/Comment/).fill("Matches the signed Globex contract");
  const clicked = Date.now();
  await detail.getByRole("button", { name: "Approve" }).click();
  // The page shows the decision and who made it. (Which notice it shows above it races
  // with the live update: see the skipped test "the page that decided ...".)
  await detail.getByText(`Approved by ${ADMIN.name} via dashboard`).waitFor();

  const result = await waiter.promise;
  const wokeAfter = Date.now() - clicked;
  assert.equal(result.status, "approved", JSON.stringify(result));
  const statement = statementOf(result.proof);
  assert.equal(statement.request_id, id);
  assert.equal(statement.decision, "approved");
  assert.equal(statement.authorization_type, "human");
  assert.equal(statement.approvers.length, 1);
  assert.equal(statement.approvers[0].display_name, ADMIN.name);
  assert.equal(statement.approvers[0].channel, "dashboard");
  assert.deepEqual(statement.fields, { po_number: "PO-7781" });
  assert.equal(statement.comment, "Matches the signed Globex contract");
  assert.equal(statement.action.details.invoice, "INV-2291");
  console.log(`# wait_for_approval returned ${wokeAfter} ms after the click; approver ${JSON.stringify(statement.approvers[0])}`);

  // It left NEEDS YOU.
  await card.waitFor({ state: "detached" });
  await context.close();
});

test("rejecting with a reason returns rejected and the reason to the agent", async () => {
  const context = await adminContext();
  const page = await openLive(context, "/");
  const agent = await mcpAgent();
  const { request_id: id } = await agent.callTool("request_approval", {
    action_description: "Drop database analytics_old on prod-db-2",
    action_details: { host: "prod-db-2", database: "analytics_old", command: "DROP DATABASE analytics_old" },
    timeout_seconds: 600,
  });
  const waiter = inFlight(agent.callTool("wait_for_approval", { request_id: id, timeout_seconds: 60 }, { timeoutMs: 70_000 }));
  const card = page.locator(`.card[data-id="${id}"]`);
  await card.click();
  const detail = page.locator("#detail-body");
  const reason = "Still read by the quarterly report: archive it first";
  await detail.getByLabel(/Comment/).fill(reason);
  await sleep(200);
  assert.equal(waiter.settled, false);
  await detail.getByRole("button", { name: "Reject" }).click();
  await detail.getByText(`Rejected by ${ADMIN.name} via dashboard`).waitFor();

  const result = await waiter.promise;
  assert.equal(result.status, "rejected");
  assert.equal(result.decision.comment, reason);
  if (result.proof) {
    const statement = statementOf(result.proof);
    assert.equal(statement.decision, "rejected");
    assert.equal(statement.comment, reason);
    assert.equal(statement.approvers[0].display_name, ADMIN.name);
    assert.equal(statement.approvers[0].channel, "dashboard");
  }
  await context.close();
});

test("a stale page cannot decide a request decided elsewhere, and says who decided", async () => {
  const admin = await adminContext();
  // Grace reads times in her own zone (+12:45/+13:45), so a time shown in UTC shows.
  const approver = await newContext(s.browser, { ...DESKTOP, baseURL: s.server.base, storageState: s.approverState, timezoneId: "Pacific/Chatham" });

  // (a) Two live pages; Ada approves in hers, Grace's page updates itself.
  const first = await createRequest("Deploy api-gateway v2.14.0 to production", { service: "api-gateway", version: "2.14.0" });
  const pageA = await openLive(admin, `/requests/${first}`);
  const pageB = await openLive(approver, `/requests/${first}`);
  // (c) A third page whose live connection never opens: truly stale.
  const pageC = await approver.newPage();
  await pageC.route("**/ui/events", () => {});
  await pageC.goto(`/requests/${first}`);
  for (const page of [pageA, pageB, pageC]) {
    await page.locator("#detail-body").getByRole("button", { name: "Approve" }).waitFor();
  }

  await pageA.locator("#detail-body").getByRole("button", { name: "Approve" }).click();
  await pageA.getByText(`Approved by ${ADMIN.name} via dashboard`).waitFor();

  const b = pageB.locator("#detail-body");
  await b.getByText("This request was just decided elsewhere.").waitFor({ timeout: 5_000 });
  await b.getByText(`Approved by ${ADMIN.name} via dashboard`).waitFor();
  assert.equal(await b.getByRole("button", { name: "Approve" }).count(), 0, "the decided request still offers Approve");
  assert.equal(await b.getByRole("button", { name: "Reject" }).count(), 0, "the decided request still offers Reject");

  // The stale page still shows the buttons; using one is refused and names the decider.
  const c = pageC.locator("#detail-body");
  assert.equal(await c.getByRole("button", { name: "Reject" }).count(), 1);
  await c.getByRole("button", { name: "Reject" }).click();
  const refusal = c.locator(".notice.error", { hasText: "already" });
  await refusal.waitFor();
  const refusalText = await refusal.textContent();
  assert.match(refusalText, new RegExp(`${ADMIN.name} via dashboard`), refusalText);
  await c.getByText(`Approved by ${ADMIN.name} via dashboard`).waitFor();
  assert.equal(await c.getByRole("button", { name: "Reject" }).count(), 0);
  const decided = await restRequest(first);
  // The server's message says when, in UTC; the page says it in Grace's time.
  assert.doesNotMatch(refusalText, /\d{4}-\d{2}-\d{2}T\d{2}:\d{2}/, `a raw UTC time: ${refusalText}`);
  const local = await pageC.evaluate(
    (iso) => new Date(iso).toLocaleString(undefined, { dateStyle: "medium", timeStyle: "short" }),
    decided.decision.decided_at,
  );
  assert.ok(refusalText.includes(local), `"${local}" (Pacific/Chatham) in: ${refusalText}`);
  assert.equal(decided.status, "approved");
  assert.deepEqual(decided.decision.approvers.map((a) => a.display_name), [ADMIN.name]);

  // (b) Decided through REST by an approver token: both open pages say who.
  const second = await createRequest("Rotate the TLS certificate of billing.example.com", { domain: "billing.example.com" });
  for (const page of [pageA, pageB]) {
    await gotoLive(page, `/requests/${second}`);
    await page.locator("#detail-body").getByRole("button", { name: "Approve" }).waitFor();
  }
  const r = await s.server.http("POST", `/api/v1/requests/${second}/decision`, {
    token: s.approverToken,
    json: { decision: "rejected", comment: "Wait for the change window" },
  });
  assert.equal(r.status, 200, r.text);
  for (const page of [pageA, pageB]) {
    const d = page.locator("#detail-body");
    await d.getByText(/Rejected by ops-oncall via api/).waitFor({ timeout: 5_000 });
    assert.equal(await d.getByRole("button", { name: "Approve" }).count(), 0);
  }
  await admin.close();
  await approver.close();
});

// Regression: the approver who had just decided was told "This request was just decided
// elsewhere" when the live update of the decision arrived before the page had reloaded the
// request after its own POST. This happens by chance on a normal run; the test makes the
// order certain by holding back the POST's answer (so the live update comes first) and the
// first reload (so it lands last).
test("the page that decided says so, not that the request was decided elsewhere", async () => {
  const id = await createRequest("Publish release notes for v2.14", { channel: "blog" });
  const context = await adminContext();
  const page = await openLive(context, `/requests/${id}`);
  const detail = page.locator("#detail-body");
  await detail.getByRole("button", { name: "Approve" }).waitFor();
  let reloads = 0;
  await page.route(`**/ui/api/requests/${id}/decision`, async (route) => {
    const response = await route.fetch();
    await sleep(400);
    await route.fulfill({ response });
  });
  await page.route(`**/ui/api/requests/${id}`, async (route) => {
    reloads += 1;
    const response = await route.fetch();
    if (reloads === 1) await sleep(1200);
    await route.fulfill({ response });
  });
  await detail.getByRole("button", { name: "Approve" }).click();
  await detail.getByText(`Approved by ${ADMIN.name} via dashboard`).waitFor();
  await sleep(1800);
  assert.equal(await detail.getByText("decided elsewhere").count(), 0, "the approver's own decision is announced as made elsewhere");
  await detail.getByText("Approved. The agent has its proof.").waitFor();
});

// ---- CSRF ----------------------------------------------------------------------------

/** A page on another origin (another loopback port) that posts a form on load. */
async function evilSite(target) {
  const forms = {
    // JSON smuggled in a text/plain form: {"decision":"approved","comment":"forged","x":"="}
    "/decide": `<form method="POST" action="${target.base}/ui/api/requests/${target.id}/decision" enctype="text/plain">
      <input type="hidden" name='{"decision":"approved","comment":"forged","x":"' value='"}'></form>`,
    "/decide-urlencoded": `<form method="POST" action="${target.base}/ui/api/requests/${target.id}/decision">
      <input type="hidden" name="decision" value="approved"></form>`,
    "/logout-all": `<form method="POST" action="${target.base}/ui/logout-all"><input type="hidden" name="x" value="1"></form>`,
    "/invite": `<form method="POST" action="${target.base}/ui/api/users/invite" enctype="text/plain">
      <input type="hidden" name='{"username":"mallory","role":"admin","x":"' value='"}'></form>`,
    "/login": `<form method="POST" action="${target.base}/ui/login" enctype="text/plain">
      <input type="hidden" name='{"username":"carol","password":"carols-own-password","x":"' value='"}'></form>`,
  };
  const server = http.createServer((req, res) => {
    const form = forms[req.url];
    if (!form) {
      res.writeHead(404).end();
      return;
    }
    res.writeHead(200, { "content-type": "text/html" });
    res.end(`<!doctype html><title>You won a prize</title>${form}<script>document.forms[0].submit()</script>`);
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  return { server, base: `http://127.0.0.1:${server.address().port}`, paths: Object.keys(forms) };
}

test("forged cross-origin form posts and CSRF-less requests are refused and change nothing", async () => {
  const id = await createRequest("Wire 25,000.00 USD to account DE89 3704 0044 0532 0130 00", { amount: "25000.00", currency: "USD" });
  const context = await adminContext();
  const dashboard = await openLive(context, "/");
  const usersBefore = await dashboard.evaluate(async () => (await fetch("/ui/api/users")).json());
  const logBefore = await stableLogSize();
  const requestBefore = await restRequest(id);

  const evil = await evilSite({ base: s.server.base, id });
  try {
    for (const p of evil.paths) {
      const page = await context.newPage();
      const posted = page.waitForResponse((r) => r.url().startsWith(s.server.base) && r.request().method() === "POST");
      await page.goto(`${evil.base}${p}`);
      const response = await posted;
      assert.ok(
        response.status() >= 400 && response.status() < 500,
        `forged POST from ${evil.base}${p} got ${response.status()}: ${await response.text().catch(() => "")}`,
      );
      console.log(`# forged ${p}: ${response.status()} ${(await response.text().catch(() => "")).slice(0, 120)}`);
      await page.close();
    }
  } finally {
    evil.server.close();
  }

  // From the dashboard's own origin, without the CSRF header or with a wrong one.
  const attempts = await dashboard.evaluate(async (id) => {
    const post = async (headers) => {
      const r = await fetch(`/ui/api/requests/${id}/decision`, {
        method: "POST",
        headers: { "content-type": "application/json", ...headers },
        body: JSON.stringify({ decision: "approved" }),
      });
      return { status: r.status, body: await r.text() };
    };
    return [await post({}), await post({ "x-csrf-token": "not-the-token" })];
  }, id);
  for (const attempt of attempts) {
    assert.equal(attempt.status, 403, JSON.stringify(attempt));
    assert.match(attempt.body, /CSRF/);
  }

  // Nothing changed: the request is pending at the same version, the session lives, no
  // account was added, nothing was logged.
  const requestAfter = await restRequest(id);
  assert.equal(requestAfter.status, "pending");
  assert.equal(requestAfter.version ?? null, requestBefore.version ?? null);
  const me = await dashboard.evaluate(async () => (await fetch("/ui/api/me")).status);
  assert.equal(me, 200, "the forged sign-out-everywhere ended the session");
  const usersAfter = await dashboard.evaluate(async () => (await fetch("/ui/api/users")).json());
  assert.deepEqual(usersAfter, usersBefore);
  assert.equal(await stableLogSize(), logBefore, "the log grew");
  // The forged sign-in did not sign the victim in as someone else.
  await dashboard.reload();
  await dashboard.locator("#who", { hasText: `${ADMIN.name} (admin)` }).waitFor();
  await dashboard.locator(`.card[data-id="${id}"]`).waitFor();
  assert.equal(await dashboard.locator(`.card[data-id="${id}"]`).count(), 1);
  await context.close();
});

// ---- no state change on a GET ----------------------------------------------------------

test("no GET changes anything: a crawler follows every link, source and request of every page", async () => {
  const pending = await createRequest("Email 1,204 customers about the March price change", { list: "customers-eu", template: "price-change-2026-03" });
  const context = await adminContext();

  // An open invitation whose link a GET must not consume.
  const printed = new URL(await s.server.invite("dave", "approver"));
  const inviteLink = s.server.url(printed.pathname + printed.search);

  const snapshot = async () => {
    const list = await s.server.http("GET", "/api/v1/requests?limit=500", { token: s.approverToken });
    assert.equal(list.status, 200, list.text);
    const users = await context.request.get("/ui/api/users");
    assert.equal(users.status(), 200);
    return {
      requests: list.body.requests.map((r) => ({ id: r.request_id, status: r.status, version: r.version, decision: r.decision, used: r.used })),
      users: (await users.json()).users,
    };
  };
  const before = await snapshot();
  const logBefore = await stableLogSize();
  assert.ok(before.requests.some((r) => r.id === pending && r.status === "pending"));
  const decided = before.requests.find((r) => r.status !== "pending");
  assert.ok(decided, "no decided request to crawl");

  const origin = s.server.base;
  const seeds = [
    "/",
    "/login",
    "/setup",
    "/invite",
    new URL(s.server.setupLink).pathname + new URL(s.server.setupLink).search,
    new URL(inviteLink).pathname + new URL(inviteLink).search,
    `/requests/${pending}`,
    `/requests/${decided.id}`,
    "/requests/req_does_not_exist",
    // Every route that changes state, asked with GET: must do nothing.
    "/ui/login",
    "/ui/accept",
    "/ui/logout",
    "/ui/logout-all",
    `/ui/api/requests/${pending}/decision`,
    "/ui/api/users/invite",
    ...before.users.map((u) => `/ui/api/users/${u.id}/disable`),
  ];
  const queue = [...seeds];
  const seen = new Set();
  const nonGet = [];
  const visited = { pages: 0, other: 0 };
  const enqueue = (raw, from) => {
    let u;
    try {
      u = new URL(raw, from);
    } catch {
      return;
    }
    if (u.origin !== origin) return;
    const key = u.pathname + u.search;
    if (!seen.has(key)) queue.push(key);
  };

  let walked = false;
  const crawler = await context.newPage();
  crawler.on("request", (request) => {
    if (request.method() !== "GET") nonGet.push(`${request.method()} ${request.url()}`);
    else enqueue(request.url(), origin);
  });

  while (queue.length) {
    const next = queue.shift();
    if (seen.has(next)) continue;
    seen.add(next);
    if (next === "/ui/events") {
      // The live stream never ends: open it, read a little, let go.
      const r = await fetch(origin + next, { headers: { cookie: await cookieHeader(context) }, signal: AbortSignal.timeout(1500) }).catch(() => null);
      if (r) await r.body?.cancel().catch(() => {});
      visited.other += 1;
      continue;
    }
    const probe = await context.request.get(next, { maxRedirects: 0, timeout: 5_000 });
    const type = probe.headers()["content-type"] || "";
    const location = probe.headers()["location"];
    if (location) enqueue(location, origin + next);
    if (!type.includes("text/html")) {
      visited.other += 1;
      continue;
    }
    visited.pages += 1;
    await crawler.goto(next, { waitUntil: "load" });
    await sleep(250);
    // The dashboard is a single page: walk its views and open every request, which only
    // reads (GET), so the page's own API calls get recorded too (once: it is one app).
    if (!walked && (await crawler.locator("nav.side").count())) {
      walked = true;
      for (const view of ["History", "Users", "Needs you"]) {
        await crawler.locator("nav.side button", { hasText: view }).click();
        await sleep(200);
        for (const card of await crawler.locator(".card").all()) {
          await card.click();
          await sleep(100);
        }
      }
      for (const query of [{ q: "invoice" }, { agent: "billing" }]) {
        await crawler.locator("nav.side button", { hasText: "History" }).click();
        const [field, value] = Object.entries(query)[0];
        await crawler.locator(`#${field}`).fill(value);
        await sleep(200);
      }
      await crawler.locator("#status-filter").selectOption("approved");
      await sleep(200);
    }
    const links = await crawler.evaluate(() =>
      [...document.querySelectorAll("a[href], [src], link[href], [href]")].map((el) => el.getAttribute("href") ?? el.getAttribute("src")),
    );
    for (const link of links) enqueue(link, crawler.url());
  }
  await crawler.close();

  assert.deepEqual(nonGet, [], "crawling made requests other than GET");
  const after = await snapshot();
  assert.deepEqual(after, before, "a GET changed requests or accounts");
  assert.equal(await stableLogSize(), logBefore, "a GET appended to the log");
  const me = await context.request.get("/ui/api/me");
  assert.equal(me.status(), 200, "a GET ended the session");
  for (const required of ["/", "/login", "/setup", "/invite", "/assets/app.js", "/assets/app.css", "/assets/auth.js", "/ui/api/me", "/ui/events", "/ui/api/users", `/ui/api/requests/${pending}`]) {
    assert.ok([...seen].some((u) => u === required || u.startsWith(`${required}?`)), `the crawler never reached ${required}`);
  }
  assert.ok([...seen].some((u) => u.startsWith("/ui/api/requests?view=history")), "the crawler never listed the history");
  console.log(`# crawled ${seen.size} URLs (${visited.pages} pages in the browser, ${visited.other} other GETs); nothing changed`);

  // The invitation the crawler opened is still unused: it still works.
  const link = new URL(inviteLink);
  const accept = await s.server.http("POST", "/ui/accept", {
    json: { token: link.searchParams.get("token"), display_name: "Dave", password: "daves-long-password" },
  });
  assert.equal(accept.status, 200, accept.text);
  await context.close();
});

async function cookieHeader(context) {
  return (await context.cookies()).map((c) => `${c.name}=${c.value}`).join("; ");
}

// ---- security headers and CSP ----------------------------------------------------------

function parseCsp(value) {
  const directives = {};
  for (const part of value.split(";")) {
    const [name, ...sources] = part.trim().split(/\s+/);
    if (name) directives[name.toLowerCase()] = sources;
  }
  return directives;
}

test("pages carry security headers and a CSP without unsafe-inline, which the browser enforces", async () => {
  const context = await adminContext();
  const anonymous = await newContext(s.browser, { ...DESKTOP, baseURL: s.server.base });
  const checks = [
    [context, "/"],
    [context, "/requests/req_anything"],
    [anonymous, "/"], // the redirect to sign-in
    [anonymous, "/login"],
    [anonymous, "/setup"],
    [anonymous, "/invite"],
    [anonymous, "/assets/app.js"],
    [anonymous, "/assets/auth.js"],
    [anonymous, "/assets/app.css"],
    [context, "/ui/api/me"],
  ];
  for (const [ctx, p] of checks) {
    const r = await ctx.request.get(p, { maxRedirects: 0 });
    const h = r.headers();
    const where = `${p} (${r.status()})`;
    const csp = h["content-security-policy"];
    assert.ok(csp, `${where}: no Content-Security-Policy`);
    const d = parseCsp(csp);
    const scripts = d["script-src"] ?? d["default-src"];
    assert.ok(scripts, `${where}: the CSP does not restrict scripts: ${csp}`);
    for (const bad of ["'unsafe-inline'", "'unsafe-eval'", "*", "data:", "http:", "https:"]) {
      assert.ok(!scripts.includes(bad), `${where}: script-src allows ${bad}: ${csp}`);
    }
    const styles = d["style-src"] ?? d["default-src"];
    assert.ok(styles && !styles.includes("'unsafe-inline'"), `${where}: style-src allows inline styles: ${csp}`);
    assert.deepEqual(d["default-src"], ["'none'"], `${where}: ${csp}`);
    assert.deepEqual(d["frame-ancestors"], ["'none'"], `${where}: ${csp}`);
    assert.ok(d["base-uri"], `${where}: no base-uri: ${csp}`);
    assert.ok(d["form-action"], `${where}: no form-action: ${csp}`);
    assert.equal(h["x-content-type-options"], "nosniff", where);
    assert.equal(h["x-frame-options"], "DENY", where);
    assert.equal(h["referrer-policy"], "no-referrer", where);
    assert.ok(h["cache-control"], `${where}: no cache-control`);
    if (p.startsWith("/ui/api/")) assert.equal(h["cache-control"], "no-store", where);
  }

  // The CSP is in force: an injected inline script does not run, and the browser reports it.
  const page = await openLive(context, "/");
  expectViolations(page);
  const ran = await page.evaluate(async () => {
    const script = document.createElement("script");
    script.textContent = "window.__inlineRan = true";
    document.body.append(script);
    const img = document.createElement("img");
    img.src = "https://example.invalid/pixel.png";
    document.body.append(img);
    await new Promise((resolve) => setTimeout(resolve, 200));
    return window.__inlineRan === true;
  });
  assert.equal(ran, false, "an inline script ran despite the CSP");
  const violations = await recordedViolations(page);
  assert.ok(violations.some((v) => v.startsWith("script-src")), `no script-src violation recorded: ${JSON.stringify(violations)}`);
  assert.ok(violations.some((v) => v.startsWith("img-src")), `no img-src violation recorded: ${JSON.stringify(violations)}`);
  await context.close();
  await anonymous.close();
});

// ---- accessibility -----------------------------------------------------------------------

test("accessibility: every control is labelled, every button named", async () => {
  const anonymous = await newContext(s.browser, { ...DESKTOP, baseURL: s.server.base });
  const page = await anonymous.newPage();
  const where = [];
  for (const p of ["/login", "/setup", "/invite?kind=invite&username=x"]) {
    await page.goto(p);
    assert.ok((await controlCount(page)) >= 2, `${p}: no controls found`);
    assert.deepEqual(await unlabelledControls(page), [], `${p}: unlabelled controls`);
    assert.deepEqual(await unnamedButtons(page), [], `${p}: unnamed buttons`);
    where.push(p);
  }
  await anonymous.close();

  const context = await adminContext();
  const id = await createRequest("Order 40 laptops from Initech", { quantity: "40", supplier: "Initech" }, { requested_fields: ["po_number", "cost_center"] });
  const dash = await openLive(context, `/requests/${id}`);
  await dash.locator("#field-po_number").waitFor();
  // The open request is marked as the current one in the list, in a way a screen reader
  // announces (aria-current; aria-selected means nothing on a button).
  assert.equal(await dash.locator(`.card[data-id="${id}"]`).getAttribute("aria-current"), "true");
  assert.equal(await dash.locator(`.card[aria-current="true"]`).count(), 1);
  const views = [
    ["request with requested fields", async () => {}],
    ["history with filters", async () => dash.locator("nav.side button", { hasText: "History" }).click()],
    ["users", async () => dash.locator("nav.side button", { hasText: "Users" }).click()],
    ["a room with an open question and blocker", async () => {
      await roomPost("a11y-room", "Which region first?", "question");
      await roomBlocker("a11y-room", "Quota exceeded in eu-west-1.");
      await dash.locator("nav.side button", { hasText: "Rooms" }).click();
      await dash.locator('#room-tabs button[data-room="a11y-room"]').click();
      await dash.locator("#detail-body form.needs.blocker").waitFor();
    }],
  ];
  for (const [name, open] of views) {
    await open();
    await sleep(300);
    assert.ok((await controlCount(dash)) >= 2, `${name}: no controls found`);
    assert.deepEqual(await unlabelledControls(dash), [], `${name}: unlabelled controls`);
    assert.deepEqual(await unnamedButtons(dash), [], `${name}: unnamed buttons`);
    assert.deepEqual(await misplacedAriaSelected(dash), [], `${name}: aria-selected where the role has no selected state`);
    where.push(name);
  }
  console.log(`# labels checked on: ${where.join(", ")}`);
  await context.close();
});

/** Presses Tab until `selector` has the focus; returns how many presses it took. */
async function tabTo(page, selector, max = 60) {
  for (let i = 1; i <= max; i++) {
    await page.keyboard.press("Tab");
    if (await page.evaluate((sel) => document.activeElement?.matches(sel) ?? false, selector)) return i;
  }
  throw new Error(`${selector} was not reached with ${max} presses of Tab`);
}

test("accessibility: approve and reject work with the keyboard alone", async () => {
  const context = await adminContext();
  const approveId = await createRequest("Restart the payments worker pool", { cluster: "eu-west-1", pool: "payments" });
  const rejectId = await createRequest("Grant contractor@initech.example admin on GitHub", { org: "countersign", role: "admin" });
  const page = await openLive(context, "/");

  // Tab to the request in the list, Enter opens it; Tab to Approve, Enter approves.
  await page.locator(`.card[data-id="${approveId}"]`).waitFor();
  const toCard = await tabTo(page, `.card[data-id="${approveId}"]`);
  await page.keyboard.press("Enter");
  await page.locator("#detail-body").getByRole("heading", { name: "Restart the payments worker pool" }).waitFor();
  const toApprove = await tabTo(page, "#approve");
  const focus = await page.evaluate(() => {
    const style = getComputedStyle(document.activeElement);
    return { tag: document.activeElement.tagName, outline: style.outlineStyle, width: style.outlineWidth };
  });
  assert.equal(focus.tag, "BUTTON", "Approve is not a real button");
  assert.notEqual(focus.outline, "none", "the focused Approve button shows no focus ring");
  await page.keyboard.press("Enter");
  await page.locator("#detail-body").getByText(`Approved by ${ADMIN.name} via dashboard`).waitFor();
  const approved = await restRequest(approveId);
  assert.equal(approved.status, "approved");
  assert.equal(approved.decision.approvers[0].channel, "dashboard");

  // The same for Reject, with the reason typed in the comment, pressed with Space.
  await gotoLive(page, "/");
  await page.locator(`.card[data-id="${rejectId}"]`).waitFor();
  await tabTo(page, `.card[data-id="${rejectId}"]`);
  await page.keyboard.press("Enter");
  await page.locator("#detail-body").getByRole("heading", { name: /Grant contractor/ }).waitFor();
  await tabTo(page, "#comment");
  await page.keyboard.type("Contractors get write, not admin");
  const toReject = await tabTo(page, "#reject");
  await page.keyboard.press("Space");
  await page.locator("#detail-body").getByText(`Rejected by ${ADMIN.name} via dashboard`).waitFor();
  const rejected = await restRequest(rejectId);
  assert.equal(rejected.status, "rejected");
  assert.equal(rejected.decision.comment, "Contractors get write, not admin");
  console.log(`# keyboard: ${toCard} Tabs to the request, ${toApprove} to Approve, ${toReject} from the comment to Reject`);
  await context.close();
});

// Regression: every live update rebuilds the whole list, which used to drop a keyboard
// user's focus (to <body>) whenever anything changed anywhere.
test("accessibility: a live update does not take the keyboard focus away from the list", async () => {
  const context = await adminContext();
  const first = await createRequest("Archive the 2019 invoices bucket", { bucket: "invoices-2019" });
  const page = await openLive(context, "/");
  await page.locator(`.card[data-id="${first}"]`).waitFor();
  await tabTo(page, `.card[data-id="${first}"]`);
  const second = await createRequest("Invite 3 contractors to the staging Slack", { workspace: "staging" });
  await page.locator(`.card[data-id="${second}"]`).waitFor();
  await sleep(200);
  const focused = await page.evaluate(() => document.activeElement?.dataset?.id ?? document.activeElement?.tagName);
  assert.equal(focused, first, "the focus left the request it was on");
});

test("accessibility: text, buttons and status badges have a contrast of at least 4.5:1", async () => {
  const context = await adminContext();
  const pendingId = await createRequest("Renew the Datadog contract for 12 months", { amount: "18000.00", currency: "USD" }, { requested_fields: ["po_number"] });
  const page = await openLive(context, `/requests/${pendingId}`);
  await page.locator("#approve").waitFor();
  const measured = [];
  measured.push(
    ...(await contrasts(page, [
      "body",
      "header.top .brand",
      "header.top .who",
      ".conn",
      "details.menu summary",
      "nav.side button[aria-current=page]",
      "nav.side button:not([aria-current])",
      ".badge",
      "section.list h2",
      ".card .desc",
      ".card .details",
      ".card .meta span",
      ".status.pending",
      ".countdown",
      ".detail h3",
      "table.kv th",
      "table.kv td",
      ".decide label",
      "#approve",
      "#reject",
      "#sheet-close",
    ])),
  );
  // Decided requests: approved, rejected, their badges and notices, the proof tools.
  await page.locator("nav.side button", { hasText: "History" }).click();
  await page.locator(".status.approved").first().waitFor();
  measured.push(...(await contrasts(page, [".status.approved", ".status.rejected", "#filters select"])));
  // The search boxes have only their placeholder on screen (their labels are for screen
  // readers), so the placeholder must be readable too.
  measured.push(...(await contrasts(page, ["#q", "#agent"], "::placeholder")));
  await page.locator(".card", { has: page.locator(".status.approved") }).first().click();
  await page.locator("#detail-body .notice.ok").waitFor();
  measured.push(...(await contrasts(page, [".notice.ok", ".proof-tools .btn", "code.cmd"])));
  await page.locator(".card", { has: page.locator(".status.rejected") }).first().click();
  await page.locator("#detail-body .notice.error").waitFor();
  measured.push(...(await contrasts(page, [".notice.error"])));
  // The count badge as it looks when nothing needs you (the same element, its class set).
  await page.locator("#needs-count").evaluate((el) => el.classList.add("zero"));
  measured.push(...(await contrasts(page, [".badge.zero"])));
  // The sign-in page with its error.
  const anonymous = await newContext(s.browser, { ...DESKTOP, baseURL: s.server.base });
  const login = await anonymous.newPage();
  await login.goto("/login");
  await login.getByLabel("Username").fill("nobody");
  await login.getByLabel("Password").fill("wrong-password-0");
  await login.getByRole("button", { name: "Sign in" }).click();
  await login.locator("#message.error").waitFor();
  measured.push(...(await contrasts(login, [".auth h1", ".auth label", ".btn.primary", "#message.error"])));
  await anonymous.close();
  // A room: message types, open and closed markers, roster states, tab badges.
  await roomPost("contrast-room", "Rolling out to 10%.", "progress");
  await roomPost("contrast-room", "Rollout finished.", "done");
  await roomPost("contrast-room", "Proceed to 50%?", "question");
  const blocked = await roomBlocker("contrast-room", "Pager has nobody for Saturday.");
  const resolved = await s.server.http("POST", `/api/v1/rooms/contrast-room/blockers/${blocked}/resolve`, { token: s.approverToken, json: { reply: "Grace takes it." } });
  assert.equal(resolved.status, 200, resolved.text);
  await roomBlocker("contrast-room", "Disk full on the runner.");
  await page.goto("/?room=contrast-room");
  await page.locator("#detail-body form.needs.blocker").waitFor();
  measured.push(
    ...(await contrasts(page, [
      ".room-tab[aria-current=page]",
      ".room-tab .badge",
      ".room-tab .badge.red",
      ".chip",
      ".divider",
      ".msg .meta strong",
      ".msg .meta time",
      ".msg .text",
      ".msg .open",
      ".msg .closed",
      ".status.progress",
      ".status.done",
      ".status.question",
      ".status.blocker",
      ".status.resolution",
      ".status.blocked",
      "ul.roster time",
    ])),
  );
  const table = measured.map((m) => `${m.ratio.toFixed(2).padStart(6)}  ${m.fg} on ${m.bg}  ${m.size}/${m.weight}  ${m.selector}  "${m.text}"`);
  console.log(`# contrast:\n${table.map((l) => `#   ${l}`).join("\n")}`);
  const failing = measured.filter((m) => m.ratio < 4.5);
  assert.deepEqual(failing, [], "elements below 4.5:1");
  for (const required of ["body", "#approve", "#reject", ".btn.primary", ".status.pending", ".status.approved", ".status.rejected", ".badge", ".badge.zero", "#q::placeholder"]) {
    assert.ok(measured.some((m) => m.selector === required), `${required} was not measured`);
  }
  await context.close();
});

// ---- phone ---------------------------------------------------------------------------------

test("phone (390x844): the request opens as a bottom sheet and Approve works there", async () => {
  const id = await createRequest("Refund order #88121 (duplicate charge)", { order: "88121", amount: "129.99", currency: "EUR", customer: "jane@example.com" });
  const context = await adminContext(PHONE);
  const page = await openLive(context, "/");
  const width = await page.evaluate(() => document.documentElement.scrollWidth);
  assert.ok(width <= 390, `the page scrolls sideways on a phone (${width}px wide)`);
  const sheet = page.locator("section.detail");
  assert.equal(await sheet.isVisible(), false, "the detail shows before a request is opened");

  await page.locator(`.card[data-id="${id}"]`).tap();
  await page.locator("section.detail.open").waitFor();
  await sheet.getByRole("heading", { name: /Refund order #88121/ }).waitFor();
  await sleep(350); // the sheet slides up (0.2 s)
  const box = await sheet.boundingBox();
  const position = await sheet.evaluate((el) => getComputedStyle(el).position);
  assert.equal(position, "fixed");
  assert.ok(Math.abs(box.y + box.height - 844) <= 1, `the sheet is not at the bottom: ${JSON.stringify(box)}`);
  assert.ok(box.x === 0 && Math.abs(box.width - 390) <= 1, `the sheet is not full width: ${JSON.stringify(box)}`);
  assert.ok(box.y > 0, `the sheet covers the whole screen: ${JSON.stringify(box)}`);

  const approve = sheet.getByRole("button", { name: "Approve" });
  await approve.scrollIntoViewIfNeeded();
  const target = await approve.boundingBox();
  assert.ok(target.height >= 44, `Approve is ${target.height}px tall: too small to tap`);
  assert.ok(target.y >= 0 && target.y + target.height <= 845, `Approve is off screen: ${JSON.stringify(target)}`);
  await approve.tap();
  await sheet.getByText(`Approved by ${ADMIN.name} via dashboard`).waitFor();
  const decided = await restRequest(id);
  assert.equal(decided.status, "approved");
  assert.equal(decided.decision.approvers[0].display_name, ADMIN.name);
  assert.equal(decided.decision.approvers[0].channel, "dashboard");

  await sheet.getByRole("button", { name: "Close" }).tap();
  await page.waitForFunction(() => !document.querySelector("section.detail").classList.contains("open"));
  await context.close();
});

// ---- process operations ------------------------------------------------------------------------

test("operations: the Operations view lists a person's process operation with its decision and exit, never an agent's look-alike", async () => {
  const work = fs.mkdtempSync(path.join(os.tmpdir(), "countersign-ops-"));
  const server = await new Countersign(process.env.COUNTERSIGN_BIN, {
    files: {
      "countersign.toml": `[[process]]\nname = "worker"\nhost = "local"\ndir = ${JSON.stringify(work)}\nstart = "sleep 300"\nmatch = "sleep 300 countersign-ops-test"\nlog = "worker.log"\nrun_timeout_seconds = 10\n`,
    },
  }).start();
  try {
    const alice = await server.token("approver", "ops-alice");
    const bob = await server.token("approver", "ops-bob");
    const agent = await server.token("agent", "sly-bot");
    const asked = await server.http("POST", "/api/v1/operate/processes/worker/run", { token: alice, json: { cmd: "echo hello-from-ops", hold_seconds: 0 } });
    assert.equal(asked.status, 200, asked.text);
    assert.equal(asked.body.state, "pending");
    const id = asked.body.request.request_id;
    // An agent's request dressed as an operation is not one.
    const forged = await server.http("POST", "/api/v1/requests", { token: agent, json: { action_description: "run `rm -rf /` in / on local", action_details: { upstream: "operate", tool: "run_command", process: "worker", cmd: "rm -rf /" } } });
    assert.equal(forged.status, 201, forged.text);

    const context = await firstAdmin(server);
    const page = await openLive(context, "/");
    await page.getByRole("button", { name: "Operations" }).click();
    const row = page.locator(`table.operations tr[data-id="${id}"]`);
    await row.waitFor();
    assert.match(await row.textContent(), /run `echo hello-from-ops`/);
    assert.match(await row.textContent(), /token:ops-alice/);
    assert.equal(await row.locator(".op-decision").textContent(), "pending");
    assert.equal(await page.locator(`table.operations tr[data-id="${forged.body.request_id}"]`).count(), 0, "an agent's look-alike is listed");

    // Another person approves; until alice asks again it has not run.
    const decided = await server.http("POST", `/api/v1/requests/${id}/decision`, { token: bob, json: { decision: "approved" } });
    assert.equal(decided.status, 200, decided.text);
    await page.getByRole("button", { name: "Operations" }).click();
    await page.locator(`table.operations tr[data-id="${id}"] .op-outcome`, { hasText: "not run yet" }).waitFor();
    // Asked again, the approved operation runs, once; its exit is shown.
    const ran = await server.http("POST", "/api/v1/operate/processes/worker/run", { token: alice, json: { cmd: "echo hello-from-ops", hold_seconds: 10 } });
    assert.equal(ran.status, 200, ran.text);
    assert.equal(ran.body.state, "done", ran.text);
    assert.equal(ran.body.request.request_id, id);
    await page.getByRole("button", { name: "Operations" }).click();
    await page.locator(`table.operations tr[data-id="${id}"] .op-outcome`, { hasText: "exit 0" }).waitFor();
    assert.match(await row.locator(".op-decision").textContent(), /^approved by ops-bob/);
    assert.match(await row.locator(".op-outcome").textContent(), /^succeeded \(exit 0\)/);
    // The row opens the request itself.
    await row.getByRole("button").click();
    await page.locator("#detail-body", { hasText: "hello-from-ops" }).waitFor();
    await context.close();
  } finally {
    server.cleanup();
    fs.rmSync(work, { recursive: true, force: true });
  }
});

// ---- the installable app ---------------------------------------------------------------------

test("installable: a manifest and icons Chromium accepts, a service worker that keeps the shell offline and never an API answer", async () => {
  const context = await newContext(s.browser, { ...PHONE, baseURL: s.server.base, storageState: s.adminState, serviceWorkers: "allow" });
  const page = await openLive(context, "/");
  const worker = await page.evaluate(async () => (await navigator.serviceWorker.ready).active.scriptURL);
  assert.equal(new URL(worker).pathname, "/sw.js");
  const manifest = await (await context.request.get("/manifest.webmanifest")).json();
  assert.equal(manifest.display, "standalone");
  assert.equal(manifest.start_url, "/");
  for (const size of [192, 512]) {
    const icon = manifest.icons.find((i) => i.sizes === `${size}x${size}`);
    assert.ok(icon && icon.type === "image/png", `a ${size}px PNG icon: ${JSON.stringify(manifest.icons)}`);
    const r = await context.request.get(icon.src);
    assert.equal(r.headers()["content-type"], "image/png");
    const png = await r.body();
    // IHDR: width and height, big-endian, at bytes 16 and 20.
    assert.equal(png.readUInt32BE(16), size);
    assert.equal(png.readUInt32BE(20), size);
  }
  // Chromium's own verdict: nothing stops installing it, but that a test's browser context
  // is an incognito one (Playwright's contexts are; a phone's browser is not).
  const cdp = await context.newCDPSession(page);
  const { installabilityErrors } = await cdp.send("Page.getInstallabilityErrors");
  const blocking = installabilityErrors.filter((e) => e.errorId !== "in-incognito");
  assert.deepEqual(blocking, [], JSON.stringify(installabilityErrors));
  // A page controlled by the worker, then the network gone: the shell's offline page,
  // never a cached dashboard or API answer.
  await page.reload();
  await page.waitForFunction(() => navigator.serviceWorker.controller !== null);
  await context.setOffline(true);
  await page.goto("/").catch(() => {});
  await page.locator("#offline-message").waitFor();
  assert.match(await page.locator("#offline-message").textContent(), /Nothing can be approved or rejected offline/);
  const cached = await page.evaluate(async () => {
    const names = await caches.keys();
    const paths = [];
    for (const name of names) for (const r of await (await caches.open(name)).keys()) paths.push(new URL(r.url).pathname);
    return paths;
  });
  assert.ok(cached.includes("/assets/app.js"), `the shell is cached: ${cached}`);
  assert.ok(cached.every((p) => !p.startsWith("/ui/") && !p.startsWith("/api/") && p !== "/"), `only the shell: ${cached}`);
  await context.setOffline(false);
  await gotoLive(page, "/");
  await page.locator("nav.side").waitFor();
  await context.close();
});

// ---- screenshots ---------------------------------------------------------------------------

test("screenshots at phone (390x844) and desktop (1440x900) sizes", async () => {
  // Realistic work for the pictures: several agents, details, a requested field.
  const deploy = await s.server.token("agent", "deploy-bot");
  const support = await s.server.token("agent", "support-mailer");
  const make = (token, description, details, extra = {}) =>
    s.server.createRequest(token, { action_description: description, action_details: details, ...extra });
  await make(s.agentToken, "Pay invoice INV-2307 from Umbrella Corp", { amount: "12,480.00", currency: "EUR", vendor: "Umbrella Corp", due: "2026-12-15" }, { requested_fields: ["po_number"] });
  await make(deploy, "Deploy checkout-service v3.8.1 to production", { service: "checkout-service", version: "3.8.1", cluster: "prod-eu-west-1", change: "CHG-5521" }, { timeout_seconds: 240 });
  const mail = await make(support, "Email 312 customers about the delayed shipment", { segment: "orders-delayed-2026-11", template: "shipping-delay-v2" });
  const cancelled = await make(deploy, "Scale the search cluster to 12 nodes", { cluster: "search-prod", nodes: "12" });
  const r = await s.server.http("POST", `/api/v1/requests/${cancelled}/cancel`, { token: deploy, json: {} });
  assert.equal(r.status, 200, r.text);

  for (const [label, size] of [["desktop-1440x900", DESKTOP], ["phone-390x844", PHONE]]) {
    const anonymous = await newContext(s.browser, { ...size, baseURL: s.server.base });
    const login = await anonymous.newPage();
    await login.goto("/login");
    await login.getByRole("button", { name: "Sign in" }).waitFor();
    await shot(login, `${label}-1-sign-in`);
    await anonymous.close();

    const context = await adminContext(size);
    const page = await openLive(context, "/");
    await page.locator(`.card[data-id="${mail}"]`).waitFor();
    await shot(page, `${label}-2-needs-you`);
    await page.locator(".card").first().click();
    await page.locator("#approve").waitFor();
    await sleep(350);
    await shot(page, `${label}-3-request-detail`);
    if (size === PHONE) {
      await page.getByRole("button", { name: "Close" }).click();
      await sleep(300);
    }
    await page.locator("nav.side button", { hasText: "History" }).click();
    await page.locator(".card .status.approved").first().waitFor();
    await sleep(200);
    await shot(page, `${label}-4-history`);
    // A decided request with its proof tools.
    await page.locator(".card", { has: page.locator(".status.approved") }).first().click();
    await page.locator(".proof-tools").waitFor();
    await sleep(350);
    await shot(page, `${label}-5-decided-with-proof`);
    await context.close();
  }
});

// ---- rooms ---------------------------------------------------------------------------------

/** An MCP agent with a token of its own (rooms show agents by name). */
async function namedAgent(name) {
  const client = new McpClient(s.server.url("/mcp"), await s.server.token("agent", name));
  await client.initialize();
  return client;
}

/** The room's messages as a person sees them through REST. */
async function roomMessages(room) {
  const r = await s.server.http("GET", `/api/v1/rooms/${room}/messages?limit=1000`, { token: s.approverToken });
  assert.equal(r.status, 200, r.text);
  return r.body.messages;
}

test("rooms: a question is answered in place from NEEDS YOU and the waiting agent gets the answer", async () => {
  const agent = await namedAgent("design-bot");
  await agent.callTool("join_room", { room: "design-review" });
  await agent.callTool("post_message", { room: "design-review", text: "Mock-ups for the checkout page are ready.", type: "progress" });
  const context = await adminContext();
  // A deep link opens the room.
  const page = await openLive(context, "/?room=design-review");
  await page.locator("#list-title", { hasText: "design-review" }).waitFor();
  await page.locator(".stream .msg.progress", { hasText: "Mock-ups" }).waitFor();

  const asking = inFlight(agent.callTool("wait_for_feedback", { room: "design-review", question: "Blue or green for the Pay button?", timeout_seconds: 60 }, { timeoutMs: 70_000 }));
  // The question arrives live (no reload) in NEEDS YOU, and the roster shows the agent waiting.
  const form = page.locator("#detail-body form.needs.question", { hasText: "Blue or green" });
  await form.waitFor();
  await page.locator("ul.roster li", { hasText: "design-bot" }).locator(".status.waiting").waitFor();
  assert.equal(asking.settled, false, "the agent waits for the answer");

  // Type filters: only questions.
  await page.getByRole("button", { name: "question", exact: true }).click();
  await page.locator(".stream .msg.progress").waitFor({ state: "detached" });
  assert.equal(await page.locator(".stream .msg.question").count(), 1);
  await page.getByRole("button", { name: "question", exact: true }).click();
  await page.locator(".stream .msg.progress").waitFor();
  // Date dividers: everything here is from today.
  assert.equal(await page.locator(".stream .divider").first().textContent(), "Today");

  await form.getByLabel("Your answer").fill("Green: it matches the brand palette.");
  await form.getByRole("button", { name: "Answer" }).click();
  const answered = await asking.promise;
  assert.equal(answered.answered, true);
  assert.equal(answered.answer, "Green: it matches the brand palette.");
  assert.equal(answered.answered_by, ADMIN.name);
  await page.locator(".stream .msg.question .closed", { hasText: "answered" }).waitFor();
  await page.locator(".stream .msg.answer", { hasText: "brand palette" }).waitFor();
  await page.locator("#detail-body form.needs").waitFor({ state: "detached" });
  await page.locator("ul.roster li", { hasText: "design-bot" }).locator(".status.working").waitFor();
  const messages = await roomMessages("design-review");
  const answer = messages.find((m) => m.type === "answer");
  assert.equal(answer.author, ADMIN.name, "the log records who answered");
  await context.close();
});

test("rooms: a blocker holds the agent until resolved in the dashboard; a reply being typed survives live updates", async () => {
  const agent = await namedAgent("infra-bot");
  const other = await namedAgent("infra-helper");
  const blocker = await agent.callTool("report_blocker", { room: "infra-ops", description: "The VPN certificate expired; I cannot reach the build farm." });
  const waiting = inFlight(agent.callTool("wait_for_resolution", { room: "infra-ops", blocker_id: blocker.blocker_id, timeout_seconds: 60 }, { timeoutMs: 70_000 }));
  // An agent cannot resolve it (no such tool; REST refuses).
  const refused = await s.server.http("POST", `/api/v1/rooms/infra-ops/blockers/${blocker.blocker_id}/resolve`, { token: s.agentToken, json: { reply: "fixed" } });
  assert.equal(refused.status, 403, refused.text);

  const context = await adminContext();
  const page = await openLive(context, "/");
  await page.getByRole("button", { name: "Rooms", exact: true }).click();
  await page.locator("#room-tabs button", { hasText: "infra-ops" }).click();
  const form = page.locator("#detail-body form.needs.blocker", { hasText: "VPN certificate" });
  await form.waitFor();
  await page.locator("ul.roster li", { hasText: "infra-bot" }).locator(".status.blocked").waitFor();

  const reply = form.getByLabel("Your reply (resolves the blocker)");
  await reply.fill("A new certificate is in the vault under vpn/2026");
  // Another agent posts while the person types: the room re-renders live; the draft and
  // the focus stay.
  await other.callTool("post_message", { room: "infra-ops", text: "Meanwhile I am rotating the logs." });
  await page.locator(".stream .msg", { hasText: "rotating the logs" }).waitFor();
  assert.equal(await reply.inputValue(), "A new certificate is in the vault under vpn/2026");
  assert.equal(await page.evaluate(() => document.activeElement && document.activeElement.id), `reply-${blocker.blocker_id}`);
  await reply.press("End");
  await page.keyboard.type(".");
  await sleep(500);
  assert.equal(waiting.settled, false, "still blocked until a person resolves it");

  await form.getByRole("button", { name: "Resolve" }).click();
  const resolved = await waiting.promise;
  assert.equal(resolved.resolved, true);
  assert.equal(resolved.reply, "A new certificate is in the vault under vpn/2026.");
  await page.locator(".stream .msg.blocker .closed", { hasText: "resolved" }).waitFor();
  await page.locator("ul.roster li", { hasText: "infra-bot" }).locator(".status.working").waitFor();
  // Resolved once: a second resolution is refused.
  const again = await s.server.http("POST", `/api/v1/rooms/infra-ops/blockers/${blocker.blocker_id}/resolve`, { token: s.approverToken, json: { reply: "again" } });
  assert.equal(again.status, 400, again.text);
  await context.close();
});

test("rooms: tabs carry live badges for what waits elsewhere, amber for approvals and questions, red for blockers", async () => {
  const agent = await namedAgent("badge-bot");
  await agent.callTool("join_room", { room: "badges-home" });
  const context = await adminContext();
  const page = await openLive(context, "/?room=badges-home");
  await page.locator("#list-title", { hasText: "badges-home" }).waitFor();

  // In other rooms: an approval and a question (amber), a blocker (red).
  await agent.callTool("request_approval", { action_description: "Rotate the payments API key", room: "badges-amber", idempotency_key: `badge-${Date.now()}` });
  await agent.callTool("wait_for_feedback", { room: "badges-amber", question: "Rotate during business hours?", timeout_seconds: 1 });
  const blocker = await agent.callTool("report_blocker", { room: "badges-red", description: "Disk full on the runner." });

  const amber = page.locator('#room-tabs button[data-room="badges-amber"]');
  const red = page.locator('#room-tabs button[data-room="badges-red"]');
  await amber.locator(".badge:not(.red)", { hasText: "2" }).waitFor();
  await red.locator(".badge.red", { hasText: "1" }).waitFor();
  assert.equal(await amber.locator(".badge.red").count(), 0);
  assert.equal(await red.locator(".badge:not(.red)").count(), 0);
  const colors = await page.evaluate(() => {
    const bg = (sel) => getComputedStyle(document.querySelector(sel)).backgroundColor;
    return { amber: bg('#room-tabs button[data-room="badges-amber"] .badge'), red: bg('#room-tabs button[data-room="badges-red"] .badge.red') };
  });
  assert.notEqual(colors.amber, colors.red, `amber and red differ: ${JSON.stringify(colors)}`);

  // Resolving the blocker elsewhere (REST, another person) clears the red badge live.
  const r = await s.server.http("POST", `/api/v1/rooms/badges-red/blockers/${blocker.blocker_id}/resolve`, { token: s.approverToken, json: { reply: "Cleaned up 40 GB." } });
  assert.equal(r.status, 200, r.text);
  await red.locator(".badge").waitFor({ state: "detached" });
  await shot(page, "desktop-1440x900-6-room-badges");
  await context.close();
});

test("rooms: a long room shows its newest messages at the bottom and loads older ones on demand", async () => {
  // 250 messages from five agents (one token may post 60 a minute by default).
  let n = 0;
  for (let w = 0; w < 5; w++) {
    const writer = await namedAgent(`chatty-${w}`);
    for (let j = 0; j < 50; j++, n++) {
      await writer.callTool("post_message", { room: "long-room", text: `line ${n}`, type: "progress" });
    }
  }
  const context = await adminContext();
  const page = await openLive(context, "/?room=long-room");
  await page.locator(".stream .msg.progress", { hasText: "line 249" }).waitFor();
  const texts = await page.locator(".stream .msg .text").allTextContents();
  assert.equal(texts[texts.length - 1], "line 249", "the newest message is at the bottom");
  assert.ok(texts.length <= 200, `one page is shown first, not ${texts.length}`);
  assert.ok(!texts.includes("line 0"), "the oldest message is not on the first page");
  await page.locator("#load-older").click();
  await page.locator(".stream .msg .text", { hasText: /^line 0$/ }).waitFor();
  const all = await page.locator(".stream .msg .text").allTextContents();
  assert.deepEqual(all, Array.from({ length: 250 }, (_, i) => `line ${i}`), "every message once, in order");
  await page.locator("#load-older").waitFor({ state: "detached" });
  await context.close();
});

test("rooms on a phone (390x844): NEEDS YOU opens as a bottom sheet and a blocker is resolved there", async () => {
  const agent = await namedAgent("mobile-bot");
  await agent.callTool("post_message", { room: "on-call", text: "Paging is quiet; watching the queue.", type: "progress" });
  const blocker = await agent.callTool("report_blocker", { room: "on-call", description: "The pager rotation has nobody for Saturday." });
  const waiting = inFlight(agent.callTool("wait_for_resolution", { room: "on-call", blocker_id: blocker.blocker_id, timeout_seconds: 60 }, { timeoutMs: 70_000 }));
  const context = await adminContext(PHONE);
  const page = await openLive(context, "/?room=on-call");
  const open = page.locator("#room-sheet-open", { hasText: "Needs you (1)" });
  await open.waitFor();
  await shot(page, "phone-390x844-6-room");
  await page.locator(".stream .msg.blocker").getByRole("button", { name: "Resolve" }).tap();
  await page.waitForFunction(() => document.querySelector("section.detail").classList.contains("open"));
  // The reply field has the focus, ready to type.
  assert.equal(await page.evaluate(() => document.activeElement && document.activeElement.id), `reply-${blocker.blocker_id}`);
  const sheet = page.locator("section.detail");
  await sheet.getByLabel("Your reply (resolves the blocker)").fill("Grace takes Saturday.");
  await sleep(350);
  await shot(page, "phone-390x844-7-room-sheet");
  await sheet.getByRole("button", { name: "Resolve" }).tap();
  const resolved = await waiting.promise;
  assert.equal(resolved.resolved, true);
  assert.equal(resolved.reply, "Grace takes Saturday.");
  await page.locator("#room-sheet-open", { hasText: "Roster" }).waitFor();
  await context.close();
});

test("rooms: desktop (1440x900) screenshot with all three panes", async () => {
  const agent = await namedAgent("release-bot");
  await agent.callTool("post_message", { room: "release-2-14", text: "Built web v2.14.0; canary at 5%.", type: "progress" });
  await agent.callTool("post_message", { room: "release-2-14", text: "Regression suite green: 1,482 passed.", type: "done" });
  await agent.callTool("request_approval", { action_description: "Promote web v2.14.0 from 5% to 100%", room: "release-2-14", idempotency_key: `release-${Date.now()}` });
  await agent.callTool("wait_for_feedback", { room: "release-2-14", question: "Promote now or after the EU morning peak?", timeout_seconds: 1 });
  const context = await adminContext();
  const page = await openLive(context, "/?room=release-2-14");
  await page.locator("#detail-body .needs.approval").waitFor();
  await page.locator("#detail-body form.needs.question").waitFor();
  // Review and decide opens the request itself.
  await shot(page, "desktop-1440x900-7-room");
  await page.locator("#detail-body .needs.approval").getByRole("button", { name: "Review and decide" }).click();
  await page.locator("#approve").waitFor();
  await context.close();
});

// ---- policies: why a person decides ---------------------------------------------------------

// Each policy as written: the dashboard must show exactly this text. The large-refunds one
// carries markup in a comment, which must stay text.
const HELD_POLICY = `@id("large-refunds")
@reason("refunds of 100 or more need <b>finance</b>")
@timeout_hours("4")
@on_timeout("reject")
permit(principal, action == Action::"refund", resource)
when {
  // <img src=x onerror="window.__pwned = 1">
  context.decimal has amount && context.decimal.amount.greaterThanOrEqual(decimal("100.0"))
};`;
const SMALL_POLICY = `@id("small-refunds")
@reason("refunds under 100 are routine")
permit(principal, action == Action::"refund", resource)
when { context.decimal has amount && context.decimal.amount.lessThan(decimal("100.0")) };`;
const FORBID_POLICY = `@id("no-production-deletes")
forbid(principal, action == Action::"delete", resource)
when { context.input has env && context.input.env == "production" };`;
const FALLBACK_POLICY = `@id("quick-deploys")
@timeout_hours("0.001")
@on_timeout("approve")
permit(principal, action == Action::"deploy", resource);`;
const POLICY_FILE = [HELD_POLICY, SMALL_POLICY, FORBID_POLICY, FALLBACK_POLICY].join("\n\n") + "\n";

/** The first admin of `server`, signed up through its setup link; the signed-in context. */
async function firstAdmin(server) {
  const context = await newContext(s.browser, { ...DESKTOP, baseURL: server.base });
  const page = await context.newPage();
  await page.goto(server.setupLink);
  await page.getByLabel("Username").fill(ADMIN.username);
  await page.getByLabel("Your name").fill(ADMIN.name);
  await page.getByLabel("Password").fill(ADMIN.password);
  await page.getByRole("button", { name: "Create account" }).click();
  await page.waitForURL((u) => u.pathname === "/");
  await page.close();
  return context;
}

/** The `#why` section of a request's page, once shown. The page before it is closed: each
 * holds a live connection, and Chromium opens at most six to one server over HTTP/1.1. */
let whyPage = null;
async function whyOf(context, id) {
  if (whyPage) await whyPage.close().catch(() => {});
  const page = await openLive(context, `/requests/${id}`);
  whyPage = page;
  await page.locator("#detail-body h3").waitFor();
  return { page, why: page.locator("#why") };
}

test("policies: the dashboard says which policies hold a request, which decided one, and when none matched", async () => {
  const server = await new Countersign(process.env.COUNTERSIGN_BIN, {
    files: {
      "countersign.toml": '[policy]\nfiles = ["refunds.cedar"]\n',
      "refunds.cedar": POLICY_FILE,
    },
  }).start();
  try {
    const agent = await server.token("agent", "refund-bot");
    const make = async (description, details) => {
      const id = await server.createRequest(agent, { action_description: description, action_details: details });
      const r = await server.http("GET", `/api/v1/requests/${id}`, { token: agent });
      assert.equal(r.status, 200, r.text);
      return r.body;
    };
    const held = await make("Refund order 7731", { tool: "refund", amount: "250.00" });
    const small = await make("Refund order 7732", { tool: "refund", amount: "20.00" });
    const forbidden = await make("Delete the orders table", { tool: "delete", env: "production" });
    const unmatched = await make("Email the customer", { tool: "email", to: "kim@example.com" });
    const deploy = await make("Deploy web 2.15", { tool: "deploy" });
    // What the gate decided, over REST (its shapes unchanged: no policy text there).
    assert.equal(held.status, "pending");
    assert.equal(held.policy.id, "large-refunds");
    const digest = held.policy.policy_set;
    assert.match(digest, /^sha256:[0-9a-f]{64}$/);
    assert.equal(small.status, "approved");
    assert.equal(small.decision.authorization_type, "policy");
    assert.equal(forbidden.status, "rejected");
    assert.equal(forbidden.decision.policy.id, "no-production-deletes");
    assert.equal(unmatched.status, "pending");
    assert.equal(unmatched.policy, undefined);
    assert.ok(!JSON.stringify(held).includes("finance"), "the REST view carries no policy text");
    // The why is the dashboard's: an agent's token reaches it on neither surface.
    for (const p of [`/ui/api/requests/${held.request_id}/why`, `/api/v1/requests/${held.request_id}/why`]) {
      const r = await server.http("GET", p, { token: agent });
      assert.ok(r.status === 401 || r.status === 404, `${p}: ${r.status} ${r.text}`);
      assert.ok(!r.text.includes("finance"), r.text);
    }

    const context = await firstAdmin(server);

    // Held: a person decides because of large-refunds, with its requirements and text.
    let { page, why } = await whyOf(context, held.request_id);
    await why.waitFor();
    assert.equal(await why.locator("h4").textContent(), "A person decides because:");
    const policies = why.locator("li.why-policy");
    assert.equal(await policies.count(), 1);
    const large = why.locator('li[data-policy-id="large-refunds"]');
    assert.equal(await large.locator("h5").textContent(), "large-refunds (permit)");
    assert.equal(await large.locator("pre.policy-text").textContent(), HELD_POLICY);
    assert.equal(await large.locator(".reason").textContent(), "refunds of 100 or more need <b>finance</b>");
    const requirements = await large.locator("table.kv tr").allTextContents();
    assert.deepEqual(requirements, ["@timeout_hours4 (people have 4 h at most)", "@on_timeoutreject (a timeout becomes a signed rejection, by fallback)"]);
    assert.ok((await why.textContent()).includes(`Policy set ${digest} (in force).`), await why.textContent());
    // The markup in the policy stayed text: no element made of it, no script run.
    assert.equal(await why.locator("img, b").count(), 0);
    assert.equal(await page.evaluate(() => window.__pwned), undefined);
    // The list marks it too.
    const card = page.locator(`.card[data-id="${held.request_id}"]`);
    assert.equal(await card.locator(".why-mark").textContent(), "held by policy large-refunds");
    await shot(page, "desktop-1440x900-8-policy-held");

    // Approved by policy: decided by small-refunds, with its text; no person named.
    ({ page, why } = await whyOf(context, small.request_id));
    await why.waitFor();
    assert.equal(await why.getAttribute("data-kind"), "policy");
    assert.equal(await why.locator("h4").textContent(), "Decided by policy small-refunds");
    assert.equal(await why.locator('li[data-policy-id="small-refunds"] pre.policy-text').textContent(), SMALL_POLICY);
    await page.locator("#detail-body .notice.ok", { hasText: "Approved by policy small-refunds at" }).waitFor();

    // Rejected by the forbid.
    ({ page, why } = await whyOf(context, forbidden.request_id));
    await why.waitFor();
    assert.equal(await why.locator("h4").textContent(), "Decided by policy no-production-deletes");
    const forbid = why.locator('li[data-policy-id="no-production-deletes"]');
    assert.equal(await forbid.locator("h5").textContent(), "no-production-deletes (forbid)");
    assert.equal(await forbid.locator("pre.policy-text").textContent(), FORBID_POLICY);
    await page.locator("#detail-body .notice.error", { hasText: "Rejected by policy no-production-deletes at" }).waitFor();

    // No policy matched: one person decides, and the list says so.
    ({ page, why } = await whyOf(context, unmatched.request_id));
    await why.waitFor();
    assert.equal(await why.getAttribute("data-kind"), "no_match");
    assert.equal(await why.locator("h4").textContent(), "No policy matched, so one person decides.");
    assert.equal(await why.locator("li.why-policy").count(), 0);
    assert.equal(await page.locator(`.card[data-id="${unmatched.request_id}"] .why-mark`).textContent(), "no policy matched");
    await page.locator("#approve").waitFor();

    // A timeout the policy turned into an approval (0.001 h: about 4 s).
    const waited = await server.http("GET", `/api/v1/requests/${deploy.request_id}/wait?timeout_seconds=30`, { token: agent, timeoutMs: 40_000 });
    assert.equal(waited.body.status, "approved", waited.text);
    ({ page, why } = await whyOf(context, deploy.request_id));
    await why.waitFor();
    assert.equal(await why.getAttribute("data-kind"), "fallback");
    assert.equal(await why.locator("h4").textContent(), "Decided by policy quick-deploys");
    assert.equal(await why.locator('li[data-policy-id="quick-deploys"] pre.policy-text').textContent(), FALLBACK_POLICY);
    assert.ok((await why.textContent()).includes("Nobody decided in time"));

    // A new version of the rules: the held request names its own set, whose text is now
    // only in the log.
    fs.writeFileSync(path.join(server.dataDir, "refunds.cedar"), `${POLICY_FILE}// version 2\n`);
    ({ page, why } = await whyOf(context, held.request_id));
    const deadline = Date.now() + 15_000;
    while (!(await why.textContent().catch(() => "")).includes("no longer in force")) {
      assert.ok(Date.now() < deadline, `the new policy set was not noticed: ${await why.textContent().catch(() => "")}`);
      await sleep(500);
      await page.reload();
      await page.locator("#detail-body h3").waitFor();
    }
    assert.equal(await why.locator("h4").textContent(), "A person decides because:");
    assert.equal(await why.locator('li[data-policy-id="large-refunds"]').count(), 1);
    assert.equal(await why.locator("pre.policy-text").count(), 0, "the text of a set not in force is not shown");
    assert.ok((await why.textContent()).includes(`Policy set ${digest}, no longer in force: its text is in the log's policy_set_loaded entry with that digest.`));
  } finally {
    server.cleanup();
  }
});

test("policies: with none configured the dashboard shows nothing about them", async () => {
  const id = await createRequest("Rotate the staging database password", { env: "staging" });
  const r = await s.server.http("GET", `/ui/api/requests/${id}/why`, { token: s.approverToken });
  assert.notEqual(r.status, 200, "a bearer token reaches the dashboard's API");
  const context = await adminContext();
  const page = await openLive(context, `/requests/${id}`);
  await page.locator("#detail-body h3", { hasText: "Rotate the staging database password" }).waitFor();
  const answer = await page.evaluate(async (rid) => (await fetch(`/ui/api/requests/${rid}/why`)).json(), id);
  assert.deepEqual(answer, { why: null });
  assert.equal(await page.locator("#why").count(), 0);
  await page.locator(`.card[data-id="${id}"]`).waitFor();
  assert.equal(await page.locator(".card .why-mark").count(), 0);
});

// ---- quorum and standing grants ------------------------------------------------------------

test("quorum and grants: the dashboard shows k of n approvals, gives a grant with an approval, lists and revokes it", async () => {
  const server = await new Countersign(process.env.COUNTERSIGN_BIN, {
    files: {
      "countersign.toml": '[policy]\nfiles = ["payouts.cedar"]\n',
      "payouts.cedar": '@id("two-for-payouts")\n@approvals("2")\npermit(principal, action == Action::"payout", resource);\n',
    },
  }).start();
  try {
    const agent = await server.token("agent", "payout-bot");
    const first = await server.token("approver", "ops-first");
    const view = async (id) => (await server.http("GET", `/api/v1/requests/${id}`, { token: agent })).body;
    const payout = await server.createRequest(agent, { action_description: "Pay out 900 EUR to ACME", action_details: { tool: "payout", amount: "900" } });
    const one = await server.http("POST", `/api/v1/requests/${payout}/decision`, { token: first, json: { decision: "approved" } });
    assert.equal(one.status, 200, one.text);
    assert.equal(one.body.status, "pending");
    assert.equal(one.body.quorum.still_needed, 1);

    const context = await firstAdmin(server);
    let page = await openLive(context, `/requests/${payout}`);
    const quorum = page.locator("#quorum");
    await quorum.waitFor();
    assert.equal(await quorum.locator("h4").textContent(), "1 of 2 approvals; 1 more needed");
    assert.ok((await quorum.locator("li").first().textContent()).startsWith("ops-first via api"), await quorum.textContent());
    assert.equal(await page.locator(`.card[data-id="${payout}"] .quorum-mark`).textContent(), "1 of 2 approvals");
    // No grant on a request that needs a quorum.
    assert.equal(await page.locator("#grant").count(), 0);
    await shot(page, "desktop-1440x900-9-quorum");
    await page.locator("#approve").click();
    await page.locator("#detail-body .notice.ok", { hasText: "Approved. The agent has its proof." }).waitFor();
    await page.locator("#quorum h4", { hasText: "2 of 2 approvals" }).waitFor();
    const approved = await view(payout);
    assert.equal(approved.status, "approved");
    assert.deepEqual(approved.decision.approvers.map((a) => a.id), ["token:ops-first", `user:${ADMIN.username}`]);
    await page.close();

    // A refund approved with a standing grant: EUR only, at most 100, three times.
    const refund = await server.createRequest(agent, { action_description: "Refund order 9001", action_details: { tool: "refund", amount: "40", currency: "EUR" } });
    page = await openLive(context, `/requests/${refund}`);
    await page.locator("#grant").waitFor();
    await page.getByLabel("Also allow token:payout-bot to use refund without asking").check();
    await page.getByLabel("At most this many requests").fill("3");
    assert.equal(await page.locator("#grant-exact-currency").isChecked(), true, "a text detail is pinned by default");
    await page.getByLabel("amount at most (empty: any)").fill("100");
    await page.locator("#approve").click();
    const notice = page.locator("#detail-body .notice.ok", { hasText: "Grant grt_" });
    await notice.waitFor();
    assert.ok((await notice.textContent()).includes("refund allowed until"), await notice.textContent());
    await page.close();

    const inside = await view(await server.createRequest(agent, { action_description: "Refund order 9002", action_details: { tool: "refund", amount: "60", currency: "EUR" } }));
    assert.equal(inside.status, "approved", JSON.stringify(inside));
    assert.equal(inside.decision.authorization_type, "grant");
    assert.equal(inside.decision.grant.granted_by.id, `user:${ADMIN.username}`);
    const outside = await view(await server.createRequest(agent, { action_description: "Refund order 9003", action_details: { tool: "refund", amount: "160", currency: "EUR" } }));
    assert.equal(outside.status, "pending", "over the grant's ceiling");

    // The Grants page lists it, used once of three; revoking it takes effect at once.
    page = await openLive(context, "/");
    await page.getByRole("button", { name: "Grants" }).click();
    const row = page.locator(`.grant-card[data-grant-id="${inside.decision.grant.id}"]`);
    await row.waitFor();
    assert.equal(await row.getAttribute("data-status"), "active");
    assert.equal(await row.locator(".desc").textContent(), "payout-bot may use refund");
    assert.equal(await row.locator(".grant-bounds").textContent(), "currency = EUR, amount ≤ 100");
    assert.equal(await row.locator(".grant-uses").textContent(), "1 of 3 used");
    await shot(page, "desktop-1440x900-10-grants");
    await row.getByRole("button", { name: "Revoke" }).click();
    await page.locator(`.grant-card[data-grant-id="${inside.decision.grant.id}"][data-status="revoked"]`).waitFor();
    const after = await view(await server.createRequest(agent, { action_description: "Refund order 9004", action_details: { tool: "refund", amount: "5", currency: "EUR" } }));
    assert.equal(after.status, "pending", "a revoked grant approved");
    await page.close();
  } finally {
    server.cleanup();
  }
});

test("records: the Records page shows a bridged process's records, the open ones and their exposure", async () => {
  const records = [
    { id: "job-1041", record_type: "reindex", resolved: true, outcome: "win", cost: 4.25, result: 11.8, label: "nightly reindex, shard 3" },
    { id: "job-1042", record_type: "reindex", resolved: false, cost: 6.0, label: "reindex shard 7" },
    { id: "job-9", record_type: "backup", resolved: false, cost: 2.5 },
  ];
  const server = await new Countersign(process.env.COUNTERSIGN_BIN, {
    files: {
      "countersign.toml": '[[bridge]]\nname = "reindexer"\npending = "pending.json"\napproved = "approved.json"\nrecords = "records.json"\n',
      "records.json": JSON.stringify(records),
    },
  }).start();
  try {
    const context = await firstAdmin(server);
    const page = await openLive(context, "/");
    await page.getByRole("button", { name: "Records" }).click();
    const card = page.locator('.records-card[data-bridge="reindexer"]');
    await card.waitFor();
    assert.equal(await card.locator(".records-count").textContent(), "3 records: 1 resolved, 2 open");
    assert.equal(await card.locator(".records-exposure").textContent(), "exposure 8.5");
    const open = await card.locator(".records-open tbody tr").evaluateAll((rows) => rows.map((r) => r.dataset.recordId));
    assert.deepEqual(open, ["job-1042", "job-9"]);
    const latest = await card.locator(".records-latest tbody tr").evaluateAll((rows) => rows.map((r) => r.dataset.recordId));
    assert.deepEqual(latest, ["job-9", "job-1042", "job-1041"], "newest first");
    await shot(page, "desktop-1440x900-11-records");
    await page.close();
  } finally {
    server.cleanup();
  }
});

test("batch: one confirmation approves many requests, each with its own proof; one that changed meanwhile is reported", async () => {
  const server = await new Countersign(process.env.COUNTERSIGN_BIN).start();
  try {
    const agent = await server.token("agent", "export-bot");
    const other = await server.token("approver", "ops-other");
    const make = (n, tool) => server.createRequest(agent, { action_description: `Export report ${n}`, action_details: { tool, report: String(n) } });
    const ids = [await make(1, "export"), await make(2, "export"), await make(3, "export")];
    const unrelated = await make(4, "delete");
    const context = await firstAdmin(server);
    const page = await openLive(context, "/");
    await page.locator(`.card[data-id="${ids[2]}"]`).waitFor();
    await page.locator(`input.select[data-id="${ids[0]}"]`).check();
    await page.locator("#batch", { hasText: "1 selected" }).waitFor();
    await page.locator("#batch-like").click();
    await page.locator('#batch[data-selected="3"]').waitFor();
    assert.equal(await page.locator(`input.select[data-id="${unrelated}"]`).isChecked(), false, "another tool was selected");
    // Someone else decides one of them before the confirmation.
    const elsewhere = await server.http("POST", `/api/v1/requests/${ids[1]}/decision`, { token: other, json: { decision: "rejected", comment: "not this one" } });
    assert.equal(elsewhere.status, 200, elsewhere.text);
    await page.locator('#batch[data-changed="1"]').waitFor();
    await page.locator("#batch-approved").click();
    await page.locator("#batch-approved", { hasText: "Confirm: approve 3 requests" }).click();
    const notice = page.locator("#batch-notice");
    await notice.waitFor();
    const text = await notice.textContent();
    assert.ok(text.includes("Approved 2 of 3, each with its own proof."), text);
    assert.ok(text.includes(`Not decided: ${ids[1]}`), text);
    await shot(page, "desktop-1440x900-11-batch");
    const nonces = [];
    for (const id of [ids[0], ids[2]]) {
      const r = await server.http("GET", `/api/v1/requests/${id}`, { token: agent });
      assert.equal(r.body.status, "approved", r.text);
      assert.equal(r.body.decision.approvers[0].id, `user:${ADMIN.username}`);
      nonces.push(JSON.parse(Buffer.from(r.body.proof.payload, "base64").toString()).nonce);
    }
    assert.notEqual(nonces[0], nonces[1], "each request has its own proof");
    const kept = await server.http("GET", `/api/v1/requests/${ids[1]}`, { token: agent });
    assert.equal(kept.body.status, "rejected", "the batch overrode a decision made meanwhile");
    const untouched = await server.http("GET", `/api/v1/requests/${unrelated}`, { token: agent });
    assert.equal(untouched.body.status, "pending");
    await page.close();
  } finally {
    server.cleanup();
  }
});

// ---- over the whole run ----------------------------------------------------------------------

test("outcomes: an action whose outcome is unknown is marked in the list and explained in the detail", async () => {
  const context = await adminContext();
  const act = async (description, status, summary) => {
    const id = await createRequest(description, { tool: "write_file", upstream: "files" });
    const approved = await s.server.http("POST", `/api/v1/requests/${id}/decision`, { token: s.approverToken, json: { decision: "approved" } });
    assert.equal(approved.status, 200, approved.text);
    const used = await s.server.http("POST", `/api/v1/requests/${id}/actions`, { token: s.agentToken, json: { tool: "write_file", details: { forwarded_by: "serve:tools:0123" } } });
    assert.equal(used.status, 200, used.text);
    const outcome = await s.server.http("POST", `/api/v1/requests/${id}/outcome`, { token: s.agentToken, json: { status, summary } });
    assert.equal(outcome.status, 200, outcome.text);
    return id;
  };
  const unknown = await act("Write the quarterly report", "unknown", "no outcome: serve:tools:0123 stopped before files answered");
  const ok = await act("Write the release notes", "succeeded", "wrote notes.md");
  const page = await openLive(context, `/requests/${unknown}`);
  const warn = page.locator("#detail-body .notice.warn");
  await warn.waitFor();
  assert.match(await warn.textContent(), /Whether this action ran is unknown.*will not be sent again/);
  const [warnContrast] = await contrasts(page, [".notice.warn"]);
  assert.ok(warnContrast.ratio >= 4.5, `the notice is readable: ${warnContrast.ratio}`);
  const rows = await page.locator("#detail-body .outcome-section table.kv tr").allTextContents();
  assert.deepEqual(rows.slice(0, 2), ["OutcomeUnknown", "Summaryno outcome: serve:tools:0123 stopped before files answered"]);
  await page.locator("nav.side button", { hasText: "History" }).click();
  const card = page.locator(`.card[data-id="${unknown}"]`);
  await card.waitFor();
  assert.equal(await card.locator(".outcome-mark.unknown").textContent(), "outcome unknown");
  assert.equal(await page.locator(`.card[data-id="${ok}"] .outcome-mark`).count(), 0, "a known outcome is not marked");
  const [measured] = await contrasts(page, [".card .outcome-mark.unknown"]);
  assert.ok(measured.ratio >= 4.5, `the mark is readable: ${measured.ratio}`);
  await page.locator(`.card[data-id="${ok}"]`).click();
  // The detail pane still shows the unknown one until the click's fetch lands: wait for
  // the known one's own text, not for a section both have.
  await page.locator("#detail-body .outcome-section", { hasText: "wrote notes.md" }).waitFor();
  assert.equal(await page.locator("#detail-body .notice.warn").count(), 0);
  assert.match(await page.locator("#detail-body .outcome-section").textContent(), /OutcomeSucceeded/);
  await context.close();
});

test("no page reported a CSP violation or an uncaught script error during the run", () => {
  assert.deepEqual(problems, []);
});
