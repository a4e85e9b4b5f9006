//! The client of the Redis (or Valkey) server that llmlb instances share
//! state in (`[fleet] store`, and the shared rate limits' `[limits] url`),
//! named by one URL ([`crate::config::StoreUrl`]):
//!
//! - `redis://[[user]:password@]host[:port][/db]` (`rediss://` with TLS where
//!   the build has it): that server;
//! - `redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/master[/db]`:
//!   the master that a group of Redis Sentinels names `master`. The
//!   Sentinels are asked again at every (re)connection, so after a failover
//!   the next connection goes to the new master. The credentials and the
//!   database are the master's; a Sentinel's port defaults to 26379;
//! - `redis+cluster://[[user]:password@]host:port[,host:port...]`: a Redis
//!   Cluster, reached through any of the nodes listed. Every key a script
//!   or pipeline touches must share a hash slot, so the fleet's keys are
//!   all under one hash tag and a rate-limit key's two buckets under one;
//!   there is no `wake` channel (refreshes keep their interval).

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

use crate::config::StoreUrl;

/// A handle on the store; connects only when asked.
pub enum StoreClient {
    /// One server.
    Direct(redis::Client),
    /// The master the Sentinels name, found again at each connection.
    Sentinel(tokio::sync::Mutex<SentinelClient>),
    /// A Redis Cluster.
    Cluster(ClusterClient),
}

/// A connection to the store: to one server, or to a cluster (which routes
/// each command to the node that holds its keys).
#[derive(Clone)]
pub enum StoreConn {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl ConnectionLike for StoreConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            StoreConn::Single(c) => c.req_packed_command(cmd),
            StoreConn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            StoreConn::Single(c) => c.req_packed_commands(cmd, offset, count),
            StoreConn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            StoreConn::Single(c) => c.get_db(),
            StoreConn::Cluster(c) => c.get_db(),
        }
    }
}

impl std::fmt::Debug for StoreClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StoreClient::Direct(_) => "StoreClient::Direct",
            StoreClient::Sentinel(_) => "StoreClient::Sentinel",
            StoreClient::Cluster(_) => "StoreClient::Cluster",
        })
    }
}

impl StoreClient {
    /// The handle for `url`, or why the URL cannot name a store.
    pub fn open(url: &str) -> Result<StoreClient, String> {
        match StoreUrl::parse(url)? {
            StoreUrl::Direct(info) => redis::Client::open(info)
                .map(StoreClient::Direct)
                .map_err(|e| e.to_string()),
            StoreUrl::Sentinel(s) => {
                let node =
                    SentinelNodeConnectionInfo::default().set_redis_connection_info(s.master);
                SentinelClient::build(s.sentinels, s.name, Some(node), SentinelServerType::Master)
                    .map(|c| StoreClient::Sentinel(tokio::sync::Mutex::new(c)))
                    .map_err(|e| e.to_string())
            }
            StoreUrl::Cluster(nodes) => ClusterClient::new(nodes)
                .map(StoreClient::Cluster)
                .map_err(|e| e.to_string()),
        }
    }

    /// Whether the store is a Redis Cluster (keys that go together need one
    /// hash tag; no pub/sub channel).
    pub fn is_cluster(&self) -> bool {
        matches!(self, StoreClient::Cluster(_))
    }

    /// A client of the server to talk to now (for a Sentinel-named master,
    /// the one the Sentinels name at this moment; none for a cluster).
    pub async fn client(&self) -> RedisResult<redis::Client> {
        match self {
            StoreClient::Direct(c) => Ok(c.clone()),
            StoreClient::Sentinel(s) => s.lock().await.async_get_client().await,
            StoreClient::Cluster(_) => Err(redis::RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "a cluster store has no single server",
            ))),
        }
    }

    /// A new connection to the store.
    pub async fn connect(&self) -> RedisResult<StoreConn> {
        match self {
            StoreClient::Cluster(c) => c.get_async_connection().await.map(StoreConn::Cluster),
            _ => Ok(StoreConn::Single(
                self.client()
                    .await?
                    .get_multiplexed_async_connection()
                    .await?,
            )),
        }
    }

    /// `prefix` as the prefix of keys that must share a hash slot: on a
    /// cluster, wrapped in a hash tag unless it has one (`{llmlb:fleet:}`).
    pub fn slot_prefix(&self, prefix: &str) -> String {
        if self.is_cluster() && !(prefix.contains('{') && prefix.contains('}')) {
            format!("{{{prefix}}}")
        } else {
            prefix.to_string()
        }
    }
}
