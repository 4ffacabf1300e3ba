// Launches Debian's Chromium through playwright-core and watches every page for CSP
// violations and uncaught script errors.

import { chromium } from "playwright-core";

export const CHROMIUM = process.env.CHROMIUM_PATH || "/usr/bin/chromium";

export const DESKTOP = { viewport: { width: 1440, height: 900 } };
export const PHONE = {
  viewport: { width: 390, height: 844 },
  isMobile: true,
  hasTouch: true,
  deviceScaleFactor: 1,
};

export async function launch() {
  return chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    // A fresh temporary profile per launch (Playwright's default); no background traffic,
    // which on a closed network only makes Chromium slow.
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

/** Everything a page said that a test must see: CSP violations and uncaught errors. */
export const problems = [];

/** Pages where a test provokes a violation on purpose. */
const expectingViolations = new WeakSet();
export function expectViolations(page) {
  expectingViolations.add(page);
}

function watch(page) {
  page.on("console", (message) => {
    const text = message.text();
    if (expectingViolations.has(page)) return;
    if (/Content Security Policy|Refused to (execute|load|apply|connect|frame)/i.test(text)) {
      problems.push({ kind: "csp", url: page.url(), text });
    }
  });
  page.on("pageerror", (error) => {
    if (expectingViolations.has(page)) return;
    problems.push({ kind: "pageerror", url: page.url(), text: String(error && error.stack ? error.stack : error) });
  });
}

// A listener the browser installs before any page script (through DevTools, so the CSP
// does not apply to it): it records CSP violations that the console might not show.
const RECORD_VIOLATIONS = () => {
  window.__cspViolations = [];
  document.addEventListener("securitypolicyviolation", (e) => {
    window.__cspViolations.push(`${e.violatedDirective}: ${e.blockedURI || "inline"} (${e.sourceFile || ""}:${e.lineNumber || ""})`);
  });
};

/** A new browser context whose pages are all watched. Service workers are blocked unless
 * `options` allows them (the installable-app test), so that no test reads a cached shell. */
export async function newContext(browser, options) {
  const context = await browser.newContext({ serviceWorkers: "block", ...options });
  context.setDefaultTimeout(10_000);
  context.setDefaultNavigationTimeout(15_000);
  await context.addInitScript(RECORD_VIOLATIONS);
  context.on("page", watch);
  return context;
}

/** Violations the page recorded itself. */
export async function recordedViolations(page) {
  return page.evaluate(() => window.__cspViolations || []).catch(() => []);
}
