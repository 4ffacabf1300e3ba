-- countersign schema, version 1.
--
-- Times are milliseconds since the Unix epoch (UTC), the precision countersign signs.
-- Each table keeps, as columns, only what a query filters or sorts on; a request's
-- full state is its JSON `body`, which is what is read back.

-- Approval requests. `version` is the compare-and-swap token: a transition from
-- version n to n+1 updates the row only while it is still at n.
CREATE TABLE requests (
    id              TEXT PRIMARY KEY NOT NULL,
    version         INTEGER NOT NULL,
    status          TEXT NOT NULL,
    requested_by    TEXT NOT NULL,
    idempotency_key TEXT,
    requested_at    INTEGER NOT NULL,
    expires_at      INTEGER NOT NULL,
    body            TEXT NOT NULL
) STRICT;

-- One request per requester and idempotency key: the backstop behind the lookup that
-- create_request does in the same transaction.
CREATE UNIQUE INDEX requests_idempotency
    ON requests (requested_by, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- The expiry sweeper reads only pending requests, earliest expiry first.
CREATE INDEX requests_pending_expiry
    ON requests (expires_at, id)
    WHERE status = 'pending';

-- Listings, newest first, unfiltered or by status or by requester.
CREATE INDEX requests_recent ON requests (requested_at, id);
CREATE INDEX requests_status_recent ON requests (status, requested_at, id);
CREATE INDEX requests_requester_recent ON requests (requested_by, requested_at, id);

-- Every state change, in commit order: the transparency log's entries. `seq` is assigned
-- by the writer as max + 1 inside the write transaction (not AUTOINCREMENT), so it is
-- gap-free even when a job rolls back to its savepoint; rows are never updated or
-- deleted. `bytes` are exactly the log entry (the Merkle leaf is SHA-256(0x00 || bytes));
-- log index = seq - 1. `subject` is the request (or recorded decision) it is about.
CREATE TABLE events (
    seq     INTEGER PRIMARY KEY NOT NULL,
    at      INTEGER NOT NULL,
    kind    TEXT NOT NULL,
    subject TEXT,
    bytes   BLOB NOT NULL
) STRICT;

CREATE INDEX events_subject ON events (subject, seq) WHERE subject IS NOT NULL;

-- The openings of the entries' payload commitments: the salt (hex) and the payload JSON.
-- Kept apart from the entries so that a payload can be erased while the log verifies.
CREATE TABLE payloads (
    seq     INTEGER PRIMARY KEY NOT NULL REFERENCES events (seq),
    salt    TEXT NOT NULL,
    payload TEXT NOT NULL
) STRICT;

-- Log settings: `origin` (the checkpoint origin line, fixed at first start) and
-- `integrated_size` (how many entries have their Merkle nodes below).
CREATE TABLE log_meta (
    key   TEXT PRIMARY KEY NOT NULL,
    value TEXT NOT NULL
) STRICT;

-- Roots of perfect Merkle subtrees: (level, idx) covers entries
-- [idx * 2^level, (idx + 1) * 2^level); level 0 holds the leaf hashes.
CREATE TABLE log_nodes (
    level INTEGER NOT NULL,
    idx   INTEGER NOT NULL,
    hash  BLOB NOT NULL,
    PRIMARY KEY (level, idx)
) STRICT, WITHOUT ROWID;

-- Signed checkpoints (C2SP tlog-checkpoint notes), one per tree size.
CREATE TABLE checkpoints (
    size       INTEGER PRIMARY KEY NOT NULL,
    note       TEXT NOT NULL,
    created_at INTEGER NOT NULL
) STRICT;

-- Bearer tokens, by the SHA-256 of the secret only; revoked tokens stay, for the record.
CREATE TABLE tokens (
    id         TEXT PRIMARY KEY NOT NULL,
    hash       TEXT NOT NULL UNIQUE,
    name       TEXT NOT NULL,
    role       TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    revoked_at INTEGER
) STRICT;

CREATE INDEX tokens_created ON tokens (created_at, id);

-- Small documents by kind and id: accounts, sessions, invitations, settings, rooms.
-- `version` is the compare-and-swap token; `key` is unique within a kind when set (a
-- username, a token hash).
CREATE TABLE documents (
    kind       TEXT NOT NULL,
    id         TEXT NOT NULL,
    version    INTEGER NOT NULL,
    key        TEXT,
    body       TEXT NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (kind, id)
) STRICT, WITHOUT ROWID;

CREATE UNIQUE INDEX documents_key ON documents (kind, key) WHERE key IS NOT NULL;
