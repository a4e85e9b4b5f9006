//! Request smuggling and malformed HTTP/1.1 on a raw socket: ambiguous
//! framing, broken chunking, truncated bodies and oversized heads are refused
//! (or the connection closed) and never reach a replica.

use crate::common;

use std::time::Duration;

use common::*;

const LIMIT: Duration = Duration::from_secs(10);
const PATH: &str =
    "POST /v1/chat/completions HTTP/1.1\r\nHost: llmlb.test\r\nContent-Type: application/json\r\n";

async fn setup() -> (Upstream, llmlb::daemon::Running) {
    let (up, lb) = one_replica(
        Mode::Json,
        "[server]\nmax_header_bytes = 8192\nheader_read_timeout = \"500ms\"\n",
        "",
    )
    .await;
    (up, lb)
}

/// Sends `raw`, expects no 2xx answer, and no request at the replica.
async fn refused(raw: String, half_close: bool, expect: Option<u16>) {
    let (up, lb) = setup().await;
    let resp = raw_exchange(lb.addr, raw.as_bytes(), half_close, LIMIT).await;
    let status = raw_status(&resp);
    match expect {
        Some(code) => assert_eq!(
            status,
            Some(code),
            "{raw:?} → {}",
            String::from_utf8_lossy(&resp)
        ),
        None => assert!(
            status.is_none_or(|s| s >= 400),
            "{raw:?} was answered {status:?}"
        ),
    }
    assert_eq!(up.requests(), 0, "{raw:?} reached a replica");
    lb.shutdown().await;
}

#[tokio::test]
async fn well_formed_control_request_is_served() {
    // The same framing as the cases below, done right, does reach a replica:
    // the refusals are about the framing, not the test rig.
    let (up, lb) = setup().await;
    let raw = format!(
        "{PATH}Content-Length: {}\r\nConnection: close\r\n\r\n{CHAT}",
        CHAT.len()
    );
    let resp = raw_exchange(lb.addr, raw.as_bytes(), false, LIMIT).await;
    assert_eq!(raw_status(&resp), Some(200));
    let chunked = format!(
        "{PATH}Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n{:x}\r\n{CHAT}\r\n0\r\n\r\n",
        CHAT.len()
    );
    let resp = raw_exchange(lb.addr, chunked.as_bytes(), false, LIMIT).await;
    assert_eq!(raw_status(&resp), Some(200));
    assert_eq!(up.requests(), 2);
    lb.shutdown().await;
}

#[tokio::test]
async fn content_length_with_transfer_encoding_is_refused() {
    // CL.TE: a front end honouring Content-Length and a back end honouring
    // chunked would disagree on where the request ends.
    let raw = format!(
        "{PATH}Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
    );
    refused(raw, false, Some(400)).await;
}

#[tokio::test]
async fn duplicate_differing_content_length_is_refused() {
    let raw = format!(
        "{PATH}Content-Length: {}\r\nContent-Length: 3\r\n\r\n{CHAT}",
        CHAT.len()
    );
    refused(raw, false, Some(400)).await;
}

#[tokio::test]
async fn transfer_encoding_not_ending_in_chunked_is_refused() {
    let raw = format!("{PATH}Transfer-Encoding: chunked, identity\r\n\r\n{CHAT}");
    refused(raw, false, Some(400)).await;
}

#[tokio::test]
async fn whitespace_before_colon_is_refused() {
    let raw = format!("{PATH}Content-Length : {}\r\n\r\n{CHAT}", CHAT.len());
    refused(raw, false, Some(400)).await;
}

#[tokio::test]
async fn invalid_chunk_size_never_reaches_a_replica() {
    let raw = format!("{PATH}Transfer-Encoding: chunked\r\n\r\nzz\r\n{CHAT}\r\n0\r\n\r\n");
    refused(raw, false, None).await;
}

#[tokio::test]
async fn truncated_body_never_reaches_a_replica() {
    // Declares more bytes than it sends, then closes its write side.
    let raw = format!("{PATH}Content-Length: {}\r\n\r\n{}", CHAT.len() + 50, CHAT);
    refused(raw, true, None).await;
}

#[tokio::test]
async fn truncated_chunked_body_never_reaches_a_replica() {
    let raw = format!(
        "{PATH}Transfer-Encoding: chunked\r\n\r\n{:x}\r\n{CHAT}",
        CHAT.len() + 50
    );
    refused(raw, true, None).await;
}

#[tokio::test]
async fn oversized_head_is_refused_with_431() {
    let raw = format!(
        "{PATH}X-Big: {}\r\nContent-Length: 2\r\n\r\n{{}}",
        "b".repeat(16_000)
    );
    refused(raw, false, Some(431)).await;
}

#[tokio::test]
async fn request_line_garbage_is_refused() {
    refused("GARBAGE\r\n\r\n".to_string(), false, Some(400)).await;
    refused(
        "POST /v1/chat/completions HTTP/9.9\r\nHost: x\r\n\r\n".to_string(),
        false,
        None,
    )
    .await;
}
