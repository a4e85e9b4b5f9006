//! `[pools.tls]`: how llmlb checks the certificates of a pool's `https://`
//! replicas. Unset, the built-in public roots are trusted and each replica's
//! URL host is the name its certificate must carry.

use std::path::PathBuf;

use serde::Deserialize;

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamTlsConfig {
    /// PEM bundle of CA certificates trusted besides the built-in roots (a
    /// private CA, or a replica's self-signed certificate).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Name sent as SNI and checked against every replica's certificate
    /// instead of the URL host (replicas addressed by IP whose certificate
    /// names a service).
    #[serde(default)]
    pub server_name: Option<String>,
}
