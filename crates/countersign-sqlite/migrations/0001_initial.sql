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

-- Every state change, in commit order. `seq` is assigned by the writer as max + 1 inside
-- the write transaction (not AUTOINCREMENT), so it is gap-free even when a job rolls
-- back to its savepoint; rows are never deleted. `bytes` are exactly Event::to_bytes(),
-- the bytes the transparency log hashes.
CREATE TABLE events (
    seq        INTEGER PRIMARY KEY NOT NULL,
    at         INTEGER NOT NULL,
    kind       TEXT NOT NULL,
    request_id TEXT REFERENCES requests (id),
    bytes      BLOB NOT NULL
) STRICT;

CREATE INDEX events_request ON events (request_id) WHERE request_id IS NOT NULL;

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
