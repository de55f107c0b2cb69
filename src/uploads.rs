//! Files a principal uploads for its messages (`POST {path}/uploads`).
//!
//! An upload is stored in the data directory, in a directory of its principal's own
//! (`uploads/<hash of the principal>/<id>`, its description beside it in `<id>.json`),
//! capped in size per file and per principal, and of a type the configuration allows
//! whose first bytes agree with it where the type has a signature. The answer's URL goes
//! into a message's content part; when the agent's prompt is built, such a part gets the
//! upload's bytes as its data (the daemon reads its own file; it never fetches a URL for
//! the agent). The first run that uses an upload binds it to its thread: it is removed
//! with that thread. An upload no run has used is removed once its TTL is over.
//!
//! A cluster's nodes each keep their own uploads: a run is resolved by the node that runs
//! it, so an upload is used on a thread its node owns (the daemon forwards runs to the
//! owner; it does not forward uploads).

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::BodyExt as _;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt as _;

mod parts;
pub use parts::Resolved;
use parts::{media_kind, part_url, part_url_mut, plain, user_parts_mut};
mod preview;

pub use preview::PreviewError;

use crate::clock::now_ms;
use crate::protocol::InputError;
use crate::protocol::input::{Content, Message};

/// What uploads may be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadLimits {
    /// Largest file.
    pub max_bytes: u64,
    /// Bytes one principal may keep in all.
    pub quota: u64,
    /// Content types allowed: `type/subtype`, or `type/*` for every subtype.
    pub types: Vec<String>,
    /// How long an upload no run has used is kept.
    pub unused_ttl: Duration,
    /// How long a link that shows an upload without a token lasts (see [`preview`]).
    pub preview_ttl: Duration,
}

impl Default for UploadLimits {
    fn default() -> UploadLimits {
        UploadLimits {
            // CopilotKit's attachments go up to 20 MB.
            max_bytes: 20 * 1024 * 1024,
            quota: 512 * 1024 * 1024,
            types: DEFAULT_TYPES.iter().map(|t| (*t).to_owned()).collect(),
            unused_ttl: Duration::from_secs(24 * 60 * 60),
            preview_ttl: Duration::from_secs(15 * 60),
        }
    }
}

/// The types allowed when the configuration names none: images, audio, video, PDF and
/// plain text formats (no HTML, no scripts, no archives).
pub const DEFAULT_TYPES: &[&str] = &[
    "image/png",
    "image/jpeg",
    "image/gif",
    "image/webp",
    "audio/*",
    "video/*",
    "application/pdf",
    "text/plain",
    "text/markdown",
    "text/csv",
    "application/json",
];

/// First bytes a file of these types starts with; a file declared as one of them that does
/// not is refused.
const SIGNATURES: &[(&str, &[&[u8]])] = &[
    ("image/png", &[b"\x89PNG\r\n\x1a\n"]),
    ("image/jpeg", &[b"\xff\xd8\xff"]),
    ("image/gif", &[b"GIF87a", b"GIF89a"]),
    ("application/pdf", &[b"%PDF-"]),
];

/// Whether a wildcard (`video/*`) admits `subtype`: a plain token, and nothing a browser
/// would run or render as a document (`video/html`, `image/svg+xml`, `audio/javascript`).
fn wildcard_admits(subtype: &str) -> bool {
    let token = !subtype.is_empty()
        && subtype
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"+-.".contains(&b));
    let active = ["html", "xml", "script", "xsl"]
        .iter()
        .any(|word| subtype.contains(word));
    token && !active
}

/// One upload, as stored beside its file and as answered (`id`, `size`, `contentType`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Upload {
    pub id: String,
    pub content_type: String,
    pub size: u64,
    /// Milliseconds since the Unix epoch.
    pub created_at: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filename: Option<String>,
    /// The key of the thread it is bound to, once a run used it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread: Option<String>,
}

/// Why an upload was refused.
#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    #[error("the file is larger than {0} bytes")]
    TooLarge(u64),
    #[error("the principal's uploads would exceed their quota of {0} bytes")]
    OverQuota(u64),
    #[error("content type {0:?} is not accepted here")]
    Type(String),
    #[error("the file's bytes are not {0}")]
    Mismatch(String),
    #[error("the upload body could not be read")]
    Body,
    #[error("the file is empty")]
    Empty,
    #[error("the upload could not be stored: {0}")]
    Io(#[from] io::Error),
}

/// Every principal's uploads.
#[derive(Debug)]
pub struct Uploads {
    root: PathBuf,
    /// The route namespace (`/agui`): an upload's URL path is `{namespace}/uploads/{id}`.
    namespace: String,
    limits: UploadLimits,
    /// Bytes set aside per principal for its uploads under way.
    reserved: std::sync::Mutex<HashMap<String, u64>>,
    /// Per principal directory: the bytes its uploads hold, counted from a listing (taken
    /// with a sweep at most every [`RECOUNT`]) and kept by each put and delete since, so a
    /// put costs the same however many uploads there are.
    ledgers: std::sync::Mutex<HashMap<PathBuf, Ledger>>,
    /// Directory listings made to count (for tests: a put does not list).
    listings: std::sync::atomic::AtomicU64,
    /// Signs the links that show an upload without a token.
    preview_key: preview::PreviewKey,
}

/// How often a principal's directory is swept and counted again, at most.
const RECOUNT: std::time::Duration = std::time::Duration::from_secs(60);

/// A principal directory's bytes in use, and when they were last counted.
#[derive(Debug, Clone, Copy)]
struct Ledger {
    used: u64,
    counted: std::time::Instant,
}

/// Bytes set aside for an upload under way (see [`Uploads::reserve`]).
struct Reservation<'u> {
    uploads: &'u Uploads,
    owner: String,
    bytes: u64,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        let mut reserved = crate::sync::lock(&self.uploads.reserved);
        if let Some(pending) = reserved.get_mut(&self.owner) {
            *pending = pending.saturating_sub(self.bytes);
            if *pending == 0 {
                reserved.remove(&self.owner);
            }
        }
    }
}

/// A file being written: removed when dropped, unless it was moved into place.
struct Partial(PathBuf);

impl Drop for Partial {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

impl Uploads {
    /// Uploads kept under `root`, addressed under `namespace`.
    pub fn new(root: PathBuf, namespace: &str, limits: UploadLimits) -> Uploads {
        Uploads {
            root,
            namespace: namespace.trim_end_matches('/').to_owned(),
            limits,
            reserved: std::sync::Mutex::default(),
            ledgers: std::sync::Mutex::default(),
            listings: std::sync::atomic::AtomicU64::new(0),
            preview_key: preview::PreviewKey::random(),
        }
    }

    /// How many times a principal's directory was listed to count its uploads.
    pub fn listings(&self) -> u64 {
        self.listings.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The bytes the uploads in `dir` hold: from its ledger, or (none yet, or older than
    /// [`RECOUNT`]) swept and counted again.
    async fn used_in(&self, dir: &Path) -> u64 {
        let known = crate::sync::lock(&self.ledgers).get(dir).copied();
        if let Some(ledger) = known.filter(|l| l.counted.elapsed() < RECOUNT) {
            return ledger.used;
        }
        self.sweep_dir(dir).await;
        self.listings
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let used = stored(dir).await.iter().map(|u| u.size).sum::<u64>();
        crate::sync::lock(&self.ledgers).insert(
            dir.to_owned(),
            Ledger {
                used,
                counted: std::time::Instant::now(),
            },
        );
        used
    }

    /// `bytes` more (or fewer) in `dir`'s ledger, if it has one.
    fn account(&self, dir: &Path, added: u64, removed: u64) {
        if let Some(ledger) = crate::sync::lock(&self.ledgers).get_mut(dir) {
            ledger.used = (ledger.used + added).saturating_sub(removed);
        }
    }

    pub fn limits(&self) -> &UploadLimits {
        &self.limits
    }

    /// The path of upload `id`'s URL.
    pub fn url_path(&self, id: &str) -> String {
        format!("{}/uploads/{id}", self.namespace)
    }

    /// The query of a link showing upload `id` of `owner` with no token, and when it
    /// expires (seconds since the epoch). The expiry is rounded up to the minute, so the
    /// links signed within one minute are the same link (a page re-rendering a snapshot
    /// does not load the image again).
    pub fn preview(&self, owner: &str, id: &str) -> (String, u64) {
        let ttl = self.limits.preview_ttl.as_secs().max(1);
        let expires = (now_ms() / 1000 + ttl).div_ceil(60) * 60;
        let dir = crate::hex::short_hash(owner.as_bytes());
        (self.preview_key.query(&dir, id, expires), expires)
    }

    /// The upload a link's `query` shows, and the path of its bytes: the link checked
    /// (whole, signed by this daemon, not expired) and the upload still there.
    pub async fn previewed(
        &self,
        id: &str,
        query: &str,
    ) -> Result<Option<(Upload, PathBuf)>, PreviewError> {
        if !valid_id(id) {
            return Ok(None);
        }
        let dir = self.preview_key.check(id, query, now_ms() / 1000)?;
        let dir = self.root.join(dir);
        Ok(read_description(&dir.join(format!("{id}.json")))
            .await
            .map(|upload| (upload, dir.join(id))))
    }

    /// Every upload URL in `messages` (a transcript's JSON, or one message's list) made a
    /// link of `owner`'s that shows it with no token.
    pub fn show(&self, owner: &str, messages: &mut serde_json::Value) {
        let mut signed: HashMap<String, String> = HashMap::new();
        for message in messages.as_array_mut().into_iter().flatten() {
            let Some(parts) = message.get_mut("content").and_then(|c| c.as_array_mut()) else {
                continue;
            };
            for part in parts {
                let url = match part.get("source") {
                    Some(source) if source.get("type").and_then(|t| t.as_str()) == Some("url") => {
                        part.get_mut("source").and_then(|s| s.get_mut("value"))
                    }
                    _ => part.get_mut("url"),
                };
                let Some(serde_json::Value::String(url)) = url else {
                    continue;
                };
                let Some(id) = self.id_in(url) else { continue };
                let query = signed
                    .entry(id.clone())
                    .or_insert_with(|| self.preview(owner, &id).0);
                *url = format!("{}?{query}", plain(url));
            }
        }
    }

    /// Every upload URL in `messages` as the transcript keeps it: without its query or
    /// fragment, so neither a link's signature nor a token pasted into a URL is stored.
    pub fn keep_plain(&self, messages: &mut [Message]) {
        for part in user_parts_mut(messages) {
            if let Some(url) = part_url_mut(part)
                && self.id_in(url).is_some()
            {
                let kept = plain(url).to_owned();
                *url = kept;
            }
        }
    }

    fn dir(&self, owner: &str) -> PathBuf {
        self.root.join(crate::hex::short_hash(owner.as_bytes()))
    }

    /// Stores `body` (declared `content_type`, at most `declared` bytes when the client
    /// said) as a new upload of `owner`. What was stored is removed again when it fails.
    pub async fn put<B>(
        &self,
        owner: &str,
        content_type: &str,
        filename: Option<String>,
        declared: Option<u64>,
        body: B,
    ) -> Result<Upload, UploadError>
    where
        B: http_body::Body<Data = Bytes>,
    {
        let content_type = self.accepted_type(content_type)?;
        let limit = self.limits.max_bytes;
        if declared.is_some_and(|len| len > limit) {
            return Err(UploadError::TooLarge(limit));
        }
        let dir = self.dir(owner);
        tokio::fs::create_dir_all(&dir).await?;
        let used = self.used_in(&dir).await;
        // What uploads of this principal under way may still write counts too, so
        // uploads at once cannot pass the quota together.
        let _reserved = self
            .reserve(owner, used, declared.unwrap_or(limit))
            .ok_or(UploadError::OverQuota(self.limits.quota))?;
        let id = uuid::Uuid::new_v4().simple().to_string();
        // Removed however this ends (an error, a timeout, the client gone) unless placed.
        let partial = Partial(dir.join(format!("{id}.part")));
        let size = write_body(&partial.0, body, limit, &content_type).await?;
        if size == 0 {
            return Err(UploadError::Empty);
        }
        if used + size > self.limits.quota {
            return Err(UploadError::OverQuota(self.limits.quota));
        }
        let upload = Upload {
            id: id.clone(),
            content_type,
            size,
            created_at: now_ms(),
            filename: filename.filter(|name| !name.is_empty() && name.len() <= 255),
            thread: None,
        };
        let placed = async {
            tokio::fs::rename(&partial.0, dir.join(&id)).await?;
            write_description(&dir, &upload).await
        };
        if let Err(error) = placed.await {
            let _ = tokio::fs::remove_file(dir.join(&id)).await;
            return Err(error.into());
        }
        self.account(&dir, size, 0);
        Ok(upload)
    }

    /// Sets `bytes` aside for an upload of `owner` under way, if its quota (of which
    /// `used` is kept) has room for them besides what its other uploads under way may
    /// write; given back when the guard drops.
    fn reserve(&self, owner: &str, used: u64, bytes: u64) -> Option<Reservation<'_>> {
        let mut reserved = crate::sync::lock(&self.reserved);
        let pending = reserved.get(owner).copied().unwrap_or(0);
        if used + pending + bytes > self.limits.quota {
            return None;
        }
        *reserved.entry(owner.to_owned()).or_default() += bytes;
        Some(Reservation {
            uploads: self,
            owner: owner.to_owned(),
            bytes,
        })
    }

    /// The content type `declared` stands for, when it is allowed (lower case, parameters
    /// dropped).
    fn accepted_type(&self, declared: &str) -> Result<String, UploadError> {
        let essence = declared
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        let allowed = !essence.is_empty()
            && essence.split('/').count() == 2
            && self
                .limits
                .types
                .iter()
                .any(|pattern| match pattern.strip_suffix("/*") {
                    Some(major) => essence
                        .strip_prefix(major)
                        .and_then(|rest| rest.strip_prefix('/'))
                        .is_some_and(wildcard_admits),
                    None => *pattern == essence,
                });
        if allowed {
            Ok(essence)
        } else {
            Err(UploadError::Type(declared.to_owned()))
        }
    }

    /// Upload `id` of `owner`, if there is one.
    pub async fn get(&self, owner: &str, id: &str) -> Option<Upload> {
        if !valid_id(id) {
            return None;
        }
        read_description(&self.dir(owner).join(format!("{id}.json"))).await
    }

    /// The path of upload `id`'s bytes (of an upload [`Uploads::get`] found).
    pub fn file(&self, owner: &str, id: &str) -> PathBuf {
        self.dir(owner).join(id)
    }

    /// Removes upload `id` of `owner`; `false` when there was none.
    pub async fn delete(&self, owner: &str, id: &str) -> bool {
        let Some(upload) = self.get(owner, id).await else {
            return false;
        };
        let dir = self.dir(owner);
        remove(&dir, id).await;
        self.account(&dir, 0, upload.size);
        true
    }

    /// Removes every upload of `owner` bound to thread `thread` (its key).
    pub async fn remove_thread(&self, owner: &str, thread: &str) {
        let dir = self.dir(owner);
        for upload in stored(&dir).await {
            if upload.thread.as_deref() == Some(thread) {
                remove(&dir, &upload.id).await;
                self.account(&dir, 0, upload.size);
            }
        }
    }

    /// Removes, in every principal's directory, what no run used within the TTL (and
    /// files left half-written by a crash).
    pub async fn sweep(&self) {
        let Ok(mut dirs) = tokio::fs::read_dir(&self.root).await else {
            return;
        };
        while let Ok(Some(entry)) = dirs.next_entry().await {
            self.sweep_dir(&entry.path()).await;
        }
    }

    async fn sweep_dir(&self, dir: &Path) {
        let ttl = self.limits.unused_ttl.as_millis() as u64;
        let now = now_ms();
        for upload in stored(dir).await {
            if upload.thread.is_none() && now.saturating_sub(upload.created_at) > ttl {
                remove(dir, &upload.id).await;
                self.account(dir, 0, upload.size);
            }
        }
        let Ok(mut entries) = tokio::fs::read_dir(dir).await else {
            return;
        };
        while let Ok(Some(entry)) = entries.next_entry().await {
            let path = entry.path();
            let stale = path.extension().is_some_and(|x| x == "part")
                && entry
                    .metadata()
                    .await
                    .ok()
                    .and_then(|m| m.modified().ok())
                    .and_then(|m| m.elapsed().ok())
                    .is_some_and(|age| age > self.limits.unused_ttl);
            if stale {
                let _ = tokio::fs::remove_file(&path).await;
            }
        }
    }

    /// The upload id a content part's URL names: `{namespace}/uploads/{id}`, absolute
    /// (any host: the daemon's own name for itself depends on how it is reached) or a
    /// path alone.
    pub fn id_in(&self, url: &str) -> Option<String> {
        let path = match url.split_once("://") {
            Some((scheme, rest)) if scheme == "http" || scheme == "https" => {
                // The authority ends at the first of these: a URL with none of its own path
                // names no upload, whatever its query holds.
                let end = rest.find(['/', '?', '#'])?;
                rest[end..].strip_prefix('/').map(|_| &rest[end..])?
            }
            Some(_) => return None,
            None => url,
        };
        let path = path.split(['?', '#']).next().unwrap_or(path);
        let id = path
            .strip_prefix(&self.namespace)?
            .strip_prefix("/uploads/")?;
        valid_id(id).then(|| id.to_owned())
    }

    /// The uploads of `owner` that `messages` name (each with its place in the request's
    /// messages), each with its bytes in base64; an upload that is not there (or not
    /// `owner`'s), or whose type the part cannot carry, is an input error naming the part,
    /// as is a run whose parts name more than [`Uploads::run_limit`] bytes in all (every
    /// part counted, however many name the same upload).
    pub async fn resolve<'m>(
        &self,
        owner: &str,
        messages: impl IntoIterator<Item = (usize, &'m Message)>,
    ) -> Result<Resolved, InputError> {
        let mut found = HashMap::new();
        // Each upload read once, however many URLs name it.
        let mut read: HashMap<String, (Upload, std::sync::Arc<String>)> = HashMap::new();
        let mut named = 0u64;
        for (m, message) in messages {
            let Message::User(user) = message else {
                continue;
            };
            let Content::Parts(parts) = &user.content else {
                continue;
            };
            for (p, part) in parts.iter().enumerate() {
                let Some(url) = part_url(part) else { continue };
                let Some(id) = self.id_in(url) else { continue };
                let field = format!("messages[{m}].content[{p}]");
                let refuse = |message: String| InputError {
                    field: Some(field.clone()),
                    message,
                };
                if !read.contains_key(&id) {
                    let Some(upload) = self.get(owner, &id).await else {
                        return Err(refuse(format!("upload {id} does not exist")));
                    };
                    if named + upload.size > self.run_limit() {
                        return Err(refuse(self.over_run_limit()));
                    }
                    let bytes = tokio::fs::read(self.file(owner, &id))
                        .await
                        .map_err(|_| refuse(format!("upload {id} does not exist")))?;
                    let data = base64::engine::general_purpose::STANDARD.encode(bytes);
                    read.insert(id.clone(), (upload, std::sync::Arc::new(data)));
                }
                let (upload, data) = &read[&id];
                if let Some(kind) = media_kind(part)
                    && !upload.content_type.starts_with(&format!("{kind}/"))
                {
                    return Err(refuse(format!(
                        "upload {id} is {}, not {kind}",
                        upload.content_type
                    )));
                }
                named += upload.size;
                if named > self.run_limit() {
                    return Err(refuse(self.over_run_limit()));
                }
                found.insert(url.to_owned(), (upload.clone(), data.clone()));
            }
        }
        Ok(Resolved { found })
    }

    /// The most bytes of uploads the parts of one run may name: twice the largest file.
    pub fn run_limit(&self) -> u64 {
        self.limits.max_bytes.saturating_mul(2)
    }

    fn over_run_limit(&self) -> String {
        format!(
            "the uploads this run's messages name come to more than {} bytes, the most one \
             run may carry",
            self.run_limit()
        )
    }

    /// Binds every upload of `resolved` that is bound to nothing yet to thread `thread`.
    pub async fn bind(&self, owner: &str, resolved: &Resolved, thread: &str) {
        let dir = self.dir(owner);
        for (upload, _) in resolved.found.values() {
            if upload.thread.is_none() {
                let bound = Upload {
                    thread: Some(thread.to_owned()),
                    ..upload.clone()
                };
                if let Err(error) = write_description(&dir, &bound).await {
                    tracing::warn!(upload = %upload.id, %error, "an upload could not be bound to its thread");
                }
            }
        }
    }
}

/// An id this module could have made: 32 lowercase hex digits.
fn valid_id(id: &str) -> bool {
    id.len() == 32
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Writes `body` to `path`, at most `limit` bytes, checking its first bytes against
/// `content_type`'s signature; the number of bytes written.
async fn write_body<B>(
    path: &Path,
    body: B,
    limit: u64,
    content_type: &str,
) -> Result<u64, UploadError>
where
    B: http_body::Body<Data = Bytes>,
{
    let mut file = tokio::fs::File::create(path).await?;
    let mut body = std::pin::pin!(body);
    let mut size = 0u64;
    let mut head = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|_| UploadError::Body)?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        size += data.len() as u64;
        if size > limit {
            return Err(UploadError::TooLarge(limit));
        }
        if head.len() < 16 {
            head.extend_from_slice(&data[..data.len().min(16 - head.len())]);
        }
        file.write_all(&data).await?;
    }
    if let Some((_, signatures)) = SIGNATURES.iter().find(|(t, _)| *t == content_type)
        && !signatures.iter().any(|s| head.starts_with(s))
    {
        return Err(UploadError::Mismatch(content_type.to_owned()));
    }
    if content_type == "image/webp"
        && !(head.starts_with(b"RIFF") && head.get(8..12) == Some(b"WEBP"))
    {
        return Err(UploadError::Mismatch(content_type.to_owned()));
    }
    file.sync_all().await?;
    Ok(size)
}

/// Every upload described in `dir`.
async fn stored(dir: &Path) -> Vec<Upload> {
    let mut uploads = Vec::new();
    let Ok(mut entries) = tokio::fs::read_dir(dir).await else {
        return uploads;
    };
    while let Ok(Some(entry)) = entries.next_entry().await {
        let path = entry.path();
        if path.extension().is_some_and(|x| x == "json")
            && let Some(upload) = read_description(&path).await
            && valid_id(&upload.id)
        {
            uploads.push(upload);
        }
    }
    uploads
}

async fn read_description(path: &Path) -> Option<Upload> {
    let text = tokio::fs::read(path).await.ok()?;
    serde_json::from_slice(&text).ok()
}

/// Writes `upload`'s description in `dir` whole or not at all.
async fn write_description(dir: &Path, upload: &Upload) -> io::Result<()> {
    let json = serde_json::to_vec(upload).map_err(io::Error::other)?;
    let temporary = dir.join(format!("{}.json.tmp", upload.id));
    tokio::fs::write(&temporary, json).await?;
    tokio::fs::rename(&temporary, dir.join(format!("{}.json", upload.id))).await
}

/// Removes upload `id`'s description first (then nothing names the file), then its file.
async fn remove(dir: &Path, id: &str) {
    let _ = tokio::fs::remove_file(dir.join(format!("{id}.json"))).await;
    let _ = tokio::fs::remove_file(dir.join(id)).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uploads(types: &[&str]) -> Uploads {
        Uploads::new(
            PathBuf::from("/nonexistent"),
            "/agui",
            UploadLimits {
                types: types.iter().map(|t| (*t).to_owned()).collect(),
                ..UploadLimits::default()
            },
        )
    }

    #[test]
    fn an_upload_url_is_its_path_under_the_namespace_on_any_host() {
        let u = uploads(&[]);
        let id = "0123456789abcdef0123456789abcdef";
        for url in [
            format!("https://example.test/agui/uploads/{id}"),
            format!("http://127.0.0.1:8443/agui/uploads/{id}?x=1"),
            format!("/agui/uploads/{id}"),
        ] {
            assert_eq!(u.id_in(&url).as_deref(), Some(id), "{url}");
        }
        for url in [
            format!("ftp://example.test/agui/uploads/{id}"),
            format!("https://example.test/other/uploads/{id}"),
            format!("https://example.test/agui/uploads/{id}/x"),
            "https://example.test/agui/uploads/../../etc/passwd".to_owned(),
            format!("https://example.test/agui/uploads/{}", id.to_uppercase()),
            "https://example.test".to_owned(),
            // The path is in the query: the URL names no upload.
            format!("https://example.test?x=/agui/uploads/{id}"),
            format!("https://example.test#/agui/uploads/{id}"),
        ] {
            assert_eq!(u.id_in(&url), None, "{url}");
        }
    }

    #[test]
    fn content_types_are_matched_by_essence_and_pattern() {
        let u = uploads(&["image/png", "audio/*"]);
        assert_eq!(
            u.accepted_type("image/png").ok().as_deref(),
            Some("image/png")
        );
        assert_eq!(
            u.accepted_type("Image/PNG; x=1").ok().as_deref(),
            Some("image/png")
        );
        assert_eq!(
            u.accepted_type("audio/ogg").ok().as_deref(),
            Some("audio/ogg")
        );
        for refused in [
            "image/gif",
            "audio",
            "audiox/ogg",
            "",
            "text/html",
            "audio/ogg/x",
            // A wildcard admits no type a browser runs or renders as a document.
            "audio/html",
            "audio/x-javascript",
            "audio/svg+xml",
            "audio/",
        ] {
            assert!(u.accepted_type(refused).is_err(), "{refused}");
        }
        let video = uploads(DEFAULT_TYPES);
        assert!(video.accepted_type("video/html").is_err());
        assert!(video.accepted_type("video/mp4").is_ok());
        assert!(video.accepted_type("video/x-matroska").is_ok());
    }

    #[tokio::test]
    async fn a_put_costs_the_same_however_many_uploads_there_are() {
        let root = std::env::temp_dir().join(format!("agui-uploads-ledger-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let uploads = Uploads::new(
            root.clone(),
            "/agui",
            UploadLimits {
                quota: 4_000 * 8 + 4,
                ..UploadLimits::default()
            },
        );
        let body = || http_body_util::Full::new(Bytes::from_static(b"8 bytes!"));
        let mut ids = Vec::new();
        for _ in 0..4_000 {
            let upload = uploads
                .put("carol", "text/plain", None, Some(8), body())
                .await
                .expect("stored");
            ids.push(upload.id);
        }
        // One listing, at the first put: none of the next 3,999 read the directory.
        assert_eq!(uploads.listings(), 1);
        // The ledger kept the count: the quota is met where the files say.
        assert!(matches!(
            uploads
                .put("carol", "text/plain", None, Some(8), body())
                .await,
            Err(UploadError::OverQuota(_))
        ));
        assert!(uploads.delete("carol", &ids[0]).await);
        uploads
            .put("carol", "text/plain", None, Some(8), body())
            .await
            .expect("room again after a delete");
        assert_eq!(uploads.listings(), 1);
        let _ = std::fs::remove_dir_all(&root);
    }
}
