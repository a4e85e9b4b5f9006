//! What a store URL names (`[fleet] store`, `[limits] url`): one Redis or
//! Valkey server (any URL the Redis client reads: `redis://`, `rediss://`,
//! `redis+unix://`), a Redis Cluster (`redis+cluster://`), or the master a
//! group of Redis Sentinels names (`redis+sentinel://`).
//! `fleet::StoreClient` connects to it.

use redis::{ConnectionInfo, IntoConnectionInfo, RedisConnectionInfo};

/// The scheme of a Sentinel-named master.
pub const SENTINEL_SCHEME: &str = "redis+sentinel";

/// The scheme of a Redis Cluster.
pub const CLUSTER_SCHEME: &str = "redis+cluster";

/// The port a Sentinel listens on unless the URL names one.
const SENTINEL_PORT: u16 = 26379;

/// A store URL, read.
#[derive(Debug)]
pub enum StoreUrl {
    /// One server: the URL as the Redis client read it.
    Direct(ConnectionInfo),
    /// `redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/master[/db]`.
    Sentinel(SentinelUrl),
    /// `redis+cluster://[[user]:password@]host:port[,host:port...]`: some
    /// nodes of a Redis Cluster (`redis://` URLs, the credentials on each);
    /// the client learns the rest from them.
    Cluster(Vec<String>),
}

impl StoreUrl {
    /// Reads `url`, or says why it names no store.
    pub fn parse(url: &str) -> Result<StoreUrl, String> {
        match url.split_once("://") {
            Some((SENTINEL_SCHEME, rest)) => SentinelUrl::parse(rest).map(StoreUrl::Sentinel),
            Some((CLUSTER_SCHEME, rest)) => cluster_nodes(rest).map(StoreUrl::Cluster),
            _ => url
                .into_connection_info()
                .map(StoreUrl::Direct)
                .map_err(|e| e.to_string()),
        }
    }
}

/// The parts of a `redis+sentinel://` URL after its scheme.
#[derive(Debug)]
pub struct SentinelUrl {
    /// `redis://host:port` of each Sentinel.
    pub sentinels: Vec<String>,
    /// The master's name in the Sentinels' configuration.
    pub name: String,
    /// Credentials and database for the master.
    pub master: RedisConnectionInfo,
}

impl SentinelUrl {
    fn parse(rest: &str) -> Result<SentinelUrl, String> {
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (creds, hosts) = match authority.rsplit_once('@') {
            Some((c, h)) => (Some(c), h),
            None => (None, authority),
        };
        let sentinels = hosts
            .split(',')
            .map(sentinel_address)
            .collect::<Result<Vec<_>, _>>()?;
        let mut segments = path.split('/').filter(|s| !s.is_empty());
        let name = segments
            .next()
            .ok_or("names no master: redis+sentinel://HOST[:PORT][,...]/MASTER[/DB]")?
            .to_string();
        let mut master = RedisConnectionInfo::default();
        if let Some(db) = segments.next() {
            let db: i64 = db
                .parse()
                .map_err(|_| format!("database {db:?} is not a number"))?;
            master = master.set_db(db);
        }
        if segments.next().is_some() {
            return Err("has more than /MASTER/DB after its hosts".into());
        }
        if let Some(creds) = creds {
            let (user, password) = creds.split_once(':').unwrap_or((creds, ""));
            if !user.is_empty() {
                master = master.set_username(decode(user)?);
            }
            if !password.is_empty() {
                master = master.set_password(decode(password)?);
            }
        }
        Ok(SentinelUrl {
            sentinels,
            name,
            master,
        })
    }
}

/// The `redis://` URL of each node a `redis+cluster://` URL lists.
fn cluster_nodes(rest: &str) -> Result<Vec<String>, String> {
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.contains('/') {
        return Err("a cluster has no database or path: redis+cluster://HOST:PORT[,...]".into());
    }
    let (creds, hosts) = match authority.rsplit_once('@') {
        Some((c, h)) => (format!("{c}@"), h),
        None => (String::new(), authority),
    };
    hosts
        .split(',')
        .map(|node| {
            let url = format!("redis://{creds}{node}");
            match node.rsplit_once(':').map(|(_, p)| p.parse::<u16>()) {
                Some(Ok(_)) if redis::Client::open(url.as_str()).is_ok() => Ok(url),
                _ => Err(format!("cluster node {node:?} is not HOST:PORT")),
            }
        })
        .collect()
}

/// `redis://host:port` for one `host[:port]` of the list.
fn sentinel_address(hostport: &str) -> Result<String, String> {
    if hostport.is_empty() {
        return Err("has an empty Sentinel address".into());
    }
    let has_port = match hostport.rfind(':') {
        // An IPv6 address in brackets has colons of its own.
        Some(i) => !hostport[i..].contains(']'),
        None => false,
    };
    let address = if has_port {
        let (_, port) = hostport.rsplit_once(':').expect("checked");
        port.parse::<u16>()
            .map_err(|_| format!("Sentinel port {port:?} is not a port"))?;
        hostport.to_string()
    } else {
        format!("{hostport}:{SENTINEL_PORT}")
    };
    Ok(format!("redis://{address}"))
}

/// A URL's percent-encoded user or password, decoded.
fn decode(s: &str) -> Result<String, String> {
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .map(|c| c.into_owned())
        .map_err(|_| "credentials are not UTF-8 once decoded".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sentinel_url_names_its_sentinels_master_database_and_credentials() {
        let s = SentinelUrl::parse("u:p%40ss@10.0.0.1,10.0.0.2:26380,[::1]/main/3").unwrap();
        assert_eq!(
            s.sentinels,
            [
                "redis://10.0.0.1:26379",
                "redis://10.0.0.2:26380",
                "redis://[::1]:26379"
            ]
        );
        assert_eq!(s.name, "main");
        assert_eq!(s.master.db(), 3);
        assert_eq!(s.master.username(), Some("u"));
        assert_eq!(s.master.password(), Some("p@ss"));
        let bare = SentinelUrl::parse("127.0.0.1:5000/m").unwrap();
        assert_eq!(bare.sentinels, ["redis://127.0.0.1:5000"]);
        assert_eq!(bare.master.db(), 0);
        assert_eq!(bare.master.password(), None);
    }

    #[test]
    fn a_sentinel_url_without_a_master_or_with_a_bad_part_is_refused() {
        for bad in [
            "127.0.0.1:26379",
            "127.0.0.1:26379/",
            "127.0.0.1:notaport/m",
            "127.0.0.1,,host/m",
            "127.0.0.1/m/x",
            "127.0.0.1/m/1/extra",
        ] {
            assert!(SentinelUrl::parse(bad).is_err(), "{bad}");
            assert!(
                StoreUrl::parse(&format!("redis+sentinel://{bad}")).is_err(),
                "{bad}"
            );
        }
        assert!(StoreUrl::parse("redis+sentinel://127.0.0.1/m").is_ok());
        match StoreUrl::parse("redis+cluster://:pw@10.0.0.1:7000,10.0.0.2:7001/") {
            Ok(StoreUrl::Cluster(nodes)) => assert_eq!(
                nodes,
                ["redis://:pw@10.0.0.1:7000", "redis://:pw@10.0.0.2:7001"]
            ),
            other => panic!("{other:?}"),
        }
        for bad in ["10.0.0.1", "10.0.0.1:7000/0", "10.0.0.1:7000,,", ""] {
            assert!(
                StoreUrl::parse(&format!("redis+cluster://{bad}")).is_err(),
                "{bad}"
            );
        }
        assert!(StoreUrl::parse("redis://127.0.0.1:6379/0").is_ok());
        assert!(StoreUrl::parse("http://127.0.0.1").is_err());
    }
}
