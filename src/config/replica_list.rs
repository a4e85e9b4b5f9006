//! `replicas` as a list of URLs or of tables.
//!
//! `replicas = ["http://10.0.0.11:8000", "http://10.0.0.12:8000"]` is the
//! short form for replicas that need nothing but their address (as NGINX's
//! one `server` line per upstream); `[[pools.replicas]]` tables carry a
//! weight, a name, a version or KV-event endpoints. Both forms can be mixed
//! in one list (`[{ url = "...", weight = 2 }, "http://..."]`). A table keeps
//! its strict reading: an unknown key is an error with its dotted path.

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use std::fmt;

use super::schema::ReplicaConfig;

/// Reads a `replicas` list whose elements are URL strings or tables.
pub(super) fn replicas<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<ReplicaConfig>, D::Error> {
    let entries: Vec<Entry> = Vec::deserialize(d)?;
    Ok(entries.into_iter().map(|e| e.0).collect())
}

struct Entry(ReplicaConfig);

impl<'de> Deserialize<'de> for Entry {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(EntryVisitor)
    }
}

struct EntryVisitor;

impl<'de> Visitor<'de> for EntryVisitor {
    type Value = Entry;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a replica URL string or a table with `url`")
    }

    fn visit_str<E: de::Error>(self, url: &str) -> Result<Entry, E> {
        Ok(Entry(ReplicaConfig::at(url)))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Entry, A::Error> {
        ReplicaConfig::deserialize(de::value::MapAccessDeserializer::new(map)).map(Entry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct Pool {
        #[serde(deserialize_with = "replicas")]
        replicas: Vec<ReplicaConfig>,
    }

    fn read(text: &str) -> Result<Pool, String> {
        let de = toml::Deserializer::parse(text).map_err(|e| e.to_string())?;
        serde_path_to_error::deserialize(de).map_err(|e| format!("{}: {}", e.path(), e.inner()))
    }

    #[test]
    fn urls_tables_and_both_mixed_read_alike() {
        let short = read(r#"replicas = ["http://a:1", "http://b:2"]"#).unwrap();
        let long = read("[[replicas]]\nurl = \"http://a:1\"\n[[replicas]]\nurl = \"http://b:2\"\n")
            .unwrap();
        for pool in [&short, &long] {
            let urls: Vec<&str> = pool.replicas.iter().map(|r| r.url.as_str()).collect();
            assert_eq!(urls, ["http://a:1", "http://b:2"]);
            assert!(
                pool.replicas
                    .iter()
                    .all(|r| r.weight == 1 && r.name.is_none())
            );
        }
        let mixed =
            read(r#"replicas = [{ url = "http://a:1", weight = 3 }, "http://b:2"]"#).unwrap();
        assert_eq!(mixed.replicas[0].weight, 3);
        assert_eq!(mixed.replicas[1].url, "http://b:2");
        assert_eq!(mixed.replicas[1].weight, 1);
    }

    #[test]
    fn a_table_stays_strict_and_a_number_is_refused_with_its_index() {
        let err = read(r#"replicas = ["http://a:1", { url = "http://b:2", wieght = 2 }]"#)
            .err()
            .unwrap();
        assert!(err.starts_with("replicas[1]"), "{err}");
        assert!(err.contains("wieght"), "{err}");
        let err = read("replicas = [\"http://a:1\", 8000]").err().unwrap();
        assert!(err.starts_with("replicas[1]"), "{err}");
        assert!(err.contains("replica URL string or a table"), "{err}");
    }

    #[test]
    fn a_whole_config_names_the_pool_and_the_entry() {
        let text = "[[pools]]\nname = \"p\"\nmodels = [\"m\"]\n\
                    replicas = [\"http://127.0.0.1:1\", { url = \"http://127.0.0.1:2\", weigth = 2 }]\n";
        let issues = crate::config::parse(text).err().unwrap();
        assert!(
            issues
                .iter()
                .any(|i| i.key == "pools[0].replicas[1].weigth"),
            "{issues:?}"
        );
        let ok = "[[pools]]\nname = \"p\"\nmodels = [\"m\"]\n\
                  replicas = [\"http://127.0.0.1:1\", \"http://127.0.0.1:2\"]\n";
        let config = crate::config::parse(ok).unwrap();
        assert_eq!(config.pools[0].replicas.len(), 2);
    }
}
