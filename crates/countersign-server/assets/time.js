// Times as people read them: in their own time zone and locale. The server speaks UTC
// (RFC 3339) everywhere, in its JSON and in the words of its messages; every page shows
// those times through here.

/** An RFC 3339 time in the reader's local time, or "" for none. */
export function localTime(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? iso : d.toLocaleString(undefined, { dateStyle: "medium", timeStyle: "short" });
}

// An RFC 3339 UTC time as the server writes it into a message: 2026-12-04T21:52:16.123Z.
const UTC_TIME = /\b\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]00:00)/g;

/** A server message with each UTC time in it written in local time. */
export function localTimes(text) {
  return String(text).replace(UTC_TIME, (iso) => localTime(iso));
}
