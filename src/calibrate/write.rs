//! The profile file `llmlb calibrate` writes: a comment header (where, when,
//! against what, and the fitted-against-measured table), then the complete
//! profile as TOML, `[fitted]` included, so the file stands alone.

use super::Calibration;
use super::fit::Row;

/// The fitted-against-measured table, one probe group a line (milliseconds).
pub fn table(rows: &[Row]) -> String {
    let mut s = String::from(
        "probe                  batch  prompt  what          measured ms  fitted ms  error\n",
    );
    for r in rows {
        let err = if r.measured > 0.0 {
            format!("{:+.0} %", 100.0 * (r.fitted - r.measured) / r.measured)
        } else {
            "-".into()
        };
        s.push_str(&format!(
            "{:<22} {:>5}  {:>6}  {:<12}  {:>11.3}  {:>9.3}  {:>5}\n",
            r.kind.label(),
            r.concurrency,
            r.prompt_len,
            match r.what {
                "ttft" => "first token",
                "itl" => "token gap",
                _ => "per request",
            },
            1000.0 * r.measured,
            1000.0 * r.fitted,
            err
        ));
    }
    s
}

pub fn profile_text(cal: &Calibration) -> String {
    let f = &cal.fitted;
    let mut s = format!(
        "# Replica-sim engine profile fitted by `llmlb calibrate` on {date}\n\
         # against {url} (model {model}, {engine} {version}),\n\
         # from host {host}{cpu}: {requests} probe requests in {seconds:.0} s.\n\
         # Use it with `llmlb fleet-sim --profile FILE` or `llmlb replica-sim --profile FILE`;\n\
         # `llmlb doctor --profile FILE` says when it no longer matches the replicas.\n\
         #\n\
         # Fitted against measured (the [cost] model's prediction for each probe group):\n",
        date = f.date,
        url = f.url,
        model = f.model,
        engine = f.engine,
        version = f.engine_version.as_deref().unwrap_or("(version unknown)"),
        host = f.host,
        cpu = f
            .cpu
            .as_deref()
            .map(|c| format!(" ({c})"))
            .unwrap_or_default(),
        requests = f.requests,
        seconds = f.seconds,
    );
    for line in table(&cal.fit.rows).lines() {
        s.push_str("#   ");
        s.push_str(line);
        s.push('\n');
    }
    if cal.foreign_requests > 0.0 {
        s.push_str(&format!(
            "# Warning: the replica finished {} requests the probes did not send.\n",
            cal.foreign_requests
        ));
    }
    s.push('\n');
    s.push_str(&toml::to_string(&cal.profile).expect("a profile serializes to TOML"));
    s
}
