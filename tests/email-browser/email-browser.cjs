// Headless Chromium (Debian's /usr/bin/chromium, driven by playwright-core from
// tests/browser/node_modules: run with NODE_PATH=tests/browser/node_modules) for the
// email tests in crates/countersign/tests/it/channels.rs. Prints one JSON object.
//
//   email-browser.cjs scan URL...
//       Opens every URL as a mail scanner would (a fresh browser each, scripts on, no
//       clicks) and reports what each page showed and every request it made.
//   email-browser.cjs confirm URL
//       Opens a one-time decision link, clicks "Confirm approval", then opens the same
//       link again.
//   email-browser.cjs dashboard URL USERNAME PASSWORD
//       Opens a dashboard link signed out, signs in, and clicks Approve on the request.

const { chromium } = require("playwright-core");

const CHROMIUM = process.env.CHROMIUM_PATH || "/usr/bin/chromium";
const problems = [];

async function launch() {
  return chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: [
      "--no-sandbox",
      "--disable-gpu",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
      "--no-first-run",
      "--disable-default-apps",
      "--disable-extensions",
    ],
  });
}

async function newPage(browser) {
  const context = await browser.newContext();
  const page = await context.newPage();
  const requests = [];
  page.on("request", (r) => requests.push(`${r.method()} ${new URL(r.url()).pathname}`));
  // CSP violations are problems; a refused token's 401 is an answer, not one.
  page.on("console", (m) => {
    if (m.type() === "error" && /Content Security Policy|Refused to/.test(m.text())) {
      problems.push(`console: ${m.text()}`);
    }
  });
  page.on("pageerror", (e) => problems.push(`pageerror: ${e.message}`));
  page.setDefaultTimeout(10000);
  return { context, page, requests };
}

async function scan(browser, urls) {
  const visited = [];
  for (const url of urls) {
    const { context, page, requests } = await newPage(browser);
    const response = await page.goto(url, { waitUntil: "networkidle" });
    // Give late scripts a moment, as a scanner that renders would.
    await page.waitForTimeout(300);
    visited.push({
      url,
      status: response ? response.status() : null,
      final_url: page.url(),
      text: (await page.locator("body").innerText()).slice(0, 2000),
      requests,
    });
    await context.close();
  }
  return { visited };
}

async function confirm(browser, url) {
  const { context, page, requests } = await newPage(browser);
  await page.goto(url, { waitUntil: "networkidle" });
  const address_bar = page.url();
  await page.locator("#approve").waitFor({ state: "visible" });
  const shown = await page.locator("#request").innerText();
  if (process.env.SCREENSHOT_DIR) {
    await page.setViewportSize({ width: 390, height: 844 });
    await page.screenshot({ path: `${process.env.SCREENSHOT_DIR}/email-decide-phone.png`, fullPage: true });
  }
  await page.locator("#comment").fill("Confirmed from the emailed link");
  await page.locator("#approve").click();
  await page.locator("#message.ok").waitFor({ state: "visible" });
  const result = await page.locator("#message").innerText();
  await context.close();

  const again = await newPage(browser);
  await again.page.goto(url, { waitUntil: "networkidle" });
  await again.page.locator("#message.error").waitFor({ state: "visible" });
  const second = await again.page.locator("#message").innerText();
  const buttons = await again.page.locator("#approve:visible").count();
  await again.context.close();
  return { address_bar, shown, result, requests, second, second_buttons: buttons };
}

async function dashboard(browser, url, username, password) {
  const { context, page, requests } = await newPage(browser);
  await page.goto(url, { waitUntil: "networkidle" });
  const login_url = page.url();
  await page.locator("#username").fill(username);
  await page.locator("#password").fill(password);
  await page.locator("button[type=submit]").click();
  await page.waitForURL((u) => !u.pathname.startsWith("/login"));
  const after_login = page.url();
  await page.locator("#approve").waitFor({ state: "visible" });
  await page.locator("#approve").click();
  await page.locator(".notice.ok").first().waitFor({ state: "visible" });
  const result = await page.locator(".notice.ok").first().innerText();
  await context.close();
  return { login_url, after_login, result, requests };
}

(async () => {
  const [mode, ...args] = process.argv.slice(2);
  const browser = await launch();
  let out;
  try {
    if (mode === "scan") out = await scan(browser, args);
    else if (mode === "confirm") out = await confirm(browser, args[0]);
    else if (mode === "dashboard") out = await dashboard(browser, args[0], args[1], args[2]);
    else throw new Error(`unknown mode ${mode}`);
  } finally {
    await browser.close();
  }
  out.problems = problems;
  process.stdout.write(JSON.stringify(out) + "\n");
})().catch((err) => {
  process.stderr.write(`${err.stack || err}\n`);
  process.exit(1);
});
