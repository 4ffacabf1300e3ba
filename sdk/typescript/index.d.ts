// Types of @countersign/verify (index.js is the implementation; plain JavaScript, so the
// package needs no build step).

/// <reference types="node" />

import type { KeyObject } from "node:crypto";

export declare const PAYLOAD_TYPE: "application/vnd.countersign.decision+json";
export declare const STATEMENT_TYPE: "countersign.decision/v1";
export declare const JWKS_PATH: "/.well-known/jwks.json";
export declare const REDEEM_PATH: "/api/v1/proofs/redeem";
export declare const UNBOUND_WARNING: string;

/** What was approved: amounts and ids are strings. */
export interface Action {
  description: string;
  details: Record<string, string>;
}

export interface DsseEnvelope {
  payloadType: string;
  payload: string;
  signatures: { keyid: string; sig: string }[];
}

export interface Jwk {
  kty: string;
  crv: string;
  x: string;
  kid: string;
  alg?: string;
  use?: string;
  [member: string]: unknown;
}

export interface Jwks {
  keys: Jwk[];
}

/** The decision statement a proof carries (docs/proof-format.md); fields are only ever added. */
export interface Statement {
  type: "countersign.decision/v1";
  request_id: string;
  decision: "approved" | "rejected";
  authorization_type: "human" | "policy" | "fallback" | "grant" | string;
  action: Action;
  action_digest: string;
  requested_by: { id: string; display_name: string; auth_method: string };
  approvers: { id: string; display_name: string; channel: string; auth_method: string; account?: string }[];
  comment: string | null;
  fields: Record<string, string>;
  requested_at: string;
  decided_at: string;
  valid_until: string;
  nonce: string;
  [member: string]: unknown;
}

export type ReasonCode =
  | "malformed_envelope"
  | "wrong_payload_type"
  | "unknown_key"
  | "bad_signature"
  | "malformed_statement"
  | "digest_mismatch"
  | "not_approved"
  | "expired"
  | "action_mismatch";

export interface Reason {
  code: ReasonCode;
  message: string;
}

export interface VerifyResult {
  /** True only when every check passed. Act on nothing else. */
  valid: boolean;
  /** Whether the action was checked; when false, a valid proof may be for another action. */
  bound: boolean;
  /** The key whose signature verified, or null. */
  keyId: string | null;
  /** Why the proof is not valid (empty when valid). */
  reasons: Reason[];
  /** Set when valid but not bound to an action. */
  warning: string | null;
  /** The signed statement, once the signature verified and it parsed. */
  statement: Statement | null;
  requestId: string | null;
  decision: string | null;
  actionDigest: string | null;
  validUntil: string | null;
}

export interface VerifyOptions {
  /** The trusted keys: a JWKS (object or JSON text) or TrustedKeys. */
  jwks: Jwks | string | TrustedKeys;
  /** The action about to run; the proof must be for exactly it. */
  action?: Action;
  /** The time to check expiry at; default now. */
  now?: Date | number | string;
  /** The signature must be by this key id. */
  expectedKeyId?: string;
  /** Trust only these key ids (RFC 7638 thumbprints). */
  pin?: string | string[];
}

/** A proof: the envelope, its JSON text, or a body holding it as `proof` (a request as the API returns it). */
export type ProofInput = DsseEnvelope | { proof: DsseEnvelope } | string | unknown;

export declare class JwksError extends Error {
  code: "jwks_unusable" | "jwks_unreachable" | "pin_mismatch" | string;
  constructor(message: string, code?: string);
}

export declare class TrustedKeys {
  keys: Map<string, KeyObject>;
  rejected: Map<string, string>;
  readonly keyIds: string[];
  pinned(pin: string | string[]): TrustedKeys;
}

export declare function canonicalJson(value: unknown): string;
export declare function computeActionDigest(description: string, details?: Record<string, string>): string;
export declare function pae(payloadType: string, body: Uint8Array): Buffer;
export declare function jwkThumbprint(jwk: { crv: string; kty: string; x: string }): string;
export declare function loadJwks(jwks: Jwks | string | TrustedKeys, options?: { pin?: string | string[] }): TrustedKeys;
export declare function verifyProof(proof: ProofInput, options: VerifyOptions): VerifyResult;
export declare function jwksUrl(serverUrl: string): string;
export declare function fetchJwks(
  serverUrl: string,
  options?: { pin?: string | string[]; timeoutMs?: number },
): Promise<TrustedKeys>;

export declare class JwksCache {
  constructor(
    serverUrl: string,
    options?: { pin?: string | string[]; ttlMs?: number; minRefreshMs?: number; timeoutMs?: number },
  );
  get(options?: { force?: boolean }): Promise<TrustedKeys>;
  verifyProof(proof: ProofInput, options?: Omit<VerifyOptions, "jwks">): Promise<VerifyResult>;
}

export type RedeemResult =
  | {
      redeemed: true;
      status: 200;
      request_id: string;
      action_digest: string;
      approvers: Statement["approvers"];
      fields: Record<string, string>;
      valid_until: string;
      redeemed_by: string;
      redeemed_at: string;
      message: string;
      [member: string]: unknown;
    }
  | { redeemed: false; status: number; code: string; message: string };

export declare function redeemProof(
  serverUrl: string,
  token: string,
  proof: ProofInput,
  action: Action,
  options?: { timeoutMs?: number },
): Promise<RedeemResult>;

export declare const LOOPPAUSE_KEY_PATH: string;
export declare const LOOPPAUSE_FAILED_WARNING: string;

export interface LoopPauseVerifyResult {
  valid: boolean;
  verified_at: string;
  key_id: string | null;
  /** Set when not valid, or when the action was not checked. */
  warning: string | null;
  bound: boolean;
  reasons: { code: string; message: string }[];
  statement: Record<string, unknown> | null;
}

/** LoopPause's verifier over countersign's proofs: the whole check_approval result or its proof. */
export declare function verifyLoopPauseProof(
  proof: unknown,
  options?: {
    publicKey?: string;
    jwks?: unknown;
    serverUrl?: string;
    action?: { description: string; details?: Record<string, string> };
    now?: Date | number | string;
    timeoutMs?: number;
  },
): Promise<LoopPauseVerifyResult>;
