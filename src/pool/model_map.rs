//! Model → pool: the pools' `models` lists, the top-level `[aliases]`
//! (another name for a served model; the body's `model` is rewritten so the
//! replica sees the name it serves), and `default_pool` for models no pool
//! lists (the body goes unchanged: the default pool's replicas decide).

use super::NameMap;
use crate::config::Config;
use crate::routing::RouteBranch;

#[derive(Debug, Default)]
pub struct ModelMap {
    by_model: NameMap<usize>,
    aliases: NameMap<String>,
    default_pool: Option<usize>,
}

/// Where a model name leads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved<'a> {
    pub pool: usize,
    /// The served name to write into the body (aliases only).
    pub rewrite: Option<&'a str>,
    pub branch: Option<RouteBranch>,
}

impl ModelMap {
    pub fn build(config: &Config) -> ModelMap {
        let mut by_model = NameMap::default();
        for (i, pc) in config.pools.iter().enumerate() {
            for m in &pc.models {
                by_model.insert(m.clone(), i);
            }
        }
        ModelMap {
            by_model,
            aliases: config
                .aliases
                .iter()
                .map(|(a, t)| (a.clone(), t.clone()))
                .collect(),
            default_pool: config
                .default_pool
                .as_ref()
                .and_then(|d| config.pools.iter().position(|p| &p.name == d)),
        }
    }

    /// The pool index of a served model name, without aliases or default.
    pub fn served(&self, model: &str) -> Option<usize> {
        self.by_model.get(model).copied()
    }

    /// Aliases and the pool each leads to, in name order.
    pub fn aliases(&self) -> impl Iterator<Item = (&str, usize)> {
        let mut list: Vec<(&str, usize)> = self
            .aliases
            .iter()
            .filter_map(|(a, t)| self.by_model.get(t).map(|p| (a.as_str(), *p)))
            .collect();
        list.sort();
        list.into_iter()
    }

    pub fn resolve(&self, model: &str) -> Option<Resolved<'_>> {
        if let Some(&pool) = self.by_model.get(model) {
            return Some(Resolved {
                pool,
                rewrite: None,
                branch: None,
            });
        }
        if let Some((target, &pool)) = self
            .aliases
            .get(model)
            .and_then(|t| self.by_model.get(t).map(|p| (t, p)))
        {
            return Some(Resolved {
                pool,
                rewrite: Some(target),
                branch: Some(RouteBranch::Alias),
            });
        }
        self.default_pool.map(|pool| Resolved {
            pool,
            rewrite: None,
            branch: Some(RouteBranch::DefaultPool),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(extra: &str) -> ModelMap {
        let text = format!(
            "{extra}\n[[pools]]\nname = \"a\"\nmodels = [\"llama\"]\n[[pools.replicas]]\nurl = \"http://127.0.0.1:1\"\n\
             [[pools]]\nname = \"b\"\nmodels = [\"qwen\"]\n[[pools.replicas]]\nurl = \"http://127.0.0.1:2\"\n"
        );
        ModelMap::build(&crate::config::parse(&text).unwrap())
    }

    #[test]
    fn direct_alias_default() {
        let m = map("default_pool = \"b\"\n[aliases]\ngpt-4o = \"llama\"\n");
        assert_eq!(m.resolve("qwen").unwrap().pool, 1);
        let r = m.resolve("gpt-4o").unwrap();
        assert_eq!(
            (r.pool, r.rewrite, r.branch),
            (0, Some("llama"), Some(RouteBranch::Alias))
        );
        let r = m.resolve("mystery").unwrap();
        assert_eq!((r.pool, r.branch), (1, Some(RouteBranch::DefaultPool)));
        assert!(map("").resolve("mystery").is_none());
    }
}
