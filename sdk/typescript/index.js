// Verifies countersign proofs in the service that acts on them, with nothing but
// node:crypto: the DSSE envelope's Ed25519 signature against the server's JWKS, the
// statement's shape, action digest, decision and expiry, and (when given) that the proof
// is for exactly the action about to run. Every check fails closed: anything unexpected
// makes the result invalid, with a stable reason code (the server's own, docs/proof-format.md).
//
// RFC 8785 canonical JSON is written here by hand because no dependency may be used: it
// is JSON.stringify's own number and string serialization with object keys sorted by
// UTF-16 code units, which is exactly what JavaScript's string comparison does.

import { createHash, createPublicKey, verify as cryptoVerify } from "node:crypto";

export const PAYLOAD_TYPE = "application/vnd.countersign.decision+json";
export const STATEMENT_TYPE = "countersign.decision/v1";
export const JWKS_PATH = "/.well-known/jwks.json";
export const REDEEM_PATH = "/api/v1/proofs/redeem";
export const UNBOUND_WARNING =
  "the action was not checked: this proof approves the action it names, which may not be " +
  "the one about to run; pass the action to bind the check to it, or redeem the proof to " +
  "consume it for exactly that action";

/** A JWKS that cannot be used (unreachable, malformed, or holding none of the pinned keys). */
export class JwksError extends Error {
  constructor(message, code = "jwks_unusable") {
    super(message);
    this.name = "JwksError";
    this.code = code;
  }
}

// --- canonical JSON and the action digest -------------------------------------------------

/** RFC 8785 (JCS) canonical JSON of a JSON value, as a string. */
export function canonicalJson(value) {
  if (value === null) return "null";
  switch (typeof value) {
    case "boolean":
      return value ? "true" : "false";
    case "number":
      if (!Number.isFinite(value)) throw new TypeError(`JCS has no form for the number ${value}`);
      // ECMAScript's Number serialization is the one RFC 8785 specifies (and -0 is "0").
      return JSON.stringify(value);
    case "string":
      return canonicalString(value);
    case "object": {
      if (Array.isArray(value)) return "[" + value.map(canonicalJson).join(",") + "]";
      if (Object.getPrototypeOf(value) !== Object.prototype && Object.getPrototypeOf(value) !== null) {
        throw new TypeError("JCS takes plain objects only");
      }
      // Default sort compares UTF-16 code units, as RFC 8785 section 3.2.3 requires.
      const keys = Object.keys(value).sort();
      return "{" + keys.map((k) => canonicalString(k) + ":" + canonicalJson(value[k])).join(",") + "}";
    }
    default:
      throw new TypeError(`JCS has no form for a ${typeof value}`);
  }
}

function canonicalString(s) {
  // A lone surrogate has no UTF-8 form; RFC 8785 requires well-formed strings.
  if (/[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/.test(s)) {
    throw new TypeError("a string holds a lone UTF-16 surrogate");
  }
  return JSON.stringify(s);
}

/** `"sha256:" + hex(SHA-256(JCS({description, details})))`: the digest a proof binds. */
export function computeActionDigest(description, details = {}) {
  checkAction({ description, details });
  const canonical = canonicalJson({ description, details });
  return "sha256:" + createHash("sha256").update(canonical, "utf8").digest("hex");
}

function checkAction(action) {
  if (action === null || typeof action !== "object" || Array.isArray(action)) {
    throw new TypeError("an action is {description, details}");
  }
  if (typeof action.description !== "string") throw new TypeError("action.description must be a string");
  const d = action.details;
  if (d === null || typeof d !== "object" || Array.isArray(d)) {
    throw new TypeError("action.details must be an object of strings");
  }
  for (const [k, v] of Object.entries(d)) {
    if (typeof v !== "string") {
      throw new TypeError(`action.details.${k} must be a string (amounts and ids are strings)`);
    }
  }
}

// --- encodings ----------------------------------------------------------------------------

const STD_B64 = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;
const URL_B64 = /^[A-Za-z0-9_-]*$/;

/** RFC 4648 standard base64 with padding, strictly: null for anything else. */
function decodeStdBase64(text) {
  if (typeof text !== "string" || !STD_B64.test(text)) return null;
  const bytes = Buffer.from(text, "base64");
  // Non-zero padding bits would let two texts name one byte string.
  return bytes.toString("base64") === text ? bytes : null;
}

function decodeUrlBase64(text) {
  if (typeof text !== "string" || !URL_B64.test(text) || text.length % 4 === 1) return null;
  const bytes = Buffer.from(text, "base64url");
  return bytes.toString("base64url") === text ? bytes : null;
}

/** DSSE v1 pre-authentication encoding of a payload type and the decoded payload. */
export function pae(payloadType, body) {
  const type = Buffer.from(payloadType, "utf8");
  return Buffer.concat([
    Buffer.from(`DSSEv1 ${type.length} `, "ascii"),
    type,
    Buffer.from(` ${body.length} `, "ascii"),
    body,
  ]);
}

// --- keys ---------------------------------------------------------------------------------

/** RFC 7638 thumbprint of an OKP key: base64url SHA-256 of {"crv","kty","x"} in that order. */
export function jwkThumbprint(jwk) {
  for (const m of ["crv", "kty", "x"]) {
    if (typeof jwk?.[m] !== "string") throw new TypeError(`a JWK needs the string member ${m}`);
  }
  const required = JSON.stringify({ crv: jwk.crv, kty: jwk.kty, x: jwk.x });
  return createHash("sha256").update(required, "utf8").digest("base64url");
}

/**
 * The usable keys of a JWKS, by kid: OKP / Ed25519 keys whose kid is their thumbprint.
 * Keys that fail a check are left out and listed in `rejected`, so a proof naming them
 * cannot verify. With `pin`, only keys whose kid is pinned are kept.
 */
export function loadJwks(jwks, { pin } = {}) {
  if (jwks instanceof TrustedKeys) return pin ? jwks.pinned(pin) : jwks;
  if (typeof jwks === "string") jwks = JSON.parse(jwks);
  if (jwks === null || typeof jwks !== "object" || !Array.isArray(jwks.keys)) {
    throw new JwksError("a JWKS is an object with a keys array");
  }
  const keys = new Map();
  const rejected = new Map();
  for (const jwk of jwks.keys) {
    const kid = typeof jwk?.kid === "string" ? jwk.kid : null;
    const problem = jwkProblem(jwk);
    if (problem) {
      if (kid !== null) rejected.set(kid, problem);
      continue;
    }
    if (keys.has(kid)) continue;
    keys.set(kid, createPublicKey({ key: { kty: "OKP", crv: "Ed25519", x: jwk.x }, format: "jwk" }));
  }
  const trusted = new TrustedKeys(keys, rejected);
  return pin ? trusted.pinned(pin) : trusted;
}

function jwkProblem(jwk) {
  if (jwk === null || typeof jwk !== "object") return "not an object";
  if (jwk.kty !== "OKP" || jwk.crv !== "Ed25519") return "not an OKP / Ed25519 key";
  if ("d" in jwk) return "it holds a private key";
  if ("alg" in jwk && jwk.alg !== "EdDSA" && jwk.alg !== "Ed25519") return `alg is ${jwk.alg}`;
  if ("use" in jwk && jwk.use !== "sig") return `use is ${jwk.use}`;
  const raw = decodeUrlBase64(jwk.x);
  if (raw === null || raw.length !== 32) return "x is not a 32-byte base64url Ed25519 key";
  if (jwk.kid !== jwkThumbprint(jwk)) return "its kid is not its RFC 7638 thumbprint";
  return null;
}

/** Keys ready to verify with; made by `loadJwks` or a `JwksCache`. */
export class TrustedKeys {
  constructor(keys, rejected = new Map()) {
    this.keys = keys;
    this.rejected = rejected;
  }

  get keyIds() {
    return [...this.keys.keys()];
  }

  /** Only the pinned keys; a JwksError when none of them is here. */
  pinned(pin) {
    const wanted = new Set(Array.isArray(pin) ? pin : [pin]);
    const keys = new Map([...this.keys].filter(([kid]) => wanted.has(kid)));
    if (keys.size === 0) {
      throw new JwksError(
        `none of the pinned keys (${[...wanted].join(", ")}) is in the JWKS, which has ${this.keyIds.join(", ") || "no usable key"}`,
        "pin_mismatch",
      );
    }
    return new TrustedKeys(keys, this.rejected);
  }
}

// --- verification -------------------------------------------------------------------------

/** The envelope in a proof given as an envelope, a JSON string, or a body with `proof`. */
function envelopeOf(proof) {
  if (typeof proof === "string") {
    try {
      proof = JSON.parse(proof);
    } catch {
      return null;
    }
  }
  if (proof !== null && typeof proof === "object" && !("payloadType" in proof) && proof.proof && typeof proof.proof === "object") {
    return proof.proof;
  }
  return proof;
}

const TIME = /^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(\.\d+)?(Z|\+00:00)$/;

/** Milliseconds since the epoch of a UTC RFC 3339 time, or null. */
function parseUtc(value) {
  const m = typeof value === "string" ? TIME.exec(value) : null;
  if (!m) return null;
  const [y, mo, d, h, mi, s] = m.slice(1, 7).map(Number);
  const ms = Date.UTC(y, mo - 1, d, h, mi, s);
  const check = new Date(ms);
  if (check.getUTCMonth() !== mo - 1 || check.getUTCDate() !== d || h > 23 || mi > 59 || s > 59) return null;
  return ms + (m[7] ? Number(m[7]) * 1000 : 0);
}

function nowMs(now) {
  if (now === undefined || now === null) return Date.now();
  if (now instanceof Date) return now.getTime();
  if (typeof now === "number") return now;
  const ms = parseUtc(now) ?? Date.parse(now);
  if (Number.isNaN(ms)) throw new TypeError(`now is not a time: ${now}`);
  return ms;
}

/**
 * Verifies a proof offline against trusted keys. Never throws for a bad proof: the result
 * says `valid: false` with `reasons` ({code, message}). Throws only for bad options (no
 * keys, an action that is not {description, details of strings}).
 *
 * @param proof the DSSE envelope, its JSON text, or a body holding it as `proof`
 * @param options.jwks a JWKS object (or its text), or TrustedKeys
 * @param options.action {description, details}: the action about to run; without it the
 *   result is `bound: false` with a warning
 * @param options.now the time to check expiry at (Date, ms, or RFC 3339); default now
 * @param options.expectedKeyId the signature must be by this key
 * @param options.pin trust only these key ids
 */
export function verifyProof(proof, options = {}) {
  const { jwks, action, now, expectedKeyId, pin } = options;
  if (jwks === undefined || jwks === null) throw new TypeError("verifyProof needs options.jwks");
  const keys = loadJwks(jwks, { pin });
  let digest = null;
  if (action !== undefined && action !== null) digest = computeActionDigest(action.description, action.details ?? {});
  const at = nowMs(now);

  const result = {
    valid: false,
    bound: digest !== null,
    keyId: null,
    reasons: [],
    warning: null,
    statement: null,
    requestId: null,
    decision: null,
    actionDigest: null,
    validUntil: null,
  };
  const fail = (code, message) => {
    result.reasons.push({ code, message });
    return result;
  };

  const envelope = envelopeOf(proof);
  if (envelope === null || typeof envelope !== "object" || Array.isArray(envelope)) {
    return fail("malformed_envelope", "the proof is not a JSON object");
  }
  if (envelope.payloadType !== PAYLOAD_TYPE) {
    return fail("wrong_payload_type", `payloadType is ${JSON.stringify(envelope.payloadType)}, not ${PAYLOAD_TYPE}`);
  }
  const body = decodeStdBase64(envelope.payload);
  if (body === null) return fail("malformed_envelope", "payload is not standard padded base64");
  const signatures = envelope.signatures;
  if (!Array.isArray(signatures) || signatures.length === 0) {
    return fail("malformed_envelope", "the envelope has no signatures");
  }

  const message = pae(PAYLOAD_TYPE, body);
  const unknown = [];
  const bad = [];
  for (const s of signatures) {
    const kid = s !== null && typeof s === "object" && typeof s.keyid === "string" ? s.keyid : null;
    if (expectedKeyId !== undefined && expectedKeyId !== null && kid !== expectedKeyId) {
      unknown.push(`${kid} is not the expected key ${expectedKeyId}`);
      continue;
    }
    const key = kid === null ? undefined : keys.keys.get(kid);
    if (!key) {
      const why = kid !== null && keys.rejected.get(kid);
      unknown.push(why ? `${kid} is in the JWKS but unusable: ${why}` : `${kid} is not a trusted key`);
      continue;
    }
    const sig = decodeStdBase64(s.sig);
    if (sig === null || sig.length !== 64 || !cryptoVerify(null, message, key, sig)) {
      bad.push(`the signature by ${kid} does not verify`);
      continue;
    }
    result.keyId = kid;
    break;
  }
  if (result.keyId === null) {
    if (bad.length) return fail("bad_signature", bad.concat(unknown).join("; "));
    return fail("unknown_key", unknown.join("; "));
  }

  let st;
  try {
    st = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(body));
  } catch (e) {
    return fail("malformed_statement", `the payload is not JSON: ${e.message}`);
  }
  const shape = statementProblem(st);
  if (shape) return fail("malformed_statement", shape);
  result.statement = st;
  result.requestId = st.request_id;
  result.decision = st.decision;
  result.actionDigest = st.action_digest;
  result.validUntil = st.valid_until;

  const recomputed = computeActionDigest(st.action.description, st.action.details);
  if (recomputed !== st.action_digest) {
    return fail("digest_mismatch", `action_digest ${st.action_digest} is not the digest of its action (${recomputed})`);
  }
  if (st.decision !== "approved") fail("not_approved", `the decision is ${st.decision}, not approved`);
  const until = parseUtc(st.valid_until);
  if (!(at < until)) fail("expired", `the approval was valid until ${st.valid_until}`);
  if (digest !== null && digest !== st.action_digest) {
    fail("action_mismatch", `the proof is for another action (${st.action_digest}), not this one (${digest})`);
  }
  result.valid = result.reasons.length === 0;
  if (result.valid && digest === null) result.warning = UNBOUND_WARNING;
  return result;
}

function statementProblem(st) {
  if (st === null || typeof st !== "object" || Array.isArray(st)) return "the statement is not a JSON object";
  if (st.type !== STATEMENT_TYPE) return `type is ${JSON.stringify(st.type)}, not ${STATEMENT_TYPE}`;
  for (const f of ["request_id", "decision", "authorization_type", "action_digest", "nonce"]) {
    if (typeof st[f] !== "string") return `${f} is not a string`;
  }
  if (st.decision !== "approved" && st.decision !== "rejected") return `decision is ${st.decision}`;
  try {
    checkAction(st.action);
  } catch (e) {
    return e.message;
  }
  for (const f of ["requested_at", "decided_at", "valid_until"]) {
    if (parseUtc(st[f]) === null) return `${f} is not a UTC RFC 3339 time`;
  }
  if (!Array.isArray(st.approvers)) return "approvers is not an array";
  return null;
}

// --- talking to a server ------------------------------------------------------------------

/** The JWKS URL of a server (its base URL, or the JWKS URL itself). */
export function jwksUrl(serverUrl) {
  const base = String(serverUrl).replace(/\/+$/, "");
  return base.endsWith(JWKS_PATH) ? base : base + JWKS_PATH;
}

async function request(url, init, timeoutMs) {
  const signal = AbortSignal.timeout(timeoutMs);
  return fetch(url, { ...init, signal, redirect: "error" });
}

/**
 * GETs a server's JWKS and returns its usable keys (TrustedKeys). With `pin`, only the
 * pinned key ids are trusted, and a JWKS holding none of them is a JwksError.
 */
export async function fetchJwks(serverUrl, { pin, timeoutMs = 10_000 } = {}) {
  const url = jwksUrl(serverUrl);
  let response;
  try {
    response = await request(url, { headers: { accept: "application/json" } }, timeoutMs);
  } catch (e) {
    throw new JwksError(`GET ${url} failed: ${e.message}`, "jwks_unreachable");
  }
  if (response.status !== 200) throw new JwksError(`GET ${url} answered ${response.status}`, "jwks_unreachable");
  let jwks;
  try {
    jwks = await response.json();
  } catch (e) {
    throw new JwksError(`GET ${url} did not answer JSON: ${e.message}`);
  }
  return loadJwks(jwks, { pin });
}

/**
 * A server's keys, fetched once and kept for `ttlMs`. A proof signed by a key the cache
 * does not hold makes it fetch again (at most once per `minRefreshMs`), so a rotation is
 * picked up; with `pin`, only pinned keys are ever trusted.
 */
export class JwksCache {
  constructor(serverUrl, { pin, ttlMs = 300_000, minRefreshMs = 30_000, timeoutMs = 10_000 } = {}) {
    this.serverUrl = serverUrl;
    this.pin = pin;
    this.ttlMs = ttlMs;
    this.minRefreshMs = minRefreshMs;
    this.timeoutMs = timeoutMs;
    this.keys = null;
    this.fetchedAt = -Infinity;
    this.inflight = null;
  }

  /** The trusted keys, fetched if missing, stale, or `force`d. */
  async get({ force = false } = {}) {
    const age = Date.now() - this.fetchedAt;
    if (this.keys && !force && age < this.ttlMs) return this.keys;
    if (!this.inflight) {
      this.inflight = fetchJwks(this.serverUrl, { pin: this.pin, timeoutMs: this.timeoutMs })
        .then((keys) => {
          this.keys = keys;
          this.fetchedAt = Date.now();
          return keys;
        })
        .finally(() => {
          this.inflight = null;
        });
    }
    return this.inflight;
  }

  /** verifyProof with this server's keys. */
  async verifyProof(proof, options = {}) {
    const result = verifyProof(proof, { ...options, jwks: await this.get() });
    const unknown = result.reasons.some((r) => r.code === "unknown_key");
    if (unknown && Date.now() - this.fetchedAt >= this.minRefreshMs) {
      return verifyProof(proof, { ...options, jwks: await this.get({ force: true }) });
    }
    return result;
  }
}

/**
 * Redeems a proof for exactly `action` with an executor token: the server checks it and
 * consumes the approval, once. Resolves to the server's answer with `redeemed: true`, or
 * `{redeemed: false, status, code, message}` when refused (already_used, action_mismatch,
 * not_approved, approval_expired, invalid_proof, not_found, ...). Act only on
 * `redeemed === true`. Rejects only when the server cannot be reached.
 */
export async function redeemProof(serverUrl, token, proof, action, { timeoutMs = 10_000 } = {}) {
  checkAction({ description: action?.description, details: action?.details ?? {} });
  const url = String(serverUrl).replace(/\/+$/, "") + REDEEM_PATH;
  const response = await request(
    url,
    {
      method: "POST",
      headers: { authorization: `Bearer ${token}`, "content-type": "application/json", accept: "application/json" },
      body: JSON.stringify({
        proof: envelopeOf(proof),
        action_description: action.description,
        action_details: action.details ?? {},
      }),
    },
    timeoutMs,
  );
  const text = await response.text();
  let body = null;
  try {
    body = JSON.parse(text);
  } catch {
    // Reported below as a refusal with the text.
  }
  if (response.status === 200 && body?.redeemed === true) return { ...body, redeemed: true, status: 200 };
  return {
    redeemed: false,
    status: response.status,
    code: body?.error?.code ?? "unexpected_answer",
    message: body?.error?.message ?? text.slice(0, 500),
  };
}

// --- LoopPause compatibility ------------------------------------------------------------

/** Where countersign serves its keys in LoopPause's shape (base64 SPKI DER per key). */
export const LOOPPAUSE_KEY_PATH = "/.well-known/looppause-signing-key.json";
export const LOOPPAUSE_FAILED_WARNING = "Proof verification FAILED. Do NOT execute the action.";

const LP_AUTHORIZATION = { human: "human", policy: "policy", grant: "grant", fallback: "system_fallback" };

/** A JWKS holding the Ed25519 key given as base64 SPKI DER (LoopPause's pinned form). */
function jwksOfSpki(publicKey) {
  let key;
  try {
    key = createPublicKey({ key: Buffer.from(String(publicKey), "base64"), format: "der", type: "spki" });
  } catch (e) {
    throw new JwksError(`publicKey is not a base64 SPKI DER key: ${e.message}`);
  }
  if (key.asymmetricKeyType !== "ed25519") throw new JwksError(`publicKey is ${key.asymmetricKeyType}, not Ed25519`);
  const { x } = key.export({ format: "jwk" });
  const jwk = { kty: "OKP", crv: "Ed25519", x };
  jwk.kid = jwkThumbprint(jwk);
  return { keys: [jwk] };
}

/** The fields a check_approval result shows that differ from its signed statement. */
function loopPauseMismatches(result, envelope, statement) {
  const bad = [];
  const same = (a, b) => JSON.stringify(canonicalOrNull(a)) === JSON.stringify(canonicalOrNull(b));
  const check = (name, shown, signed) => {
    if (shown !== undefined && !same(shown, signed)) bad.push(name);
  };
  check("pause_id", result.pause_id, statement.request_id);
  check("action_digest", result.action_digest, statement.action_digest);
  check("status", result.status, "responded");
  const r = result.response;
  if (r !== undefined) {
    if (r === null || typeof r !== "object") return ["response"];
    const sig = envelope.signatures?.[0];
    check("response.decision", r.decision, statement.decision);
    check("response.comment", r.comment, statement.comment ?? null);
    check("response.fields", r.fields, statement.fields);
    check("response.authorization_type", r.authorization_type, LP_AUTHORIZATION[statement.authorization_type] ?? statement.authorization_type);
    check("response.nonce", r.nonce, statement.nonce);
    check("response.signing_key_id", r.signing_key_id, sig?.keyid);
    if (r.signature !== undefined) {
      const raw = decodeStdBase64(sig?.sig ?? "");
      const expected = raw ? `ed25519=${raw.toString("base64url")}` : null;
      if (r.signature !== expected) bad.push("response.signature");
    }
    if (r.responded_at !== undefined && parseUtc(r.responded_at) !== parseUtc(statement.decided_at)) bad.push("response.responded_at");
    if (r.valid_until !== undefined && parseUtc(r.valid_until) !== parseUtc(statement.valid_until)) bad.push("response.valid_until");
  }
  return bad;
}

function canonicalOrNull(v) {
  return v === undefined ? null : JSON.parse(canonicalJson(v));
}

/**
 * LoopPause's verifier, for countersign's LoopPause profile: takes the whole
 * check_approval result (or its `proof`), verifies the DSSE/Ed25519 proof inside with
 * countersign's rules, and checks that every decision field the result shows is the
 * signed one (an edited result is never valid). Resolves to LoopPause's answer,
 * `{valid, key_id, verified_at, warning}`, with countersign's `reasons`, `bound` and
 * `statement` beside it.
 *
 * Keys: `publicKey` (base64 SPKI DER, pinned, as LoopPause's offline form), or `jwks`,
 * or fetched from `serverUrl` (default: the LOOPPAUSE_API_URL environment variable).
 *
 * @param options.action {description, details}: bind the check to the action about to run
 * @param options.now the time to check expiry at
 */
export async function verifyLoopPauseProof(proof, options = {}) {
  const { publicKey, action, now, timeoutMs } = options;
  let { jwks } = options;
  const verifiedAt = new Date(nowMs(now)).toISOString();
  let whole = proof;
  if (typeof whole === "string") {
    try {
      whole = JSON.parse(whole);
    } catch {
      whole = null;
    }
  }
  if (publicKey !== undefined && publicKey !== null) jwks = jwksOfSpki(publicKey);
  if (jwks === undefined || jwks === null) {
    const serverUrl = options.serverUrl ?? process.env.LOOPPAUSE_API_URL;
    if (!serverUrl) throw new TypeError("verifyLoopPauseProof needs options.publicKey, options.jwks or options.serverUrl (or LOOPPAUSE_API_URL)");
    jwks = await fetchJwks(serverUrl, { timeoutMs });
  }
  const hasResult = whole !== null && typeof whole === "object" && !("payloadType" in whole);
  const pending = hasResult && !(whole.proof && typeof whole.proof === "object");
  const r = pending
    ? { valid: false, bound: false, keyId: null, reasons: [{ code: "malformed_envelope", message: `no proof here: the status is ${JSON.stringify(whole.status ?? null)}, not responded` }], warning: null, statement: null }
    : verifyProof(whole, { jwks, action, now });
  if (hasResult && !pending && r.statement) {
    const bad = loopPauseMismatches(whole, whole.proof, r.statement);
    if (bad.length) {
      r.reasons.push({ code: "result_mismatch", message: `the result's ${bad.join(", ")} differ from the signed proof: it was altered` });
      r.valid = false;
    }
  }
  const valid = r.valid && r.reasons.length === 0;
  const envelope = hasResult ? whole.proof : whole;
  return {
    valid,
    verified_at: verifiedAt,
    key_id: r.keyId ?? envelope?.signatures?.[0]?.keyid ?? null,
    warning: valid ? r.warning : `${LOOPPAUSE_FAILED_WARNING} (${r.reasons.map((x) => x.message).join("; ")})`,
    bound: r.bound,
    reasons: r.reasons,
    statement: r.statement ?? null,
  };
}
