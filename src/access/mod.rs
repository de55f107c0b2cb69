//! Who a request acts for: principals, their capabilities, and the thread namespace each
//! one owns.
//!
//! Every authenticated request has a [`Principal`]:
//! - the master token: the operator. It owns the unnamed namespace (`""`), lists every
//!   principal's threads, cancels any run, and may act inside another principal's
//!   namespace by naming it (`?owner=`);
//! - a scoped token (a signed JWT, see [`jwt`]): its `sub` names the principal, its claims
//!   narrow the agents and capabilities;
//! - the master token with the trusted principal header (when configured): a proxy that did
//!   the sign-in acts for the principal it names, with every capability.
//!
//! Threads and runs live in their owner's namespace: the runtime and the store key them by
//! [`scoped_key`], so two principals may both use thread id `t1` without meeting, and a
//! principal can never address another's thread (it is simply not there: 404).

pub mod jwt;
mod token;

use std::fmt;
use std::sync::Arc;
pub use token::{BearerToken, TokenError};

/// Separates the owner from the id in a scoped key. Ids and principal names never hold
/// control characters (both are checked), so a key splits back unambiguously.
const KEY_SEPARATOR: char = '\u{1f}';

/// Longest principal name (`sub`), in bytes.
pub const MAX_PRINCIPAL_BYTES: usize = 256;

/// The key of `id` (a thread or run id) in `owner`'s namespace. The operator's namespace
/// keeps ids as they are, so data from before scoping keeps its keys.
pub fn scoped_key(owner: &str, id: &str) -> String {
    if owner.is_empty() {
        id.to_owned()
    } else {
        let mut key = String::with_capacity(owner.len() + 1 + id.len());
        key.push_str(owner);
        key.push(KEY_SEPARATOR);
        key.push_str(id);
        key
    }
}

/// A thread's key: its id in its owner's namespace. Only [`Principal::key`] makes one from
/// a request's id, and [`ThreadKey::stored`] takes one back from where the daemon kept it,
/// so the compiler keeps a client's thread id from being used as a key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ThreadKey(String);

impl ThreadKey {
    /// A key the daemon made and kept (a store row, a session map), taken back as it is.
    pub fn stored(key: impl Into<String>) -> ThreadKey {
        ThreadKey(key.into())
    }

    /// The key's text, as the store and the agents keep it.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `(owner, id)`: the namespace and the id the client gave.
    pub fn split(&self) -> (&str, &str) {
        split_key(&self.0)
    }
}

impl fmt::Display for ThreadKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// `(owner, id)` of a key made by [`scoped_key`].
pub fn split_key(key: &str) -> (&str, &str) {
    key.split_once(KEY_SEPARATOR).unwrap_or(("", key))
}

/// Checks a principal name: 1 to [`MAX_PRINCIPAL_BYTES`] bytes, no control characters,
/// not one of the labels the audit line gives requests that name no principal
/// (`operator`, `-`, or a name in parentheses), so no principal reads as the operator.
pub fn check_principal_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        Err("is empty")
    } else if name.eq_ignore_ascii_case("operator")
        || name == "-"
        || (name.starts_with('(') && name.ends_with(')'))
    {
        Err("is a label reserved for the operator and unauthenticated requests")
    } else if name.len() > MAX_PRINCIPAL_BYTES {
        Err("is longer than 256 bytes")
    } else if name.chars().any(char::is_control) {
        Err("holds a control character")
    } else if name.trim() != name {
        Err("starts or ends with white space")
    } else {
        Ok(())
    }
}

/// What a principal may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capability {
    /// Start runs (new input), cancel and stop runs, delete threads.
    Run,
    /// List and read threads, attach and reattach to runs.
    Read,
    /// Answer a run that waits on the client: approvals, frontend tool results, resumes.
    Approve,
}

impl Capability {
    pub const ALL: [Capability; 3] = [Capability::Run, Capability::Read, Capability::Approve];

    pub fn name(self) -> &'static str {
        match self {
            Capability::Run => "run",
            Capability::Read => "read",
            Capability::Approve => "approve",
        }
    }

    pub fn from_name(name: &str) -> Option<Capability> {
        Capability::ALL.into_iter().find(|c| c.name() == name)
    }

    fn bit(self) -> u8 {
        match self {
            Capability::Run => 1,
            Capability::Read => 2,
            Capability::Approve => 4,
        }
    }
}

/// A set of capabilities.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Caps(u8);

impl Caps {
    pub const ALL: Caps = Caps(7);
    pub const NONE: Caps = Caps(0);

    pub fn with(self, capability: Capability) -> Caps {
        Caps(self.0 | capability.bit())
    }

    pub fn has(self, capability: Capability) -> bool {
        self.0 & capability.bit() != 0
    }

    /// The named capabilities; names this version does not know are left out (a token
    /// minted for a newer daemon grants nothing unknown here).
    pub fn from_names<S: AsRef<str>>(names: &[S]) -> Caps {
        names
            .iter()
            .filter_map(|n| Capability::from_name(n.as_ref()))
            .fold(Caps::NONE, Caps::with)
    }

    /// A capability of `needed` this set lacks, if any.
    pub fn missing(self, needed: Caps) -> Option<Capability> {
        Capability::ALL
            .into_iter()
            .find(|c| needed.has(*c) && !self.has(*c))
    }

    pub fn names(self) -> Vec<&'static str> {
        Capability::ALL
            .into_iter()
            .filter(|c| self.has(*c))
            .map(Capability::name)
            .collect()
    }
}

impl fmt::Debug for Caps {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.names()).finish()
    }
}

/// How a request authenticated, for its audit line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// The master token.
    Master,
    /// A scoped token (a JWT).
    ScopedToken,
    /// The master token with the trusted principal header.
    TrustedHeader,
    /// Not at all (the health routes).
    Nothing,
}

impl Via {
    pub fn name(self) -> &'static str {
        match self {
            Via::Master => "master-token",
            Via::ScopedToken => "scoped-token",
            Via::TrustedHeader => "trusted-header",
            Via::Nothing => "none",
        }
    }
}

/// Who a request acts for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// How the request proved it.
    via: Via,
    /// The namespace the request's thread and run ids are resolved in.
    owner: String,
    /// Holds the master token.
    operator: bool,
    /// Lists and cancels by run id across every namespace (the operator naming no owner).
    everyone: bool,
    /// The agents it may use; `None`: all.
    agents: Option<Arc<[String]>>,
    caps: Caps,
    /// Its own daily budget (its token's `budget` claim), over the configured one.
    budget: Option<crate::budget::Limits>,
}

impl Principal {
    /// The master token: the operator's own namespace, every other one reachable.
    pub fn operator() -> Principal {
        Principal {
            via: Via::Master,
            owner: String::new(),
            operator: true,
            everyone: true,
            agents: None,
            caps: Caps::ALL,
            budget: None,
        }
    }

    /// The operator acting inside `owner`'s namespace (`?owner=`).
    pub fn operator_as(owner: &str) -> Principal {
        Principal {
            via: Via::Master,
            owner: owner.to_owned(),
            operator: true,
            everyone: false,
            agents: None,
            caps: Caps::ALL,
            budget: None,
        }
    }

    /// A principal named by a scoped token or the trusted principal header.
    pub fn scoped(name: &str, agents: Option<Vec<String>>, caps: Caps) -> Principal {
        Principal {
            via: Via::ScopedToken,
            owner: name.to_owned(),
            operator: false,
            everyone: false,
            agents: agents.map(Arc::from),
            caps,
            budget: None,
        }
    }

    /// With its own daily budget (a token's `budget` claim).
    pub fn with_budget(self, budget: Option<crate::budget::Limits>) -> Principal {
        Principal { budget, ..self }
    }

    /// Its own daily budget, if its token gives one.
    pub fn budget(&self) -> Option<&crate::budget::Limits> {
        self.budget.as_ref()
    }

    /// The same principal, authenticated `via` another way.
    pub fn via(self, via: Via) -> Principal {
        Principal { via, ..self }
    }

    /// How the request authenticated.
    pub fn authenticated(&self) -> Via {
        self.via
    }

    /// The namespace's name (`""` for the operator's own).
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// Holds the master token.
    pub fn is_operator(&self) -> bool {
        self.operator
    }

    /// Sees every namespace (thread listing, cancel by run id).
    pub fn sees_everyone(&self) -> bool {
        self.everyone
    }

    /// Whether the per-principal run cap applies (everyone but the operator).
    pub fn is_capped(&self) -> bool {
        !self.operator
    }

    pub fn can(&self, capability: Capability) -> bool {
        self.caps.has(capability)
    }

    pub fn caps(&self) -> Caps {
        self.caps
    }

    /// Whether it may use (and see the threads of) agent `name`.
    pub fn may_use(&self, name: &str) -> bool {
        self.agents
            .as_deref()
            .is_none_or(|agents| agents.iter().any(|a| a == name))
    }

    /// The agents it is limited to, if it is.
    pub fn agents(&self) -> Option<&[String]> {
        self.agents.as_deref()
    }

    /// The key of thread `id` in its namespace.
    pub fn key(&self, id: &str) -> ThreadKey {
        ThreadKey(scoped_key(&self.owner, id))
    }

    /// The key of run `id` in its namespace.
    pub fn run_key(&self, id: &str) -> String {
        scoped_key(&self.owner, id)
    }

    /// How it appears in logs: `operator`, or the principal's name (the audit line also
    /// says whether the master token was used, and in which namespace).
    pub fn label(&self) -> &str {
        if self.operator {
            "operator"
        } else {
            &self.owner
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_keep_the_operator_namespace_bare() {
        assert_eq!(scoped_key("", "t1"), "t1");
        assert_eq!(split_key("t1"), ("", "t1"));
        let key = scoped_key("alice", "t1");
        assert_ne!(key, "t1");
        assert_ne!(key, scoped_key("bob", "t1"));
        assert_eq!(split_key(&key), ("alice", "t1"));
        // The separator can be in neither part, so keys never collide.
        assert!(check_principal_name("a\u{1f}b").is_err());
        assert!(crate::protocol::input::check_id("b\u{1f}c", "threadId").is_err());
    }

    #[test]
    fn capabilities() {
        let caps = Caps::from_names(&["read", "approve", "fly"]);
        assert!(caps.has(Capability::Read) && caps.has(Capability::Approve));
        assert!(!caps.has(Capability::Run));
        assert_eq!(caps.names(), vec!["read", "approve"]);
        assert_eq!(format!("{:?}", Caps::ALL), r#"{"run", "read", "approve"}"#);
    }

    #[test]
    fn principals() {
        let alice = Principal::scoped("alice", Some(vec!["demo".into()]), Caps::ALL);
        assert!(alice.may_use("demo") && !alice.may_use("claude"));
        assert!(alice.is_capped() && !alice.sees_everyone());
        assert_eq!(alice.key("t").as_str(), scoped_key("alice", "t"));
        let op = Principal::operator();
        assert!(op.may_use("claude") && op.sees_everyone() && !op.is_capped());
        assert_eq!(op.key("t").as_str(), "t");
        assert_eq!(op.label(), "operator");
        assert_eq!(Principal::operator_as("alice").key("t"), alice.key("t"));
    }
}
