//! Test support shared by the integration tests: a scriptable upstream
//! replica on a real loopback socket, llmlb started on port 0, a small HTTP
//! client, `/metrics` reading, bounded polling, and `llmlb serve` as a child
//! process.

#![allow(dead_code)]

// Shared by the submodules through `use super::*`.
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, mpsc};

mod client;
mod collector;
mod metrics;
mod process;
mod proxy;
mod redis_server;
mod upstream;
mod wait;

// Each test uses part of the support; the rest is unused there.
#[allow(unused_imports)]
pub use client::*;
#[allow(unused_imports)]
pub use collector::*;
#[allow(unused_imports)]
pub use metrics::*;
#[allow(unused_imports)]
pub use process::*;
#[allow(unused_imports)]
pub use proxy::*;
#[allow(unused_imports)]
pub use redis_server::*;
#[allow(unused_imports)]
pub use upstream::*;
#[allow(unused_imports)]
pub use wait::*;
