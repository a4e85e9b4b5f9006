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
//!   database are the master's; a Sentinel's port defaults to 26379.
//!
//! Redis Cluster URLs are not supported: the lease and rate-limit scripts
//! touch keys that a cluster would spread over slots.

use redis::RedisResult;
use redis::aio::MultiplexedConnection;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};

use crate::config::StoreUrl;

/// A handle on the store; connects only when asked.
pub enum StoreClient {
    /// One server.
    Direct(redis::Client),
    /// The master the Sentinels name, found again at each connection.
    Sentinel(tokio::sync::Mutex<SentinelClient>),
}

impl std::fmt::Debug for StoreClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StoreClient::Direct(_) => "StoreClient::Direct",
            StoreClient::Sentinel(_) => "StoreClient::Sentinel",
        })
    }
}

impl StoreClient {
    /// The handle for `url`, or why the URL cannot name a store.
    pub fn open(url: &str) -> Result<StoreClient, String> {
        match StoreUrl::parse(url)? {
            StoreUrl::Direct(url) => redis::Client::open(url.as_str())
                .map(StoreClient::Direct)
                .map_err(|e| e.to_string()),
            StoreUrl::Sentinel(s) => {
                let node =
                    SentinelNodeConnectionInfo::default().set_redis_connection_info(s.master);
                SentinelClient::build(s.sentinels, s.name, Some(node), SentinelServerType::Master)
                    .map(|c| StoreClient::Sentinel(tokio::sync::Mutex::new(c)))
                    .map_err(|e| e.to_string())
            }
        }
    }

    /// A client of the server to talk to now (for a Sentinel-named master,
    /// the one the Sentinels name at this moment).
    pub async fn client(&self) -> RedisResult<redis::Client> {
        match self {
            StoreClient::Direct(c) => Ok(c.clone()),
            StoreClient::Sentinel(s) => s.lock().await.async_get_client().await,
        }
    }

    /// A new multiplexed connection to that server.
    pub async fn connect(&self) -> RedisResult<MultiplexedConnection> {
        self.client()
            .await?
            .get_multiplexed_async_connection()
            .await
    }
}
