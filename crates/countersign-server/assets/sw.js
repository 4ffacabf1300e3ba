// The dashboard's service worker: keeps the shell (the page's scripts, styles and
// icons, and an offline page) available without a network, so the installed app opens
// and says it is offline instead of showing the browser's error. Decisions always need
// the server: nothing under /ui/api, /api or /ui/events is ever cached or answered
// from here, and a page is always fetched from the network first.
const CACHE = "countersign-shell-v1";
const SHELL = [
  "/offline",
  "/assets/app.css",
  "/assets/app.js",
  "/assets/rooms.js",
  "/assets/time.js",
  "/assets/auth.js",
  "/assets/icon.svg",
  "/assets/icon-192.png",
  "/assets/icon-512.png",
  "/manifest.webmanifest",
];

self.addEventListener("install", (event) => {
  event.waitUntil(caches.open(CACHE).then((cache) => cache.addAll(SHELL)).then(() => self.skipWaiting()));
});

self.addEventListener("activate", (event) => {
  event.waitUntil(
    caches.keys()
      .then((keys) => Promise.all(keys.filter((k) => k !== CACHE).map((k) => caches.delete(k))))
      .then(() => self.clients.claim()),
  );
});

self.addEventListener("fetch", (event) => {
  const request = event.request;
  const url = new URL(request.url);
  if (request.method !== "GET" || url.origin !== self.location.origin) return;
  if (request.mode === "navigate") {
    // Pages: the network, always; the offline page only when there is none.
    event.respondWith(fetch(request).catch(() => caches.match("/offline")));
    return;
  }
  if (SHELL.includes(url.pathname)) {
    // The shell: the network first (a new release's scripts), the cache without one.
    event.respondWith(
      fetch(request)
        .then((response) => {
          if (response.ok) {
            const copy = response.clone();
            caches.open(CACHE).then((cache) => cache.put(url.pathname, copy));
          }
          return response;
        })
        .catch(() => caches.match(url.pathname)),
    );
  }
  // Everything else (the API, the event stream, proofs) goes to the network untouched.
});
