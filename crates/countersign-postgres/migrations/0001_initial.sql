-- countersign schema for PostgreSQL, version 1. The same tables as the SQLite backend.
--
-- Times are milliseconds since the Unix epoch (UTC), the precision countersign signs.
-- Each table keeps, as columns, only what a query filters or sorts on; a request's
-- full state is its JSON `body`, which is what is read back.

-- Approval requests. `version` is the compare-and-swap token: a transition from
-- version n to n+1 updates the row only while it is still at n. `body` is jsonb so that
-- an operator can query it; nothing hashes these bytes, so normalisation is harmless.
CREATE TABLE requests (
    id              text PRIMARY KEY,
    version         bigint NOT NULL CHECK (version > 0),
    status          text NOT NULL,
    requested_by    text NOT NULL,
    idempotency_key text,
    requested_at    bigint NOT NULL,
    expires_at      bigint NOT NULL,
    body            jsonb NOT NULL
);

-- One request per requester and idempotency key: the backstop behind the lookup that
-- create_request does in the same statement.
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

-- The head of the event log: one row, locked (SELECT ... FOR UPDATE) first thing by
-- every transaction that appends events, in every instance. Holding it is what makes
-- sequence numbers gap-free and commit order equal to sequence order; `last_seq` is
-- the newest committed event, updated in the same transaction as the events.
CREATE TABLE log_head (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    last_seq bigint NOT NULL CHECK (last_seq >= 0)
);
INSERT INTO log_head (last_seq) VALUES (0);

-- Every state change, in commit order: the transparency log's entries. `seq` is
-- max + 1, assigned under the head lock (never a PostgreSQL sequence, which leaves
-- gaps on rollback and hands out numbers in start order, not commit order); rows are
-- never updated or deleted. `bytes` are exactly the log entry (the Merkle leaf is
-- SHA-256(0x00 || bytes)); log index = seq - 1. `subject` is the request (or recorded
-- decision) it is about.
CREATE TABLE events (
    seq     bigint PRIMARY KEY CHECK (seq > 0),
    at      bigint NOT NULL,
    kind    text NOT NULL,
    subject text,
    bytes   bytea NOT NULL
);

CREATE INDEX events_subject ON events (subject, seq) WHERE subject IS NOT NULL;

-- The openings of the entries' payload commitments: the salt (hex) and the payload JSON.
-- Kept apart from the entries so that a payload can be erased while the log verifies.
-- Text, not jsonb: these are the exact JSON texts written.
CREATE TABLE payloads (
    seq     bigint PRIMARY KEY REFERENCES events (seq),
    salt    text NOT NULL,
    payload text NOT NULL
);

-- Log settings: `origin` (the checkpoint origin line, fixed at first start) and
-- `integrated_size` (how many entries have their Merkle nodes below). The size row
-- exists from the start so that integrators can compare-and-swap it. Other settings
-- that are written once (meta_set_once) live here too.
CREATE TABLE log_meta (
    key   text PRIMARY KEY,
    value text NOT NULL
);
INSERT INTO log_meta (key, value) VALUES ('integrated_size', '0');

-- Roots of perfect Merkle subtrees: (level, idx) covers entries
-- [idx * 2^level, (idx + 1) * 2^level); level 0 holds the leaf hashes.
CREATE TABLE log_nodes (
    level smallint NOT NULL CHECK (level >= 0),
    idx   bigint NOT NULL CHECK (idx >= 0),
    hash  bytea NOT NULL CHECK (octet_length(hash) = 32),
    PRIMARY KEY (level, idx)
);

-- Signed checkpoints (C2SP tlog-checkpoint notes), one per tree size.
CREATE TABLE checkpoints (
    size       bigint PRIMARY KEY,
    note       text NOT NULL,
    created_at bigint NOT NULL
);

-- Bearer tokens, by the SHA-256 of the secret only; revoked tokens stay, for the record.
CREATE TABLE tokens (
    id         text PRIMARY KEY,
    hash       text NOT NULL UNIQUE,
    name       text NOT NULL,
    role       text NOT NULL,
    created_at bigint NOT NULL,
    revoked_at bigint
);

CREATE INDEX tokens_created ON tokens (created_at, id);

-- Small documents by kind and id: accounts, sessions, invitations, settings, rooms.
-- `version` is the compare-and-swap token; `key` is unique within a kind when set (a
-- username, a token hash). Kinds, ids and keys compare bytewise (COLLATE "C"), as in
-- SQLite: listings come in the same order on both backends whatever the database's
-- collation, and an id prefix is a range of the primary key. `body` is json rather
-- than jsonb: the text as written, so every JSON value reads back as it was (jsonb
-- refuses strings containing \u0000), and it can still be queried with ->, ->> etc.
CREATE TABLE documents (
    kind       text COLLATE "C" NOT NULL,
    id         text COLLATE "C" NOT NULL,
    version    bigint NOT NULL CHECK (version >= 0),
    key        text COLLATE "C",
    body       json NOT NULL,
    updated_at bigint NOT NULL,
    PRIMARY KEY (kind, id)
);

CREATE UNIQUE INDEX documents_key ON documents (kind, key) WHERE key IS NOT NULL;
