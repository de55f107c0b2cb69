//! `[[webhooks]]`: the endpoints events are POSTed to, each secret read now (so a missing
//! or empty secret file is a startup error), each event name checked.

use std::collections::HashSet;

use crate::config::{ConfigError, parse_duration};
use crate::webhooks::{
    DEFAULT_MAX_BACKOFF, DEFAULT_TIMEOUT, EndpointConfig, Events, Secret, default_name, parse_url,
    valid_name,
};

use super::file::FileWebhook;

/// The `[[webhooks]]` entries as endpoints; an error names the entry and its key.
pub(super) fn resolve_webhooks(file: &[FileWebhook]) -> Result<Vec<EndpointConfig>, ConfigError> {
    let mut names = HashSet::new();
    let mut endpoints = Vec::with_capacity(file.len());
    for (i, hook) in file.iter().enumerate() {
        let fail = |key: &str, why: String| ConfigError::new(format!("webhooks[{i}].{key}: {why}"));
        let url = parse_url(&hook.url).map_err(|why| fail("url", why))?;
        let name = hook
            .name
            .clone()
            .unwrap_or_else(|| default_name(hook.url.trim()));
        if !valid_name(&name) {
            return Err(fail(
                "name",
                format!("{name:?} must be 1 to 64 of A-Z a-z 0-9 . _ -"),
            ));
        }
        if !names.insert(name.clone()) {
            return Err(fail("name", format!("{name:?} names another endpoint too")));
        }
        let secret = Secret::read(&hook.secret_file).map_err(|why| fail("secret_file", why))?;
        let events = match &hook.events {
            Some(names) => Events::parse(names).map_err(|why| fail("events", why))?,
            None => Events::all(),
        };
        let duration = |key: &str, text: &Option<String>, default| match text {
            Some(text) => parse_duration(text).map_err(|e| fail(key, e.to_string())),
            None => Ok(default),
        };
        let timeout = duration("timeout", &hook.timeout, DEFAULT_TIMEOUT)?;
        let max_backoff = duration("max_backoff", &hook.max_backoff, DEFAULT_MAX_BACKOFF)?;
        if timeout.is_zero() {
            return Err(fail("timeout", "must be greater than zero".to_owned()));
        }
        if max_backoff.is_zero() {
            return Err(fail("max_backoff", "must be greater than zero".to_owned()));
        }
        endpoints.push(EndpointConfig {
            name,
            url,
            secret,
            secret_file: hook.secret_file.clone(),
            events,
            timeout,
            max_backoff,
        });
    }
    Ok(endpoints)
}
