-- Tokens get an optional expiry (milliseconds since the epoch; NULL: never), optional
-- scopes (comma-separated; NULL: everything the role may), and names unique forever,
-- ignoring ASCII case: `name_key` is the lowercased name, under a unique index, and is
-- kept after a token is revoked, so a revoked name is never given to another token.
--
-- Tokens made before this keep working as they were: no expiry, their role's scopes.
-- Of tokens that already shared a name, the oldest gets the key and the others keep
-- working without it (`countersign doctor` names them).
ALTER TABLE tokens ADD COLUMN expires_at INTEGER;
ALTER TABLE tokens ADD COLUMN scopes TEXT;
ALTER TABLE tokens ADD COLUMN name_key TEXT;

UPDATE tokens SET name_key = lower(name)
WHERE NOT EXISTS (
    SELECT 1 FROM tokens AS older
    WHERE lower(older.name) = lower(tokens.name)
      AND (older.created_at < tokens.created_at
           OR (older.created_at = tokens.created_at AND older.id < tokens.id))
);

CREATE UNIQUE INDEX tokens_name_key ON tokens (name_key);
