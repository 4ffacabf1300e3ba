-- Tokens get an optional expiry (milliseconds since the epoch; NULL: never), optional
-- scopes (comma-separated; NULL: everything the role may), and names unique forever,
-- ignoring ASCII case: `name_key` is the name with A-Z lowercased (as countersign and
-- SQLite's lower() do it), under a unique index, and is kept after a token is revoked,
-- so a revoked name is never given to another token.
--
-- Tokens made before this keep working as they were: no expiry, their role's scopes.
-- Of tokens that already shared a name, the oldest gets the key and the others keep
-- working without it (`countersign doctor` names them).
ALTER TABLE tokens ADD COLUMN expires_at bigint;
ALTER TABLE tokens ADD COLUMN scopes text;
ALTER TABLE tokens ADD COLUMN name_key text;

UPDATE tokens AS t
SET name_key = translate(t.name, 'ABCDEFGHIJKLMNOPQRSTUVWXYZ', 'abcdefghijklmnopqrstuvwxyz')
WHERE NOT EXISTS (
    SELECT 1 FROM tokens AS older
    WHERE translate(older.name, 'ABCDEFGHIJKLMNOPQRSTUVWXYZ', 'abcdefghijklmnopqrstuvwxyz')
        = translate(t.name, 'ABCDEFGHIJKLMNOPQRSTUVWXYZ', 'abcdefghijklmnopqrstuvwxyz')
      AND (older.created_at < t.created_at
           OR (older.created_at = t.created_at AND older.id < t.id))
);

CREATE UNIQUE INDEX tokens_name_key ON tokens (name_key);
