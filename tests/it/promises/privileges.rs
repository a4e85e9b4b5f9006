//! Clients do not choose their own privileges: with keys configured, the
//! tier and version headers count only when the config trusts them, and
//! the model list needs a key like everything else.

use crate::common::*;

const KEY: &str = "sk-free-0009";

/// `paid-1` is reserved for the paid tier (tier test) or runs version v2,
/// which gets no share of the split (version test).
fn config(paid: &Upstream, open: &Upstream, gateway: &str, versions: bool) -> String {
    let digest = llmlb::gateway::keys::hash_key(KEY);
    let (paid_extra, open_extra, routing) = if versions {
        (
            "version = \"v2\"",
            "version = \"v1\"",
            "[pools.canary]\nweights = { v1 = 100, v2 = 0 }\nsticky = [\"session\"]",
        )
    } else {
        ("", "", "")
    };
    let reserved = if versions {
        ""
    } else {
        "replicas = [\"paid-1\"]"
    };
    format!(
        "[gateway]\n{gateway}\n\
         [[tiers]]\nname = \"paid\"\npriority = \"high\"\n{reserved}\n\
         [[tiers]]\nname = \"free\"\npriority = \"low\"\n\
         [[keys]]\nsha256 = \"{digest}\"\ntenant = \"t\"\ntier = \"free\"\n\
         [[pools]]\nname = \"llama\"\nmodels = [\"llama-3-8b\"]\n{routing}\n\
         [[pools.replicas]]\nurl = \"{}\"\nname = \"paid-1\"\n{paid_extra}\n\
         [[pools.replicas]]\nurl = \"{}\"\nname = \"open-1\"\n{open_extra}\n",
        paid.url(),
        open.url()
    )
}

async fn served_by(addr: std::net::SocketAddr, header: (&'static str, &str)) -> String {
    let mut req = chat_request("/v1/chat/completions", CHAT);
    req.headers_mut()
        .insert(header.0, header.1.parse().unwrap());
    let (status, _, body) = call(addr, req).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    v["replica"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn with_keys_the_tier_and_version_headers_are_ignored_unless_trusted() {
    let paid = Upstream::start("paid-1", Mode::Json).await;
    let open = Upstream::start("open-1", Mode::Json).await;
    let tiers = start_llmlb(&config(&paid, &open, "", false)).await;
    let versions = start_llmlb(&config(&paid, &open, "", true)).await;
    for _ in 0..3 {
        assert_eq!(
            served_by(tiers.addr, ("x-llmlb-tier", "paid")).await,
            "open-1"
        );
        assert_eq!(
            served_by(versions.addr, ("x-llmlb-version", "v2")).await,
            "open-1"
        );
    }
    assert_eq!(paid.requests(), 0);

    let trust = "trust_tier_header = true\ntrust_version_header = true";
    let tiers = start_llmlb(&config(&paid, &open, trust, false)).await;
    let versions = start_llmlb(&config(&paid, &open, trust, true)).await;
    assert_eq!(
        served_by(tiers.addr, ("x-llmlb-tier", "paid")).await,
        "paid-1"
    );
    assert_eq!(
        served_by(versions.addr, ("x-llmlb-version", "v2")).await,
        "paid-1"
    );
}

#[tokio::test]
async fn the_model_list_needs_a_key_when_auth_is_on() {
    let [a, b] = Upstream::many(["a", "b"], Mode::Json).await;
    let lb = start_llmlb(&config(&a, &b, "auth = true", false)).await;
    let list = |key: Option<&str>| {
        let mut b = http::Request::get("/v1/models").header("host", "llmlb.test");
        if let Some(k) = key {
            b = b.header("authorization", format!("Bearer {k}"));
        }
        b.body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap()
    };
    let (status, _, body) = call(lb.addr, list(None)).await;
    assert_eq!(status, 401, "{}", String::from_utf8_lossy(&body));
    let (status, _, _) = call(lb.addr, list(Some(KEY))).await;
    assert_eq!(status, 200);
}

/// The shipped Kubernetes manifests pass the admin token from a Secret as
/// `LLMLB_ADMIN_TOKEN`; `llmlb serve` then guards its admin POSTs with it.
#[tokio::test]
async fn the_admin_token_can_come_from_the_environment() {
    let up = Upstream::start("a", Mode::Json).await;
    let pool = one_pool("least_connections", &[(&up.url(), 1)], "");
    let file = TempFile::config("admin-env", &serve_config("", &pool));
    let served = ServeProcess::start(&file.path, &[("LLMLB_ADMIN_TOKEN", "token-from-secret")]);
    let admin = served.admin_addr;
    // Draining a replica that does not exist: 401 without the token, 404
    // once authorized (no state changes either way).
    let drain = |token: Option<&str>| {
        let mut b = http::Request::post("/admin/replicas/none/drain").header("host", "admin");
        if let Some(t) = token {
            b = b.header("authorization", format!("Bearer {t}"));
        }
        b.body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap()
    };
    assert_eq!(call(admin, drain(None)).await.0, 401);
    assert_eq!(call(admin, drain(Some("token-from"))).await.0, 401);
    let (status, _, body) = call(admin, drain(Some("token-from-secret"))).await;
    assert_eq!(status, 404, "{}", String::from_utf8_lossy(&body));
}
