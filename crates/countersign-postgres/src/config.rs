//! The database URL and [`Options`], turned into the connection settings every
//! connection of a store shares.

use std::time::Duration;

use countersign_store::StoreError;
use tokio_postgres::config::Host;

/// How to connect. The defaults suit a deployment of a few instances.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Pooled connections for reads and for log integration (the writer and each
    /// listener have their own connection besides).
    pub pool_size: usize,
    /// Keep countersign's tables in this schema, created if missing, rather than in the
    /// first schema of the connection's `search_path` (usually `public`). Lowercase
    /// ASCII letters, digits and `_`, starting with a letter or `_`, at most 63 bytes.
    pub schema: Option<String>,
    /// How long a statement waits for a lock (the log head, held by another instance's
    /// write) before failing with [`StoreError::Unavailable`].
    pub lock_timeout: Duration,
    /// How long opening a connection may take, unless the URL says
    /// (`connect_timeout`); also how long a caller waits for a free pooled connection.
    pub connect_timeout: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            pool_size: 8,
            schema: None,
            lock_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
        }
    }
}

/// The parsed settings, and how to name the server in messages (never the password).
#[derive(Clone)]
pub(crate) struct Target {
    pub(crate) config: tokio_postgres::Config,
    pub(crate) name: String,
    pub(crate) schema: Option<String>,
}

impl Target {
    pub(crate) fn new(url: &str, options: &Options) -> Result<Self, StoreError> {
        // The parser's errors never repeat the URL, which may hold a password.
        let mut config: tokio_postgres::Config = url
            .parse()
            .map_err(|e| StoreError::Backend(format!("invalid PostgreSQL database URL: {e}")))?;
        if let Some(schema) = &options.schema {
            check_schema_name(schema)?;
        }
        if config.get_hosts().is_empty() {
            return Err(StoreError::Backend(
                "invalid PostgreSQL database URL: it names no host \
                 (postgres://user@host:port/database)"
                    .into(),
            ));
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(options.connect_timeout);
        }
        if config.get_application_name().is_none() {
            config.application_name("countersign");
        }
        // Server settings for every connection, as startup options. Ours come first so
        // that the URL's own `options` can override them, except the schema, which is
        // the caller's explicit choice.
        //
        // - lock_timeout: a write waiting for another instance's lock on the log head
        //   fails (retryably) rather than hanging.
        // - idle_in_transaction_session_timeout: an instance that stalls mid-transaction
        //   (frozen, partitioned) loses its locks, so it cannot stop the others.
        let mut startup = format!(
            "-c lock_timeout={} -c idle_in_transaction_session_timeout=30000",
            options.lock_timeout.as_millis().max(1)
        );
        if let Some(own) = config.get_options() {
            startup.push(' ');
            startup.push_str(own);
        }
        if let Some(schema) = &options.schema {
            startup.push_str(&format!(" -c search_path={schema}"));
        }
        config.options(startup);
        let name = describe(&config);
        Ok(Self {
            config,
            name,
            schema: options.schema.clone(),
        })
    }

    /// The settings of the listener's connection: TCP keepalives probe a quiet
    /// connection every 30 seconds, so a silently dropped one is noticed and replaced.
    pub(crate) fn listener_config(&self) -> tokio_postgres::Config {
        let mut config = self.config.clone();
        config
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(30))
            .keepalives_interval(Duration::from_secs(10))
            .keepalives_retries(3);
        config
    }
}

/// `host:port/database as user`, without the password.
fn describe(config: &tokio_postgres::Config) -> String {
    let ports = config.get_ports();
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, host)| {
            let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
            match host {
                Host::Tcp(name) if name.contains(':') => format!("[{name}]:{port}"),
                Host::Tcp(name) => format!("{name}:{port}"),
                #[cfg(unix)]
                Host::Unix(dir) => format!("{} (socket, port {port})", dir.display()),
            }
        })
        .collect();
    let user = config.get_user().unwrap_or("the current user");
    let database = config.get_dbname().unwrap_or("(the user's database)");
    format!("{}/{database} as {user}", hosts.join(","))
}

fn check_schema_name(schema: &str) -> Result<(), StoreError> {
    let mut chars = schema.chars();
    let starts_well = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
    let rest_ok = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    // pg_ prefixes are reserved for the system.
    if !starts_well || !rest_ok || schema.len() > 63 || schema.starts_with("pg_") {
        return Err(StoreError::Backend(format!(
            "invalid PostgreSQL schema name {schema:?}: use lowercase letters, digits and _, \
             starting with a letter, at most 63 characters"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_description_names_the_server_but_never_the_password() {
        let target = Target::new(
            "postgres://alice:s3cret@db.internal:6543/gate?sslmode=disable",
            &Options::default(),
        )
        .unwrap();
        assert_eq!(target.name, "db.internal:6543/gate as alice");
        assert!(!target.name.contains("s3cret"));
        assert_eq!(target.config.get_application_name(), Some("countersign"));
    }

    #[test]
    fn startup_options_set_timeouts_and_the_schema_after_the_urls_own() {
        let options = Options {
            schema: Some("cs_tenant_1".into()),
            lock_timeout: Duration::from_millis(1500),
            ..Options::default()
        };
        let target = Target::new(
            "postgres://u@h/d?options=-c%20statement_timeout%3D9000",
            &options,
        )
        .unwrap();
        assert_eq!(
            target.config.get_options(),
            Some(
                "-c lock_timeout=1500 -c idle_in_transaction_session_timeout=30000 \
                 -c statement_timeout=9000 -c search_path=cs_tenant_1"
            )
        );
    }

    #[test]
    fn bad_urls_and_schemas_are_refused_with_a_reason() {
        let err = Target::new("postgres://u@h/d?sslmode=sometimes", &Options::default())
            .err()
            .unwrap();
        assert!(
            err.to_string().contains("invalid PostgreSQL database URL"),
            "{err}"
        );
        for bad in ["", "Upper", "1abc", "a-b", "pg_catalog", &"x".repeat(64)] {
            let options = Options {
                schema: Some(bad.to_string()),
                ..Options::default()
            };
            let err = Target::new("postgres://u@h/d", &options).err().unwrap();
            assert!(err.to_string().contains("schema name"), "{bad}: {err}");
        }
    }
}
