-- Bootstrap: the table that records which migrations ran (see ../migrations.ts).
-- Old-server-friendly types on purpose (DateTime, not DateTime64), so that the bootstrap also runs
-- on the 18.16 server used for the HTTP adapter's transport test.
CREATE TABLE IF NOT EXISTS schema_migrations
(
    version UInt32,
    name String,
    checksum String,
    applied_at DateTime
)
ENGINE = MergeTree
ORDER BY version;
