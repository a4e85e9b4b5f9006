//! An OTLP/HTTP collector stand-in on a loopback socket: keeps every span
//! llmlb exports, for tests to read.

use super::*;
use serde_json::Value;

/// A collector stand-in: keeps every span posted to `/v1/traces`.
#[derive(Clone, Default)]
pub struct Collector {
    pub spans: Arc<Mutex<Vec<Value>>>,
    pub paths: Arc<Mutex<Vec<String>>>,
}

impl Collector {
    pub async fn start() -> (Collector, SocketAddr) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let collector = Collector::default();
        let c = collector.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let c = c.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let c = c.clone();
                        async move {
                            c.paths.lock().unwrap().push(req.uri().path().to_string());
                            let body = req.into_body().collect().await.unwrap().to_bytes();
                            let doc: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                            c.keep(&doc);
                            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"{}"))))
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        (collector, addr)
    }

    fn keep(&self, doc: &Value) {
        let mut spans = self.spans.lock().unwrap();
        for rs in doc["resourceSpans"].as_array().into_iter().flatten() {
            for ss in rs["scopeSpans"].as_array().into_iter().flatten() {
                for span in ss["spans"].as_array().into_iter().flatten() {
                    let mut span = span.clone();
                    span["service"] = service_name(&rs["resource"]);
                    spans.push(span);
                }
            }
        }
    }

    /// Waits (bounded) until spans with all of `names` have arrived.
    pub async fn wait_for(&self, names: &[&str]) -> Vec<Value> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let spans = self.spans.lock().unwrap().clone();
            if names.iter().all(|n| spans.iter().any(|s| s["name"] == *n)) {
                return spans;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "spans {names:?} not exported within 10 s; got {:?}",
                spans.iter().map(|s| s["name"].clone()).collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn service_name(resource: &Value) -> Value {
    resource["attributes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|a| a["key"] == "service.name")
        .map(|a| a["value"]["stringValue"].clone())
        .unwrap_or(Value::Null)
}

/// An attribute's value as text (OTLP/JSON writes 64-bit integers as strings).
pub fn attr(span: &Value, key: &str) -> Option<String> {
    let a = span["attributes"]
        .as_array()?
        .iter()
        .find(|a| a["key"] == key)?;
    let v = &a["value"];
    ["stringValue", "intValue", "doubleValue", "boolValue"]
        .iter()
        .find_map(|k| match &v[*k] {
            Value::Null => None,
            Value::String(s) => Some(s.clone()),
            other => Some(other.to_string()),
        })
}
