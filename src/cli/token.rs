//! The bearer token: `--token` > `--token-file` > `server.token_file` in the file >
//! `AGUI_TOKEN` > generated. An explicitly given but empty source is an error, never a
//! fall-through.

use std::path::Path;

use crate::config::{BearerToken, ConfigError, TokenSource};

use super::file::FileServer;
use super::flags::ServeArgs;

impl ServeArgs {
    /// The token and where it came from.
    pub(super) fn resolve_token(
        &self,
        server: &FileServer,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<(BearerToken, TokenSource), ConfigError> {
        if let Some(token) = &self.token {
            let token = BearerToken::new(token.clone())
                .map_err(|e| ConfigError::new(format!("--token: {e}")))?;
            return Ok((token, TokenSource::Flag));
        }
        if let Some(path) = self.token_file.as_ref().or(server.token_file.as_ref()) {
            return Ok((read_token_file(path)?, TokenSource::File));
        }
        if let Some(value) = env("AGUI_TOKEN") {
            let token = BearerToken::new(value.trim_end_matches(['\n', '\r']))
                .map_err(|e| ConfigError::new(format!("AGUI_TOKEN: {e}")))?;
            return Ok((token, TokenSource::Environment));
        }
        Ok((BearerToken::generate(), TokenSource::Generated))
    }
}

/// The token in a file, one trailing newline (`\n` or `\r\n`) trimmed.
fn read_token_file(path: &Path) -> Result<BearerToken, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::new(format!("cannot read token file {}: {e}", path.display())))?;
    let value = text.strip_suffix('\n').unwrap_or(&text);
    let value = value.strip_suffix('\r').unwrap_or(value);
    BearerToken::new(value)
        .map_err(|e| ConfigError::new(format!("token file {}: {e}", path.display())))
}
