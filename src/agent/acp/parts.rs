//! One part of a user message as the ACP content block the agent's `promptCapabilities`
//! allow, or refused with a reason the client can act on. Never dropped.
//!
//! | AG-UI part | ACP block | needs |
//! |---|---|---|
//! | `text` | `text` | nothing (every agent) |
//! | `image` with data (a `binary` part of an `image/*` type) | `image` | `image` |
//! | `audio` with data (a `binary` part of an `audio/*` type) | `audio` | `audio` |
//! | `video`, `document`, any other `binary` with data | `resource`: a text resource for a text type (`text/*`, JSON, XML, YAML, ...) whose data is UTF-8, else a blob resource, with the `mimeType` | `embeddedContext` |
//! | any part with a URL | `resource_link` (`name`: the file name, else the URL's last path segment; `mimeType` when given) | nothing (every agent) |
//! | any part with a `file` source, or a `binary` part with only an `id` | refused: a file id names a file only the client can read | |
//!
//! A `data:` URL is data, not a link: its bytes go as the part's data would. An image URL
//! is a resource link, not an `image` block: ACP's `ImageContent` requires the base64
//! `data`, its `uri` only says where that data came from. Inline data has no address of
//! its own; its resource's `uri` is `agui:message/<message id>/content/<part index>`
//! (with `/<file name>` when the part names one).

use agent_client_protocol::v1::schema::{
    AudioContent, BlobResourceContents, ContentBlock, EmbeddedResource, EmbeddedResourceResource,
    ImageContent, PromptCapabilities, ResourceLink, TextContent, TextResourceContents,
};
use base64::Engine as _;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};

use crate::protocol::input::{BinaryPart, ContentPart, MediaPart, MediaSource};

/// What a segment of an inline data `uri` keeps as it is: RFC 3986's unreserved characters.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Why a part cannot go to the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Refusal {
    /// The part, in words: `an audio part (audio/wav)`.
    what: String,
    why: Why,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Why {
    /// The agent did not say it takes this block.
    Lacks(Capability),
    /// A file id: nothing the daemon can read or the agent can reach.
    FileId,
    /// A `binary` part with neither data, a URL nor an id.
    Empty,
}

/// A prompt capability a block needs (`text` and `resource_link` need none: every ACP
/// agent takes them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Capability {
    Image,
    Audio,
    EmbeddedContext,
}

impl Capability {
    /// Whether an agent with `capabilities` has it.
    fn met_by(self, capabilities: &PromptCapabilities) -> bool {
        match self {
            Capability::Image => capabilities.image,
            Capability::Audio => capabilities.audio,
            Capability::EmbeddedContext => capabilities.embedded_context,
        }
    }
}

impl Refusal {
    /// The reason, for the client, naming agent `agent`.
    pub(super) fn reason(&self, agent: &str) -> String {
        let what = &self.what;
        match self.why {
            Why::Lacks(capability) => {
                let (blocks, capability) = match capability {
                    Capability::Image => ("images", "image"),
                    Capability::Audio => ("audio", "audio"),
                    Capability::EmbeddedContext => ("embedded files", "embeddedContext"),
                };
                format!(
                    "{what}: agent {agent:?} does not accept {blocks} (its ACP \
                     promptCapabilities.{capability} is false); send it as a URL, which \
                     goes as a link, or leave it out"
                )
            }
            Why::FileId => format!(
                "{what}: a file id names a file only the client can read; send the file's \
                 data or a URL"
            ),
            Why::Empty => format!("{what}: the part has no data, URL or id"),
        }
    }
}

/// Whether `part` can go to an agent with `capabilities`; with `None` (not known yet),
/// only what no agent can take is refused.
pub(super) fn check(
    part: &ContentPart,
    capabilities: Option<&PromptCapabilities>,
) -> Result<(), Refusal> {
    checked(part, capabilities).map(|_| ())
}

/// The block of `part`, the `index`th part of message `message_id`, for an agent with
/// `capabilities`.
pub(super) fn block(
    part: &ContentPart,
    message_id: &str,
    index: usize,
    capabilities: &PromptCapabilities,
) -> Result<ContentBlock, Refusal> {
    Ok(match checked(part, Some(capabilities))? {
        Carried::Text(text) => ContentBlock::Text(TextContent::new(text)),
        Carried::Inline {
            class: Class::Image,
            data,
            mime_type,
            ..
        } => ContentBlock::Image(ImageContent::new(data.base64(), mime_type)),
        Carried::Inline {
            class: Class::Audio,
            data,
            mime_type,
            ..
        } => ContentBlock::Audio(AudioContent::new(data.base64(), mime_type)),
        Carried::Inline {
            class: Class::Resource,
            data,
            mime_type,
            filename,
        } => resource(&data, mime_type, inline_uri(message_id, index, filename)),
        Carried::Link {
            url,
            mime_type,
            filename,
        } => ContentBlock::ResourceLink(
            ResourceLink::new(filename.unwrap_or_else(|| link_name(url)), url)
                .mime_type(mime_type.map(str::to_owned)),
        ),
    })
}

/// What `part` carries, when an agent with `capabilities` (`None`: any agent) takes it.
fn checked<'a>(
    part: &'a ContentPart,
    capabilities: Option<&PromptCapabilities>,
) -> Result<Carried<'a>, Refusal> {
    let carried = carried(part)?;
    if let Some(needs) = carried.needs()
        && capabilities.is_some_and(|c| !needs.met_by(c))
    {
        return Err(Refusal {
            what: describe(part),
            why: Why::Lacks(needs),
        });
    }
    Ok(carried)
}

/// What a part carries, whichever shape it came in (an AG-UI 1.0 media part or the
/// pre-1.0 `binary` part).
enum Carried<'a> {
    Text(&'a str),
    Inline {
        class: Class,
        data: Data<'a>,
        mime_type: &'a str,
        filename: Option<&'a str>,
    },
    Link {
        url: &'a str,
        mime_type: Option<&'a str>,
        filename: Option<&'a str>,
    },
}

/// Which block inline data becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Image,
    Audio,
    Resource,
}

/// Inline bytes: base64, or the percent-encoded payload of a `data:` URL without `;base64`.
enum Data<'a> {
    Base64(&'a str),
    Percent(&'a str),
}

impl Carried<'_> {
    fn needs(&self) -> Option<Capability> {
        match self {
            Carried::Text(_) | Carried::Link { .. } => None,
            Carried::Inline { class, .. } => Some(match class {
                Class::Image => Capability::Image,
                Class::Audio => Capability::Audio,
                Class::Resource => Capability::EmbeddedContext,
            }),
        }
    }
}

impl Data<'_> {
    /// The bytes as base64.
    fn base64(&self) -> String {
        match self {
            Data::Base64(data) => (*data).to_owned(),
            Data::Percent(data) => base64::engine::general_purpose::STANDARD
                .encode(percent_decode_str(data).collect::<Vec<u8>>()),
        }
    }

    /// The bytes as text, when they are UTF-8 (and, for base64, decode).
    fn text(&self) -> Option<String> {
        let bytes = match self {
            Data::Base64(data) => base64::engine::general_purpose::STANDARD
                .decode(data)
                .ok()?,
            Data::Percent(data) => percent_decode_str(data).collect(),
        };
        String::from_utf8(bytes).ok()
    }
}

/// What `part` carries, or why no agent can take it.
fn carried(part: &ContentPart) -> Result<Carried<'_>, Refusal> {
    let carried = match part {
        ContentPart::Text(part) => Some(Carried::Text(&part.text)),
        ContentPart::Image(media) => from_media(media, Class::Image),
        ContentPart::Audio(media) => from_media(media, Class::Audio),
        ContentPart::Video(media) | ContentPart::Document(media) => {
            from_media(media, Class::Resource)
        }
        ContentPart::Binary(binary) => from_binary(binary),
    };
    carried.ok_or_else(|| Refusal {
        what: describe(part),
        why: match part {
            ContentPart::Binary(BinaryPart { id: None, .. }) => Why::Empty,
            _ => Why::FileId,
        },
    })
}

/// A media part's data or URL (`None`: a file id).
fn from_media(media: &MediaPart, class: Class) -> Option<Carried<'_>> {
    match &media.source {
        MediaSource::Data(data) => Some(Carried::Inline {
            class,
            data: Data::Base64(&data.value),
            mime_type: &data.mime_type,
            filename: None,
        }),
        MediaSource::Url(link) => Some(from_url(
            class,
            &link.value,
            link.mime_type.as_deref(),
            None,
        )),
        MediaSource::File(_) => None,
    }
}

/// A `binary` part's data or URL, an image or audio by its type, else a resource
/// (`None`: only an id, or nothing).
fn from_binary(binary: &BinaryPart) -> Option<Carried<'_>> {
    let mime_type = binary.mime_type.to_ascii_lowercase();
    let class = if mime_type.starts_with("image/") {
        Class::Image
    } else if mime_type.starts_with("audio/") {
        Class::Audio
    } else {
        Class::Resource
    };
    let filename = binary.filename.as_deref();
    match (&binary.data, &binary.url) {
        (Some(data), _) => Some(Carried::Inline {
            class,
            data: Data::Base64(data),
            mime_type: &binary.mime_type,
            filename,
        }),
        (None, Some(url)) => Some(from_url(class, url, Some(&binary.mime_type), filename)),
        (None, None) => None,
    }
}

/// A URL: a link, or the data of a `data:` URL (of its own type, else `mime_type`, else
/// `text/plain` as RFC 2397 says).
fn from_url<'a>(
    class: Class,
    url: &'a str,
    mime_type: Option<&'a str>,
    filename: Option<&'a str>,
) -> Carried<'a> {
    let Some((own_type, data)) = data_url(url) else {
        return Carried::Link {
            url,
            mime_type,
            filename,
        };
    };
    let mime_type = Some(own_type)
        .filter(|t| !t.is_empty())
        .or(mime_type)
        .unwrap_or("text/plain");
    Carried::Inline {
        class,
        data,
        mime_type,
        filename,
    }
}

/// A `data:[<type>][;base64],<payload>` URL's type and payload.
fn data_url(url: &str) -> Option<(&str, Data<'_>)> {
    let scheme = url.get(..5)?;
    if !scheme.eq_ignore_ascii_case("data:") {
        return None;
    }
    let (meta, payload) = url[5..].split_once(',')?;
    let base64 = meta.len() >= 7 && meta[meta.len() - 7..].eq_ignore_ascii_case(";base64");
    if base64 {
        Some((&meta[..meta.len() - 7], Data::Base64(payload)))
    } else {
        Some((meta, Data::Percent(payload)))
    }
}

/// A resource of inline data: text for a text type whose bytes are UTF-8, else a blob.
fn resource(data: &Data<'_>, mime_type: &str, uri: String) -> ContentBlock {
    let text = if is_text(mime_type) {
        data.text()
    } else {
        None
    };
    let resource = match text {
        Some(text) => EmbeddedResourceResource::TextResourceContents(
            TextResourceContents::new(text, uri).mime_type(mime_type.to_owned()),
        ),
        None => EmbeddedResourceResource::BlobResourceContents(
            BlobResourceContents::new(data.base64(), uri).mime_type(mime_type.to_owned()),
        ),
    };
    ContentBlock::Resource(EmbeddedResource::new(resource))
}

/// Whether `mime_type` names text: `text/*`, JSON, XML, YAML, TOML, JavaScript, SQL, and
/// the `+json` / `+xml` types.
fn is_text(mime_type: &str) -> bool {
    let essence = mime_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence.starts_with("text/")
        || essence.ends_with("+json")
        || essence.ends_with("+xml")
        || matches!(
            essence.as_str(),
            "application/json"
                | "application/xml"
                | "application/yaml"
                | "application/x-yaml"
                | "application/toml"
                | "application/javascript"
                | "application/sql"
                | "application/x-sh"
        )
}

/// The `uri` of inline data: `agui:message/<id>/content/<index>[/<file name>]`.
fn inline_uri(message_id: &str, index: usize, filename: Option<&str>) -> String {
    let mut uri = format!(
        "agui:message/{}/content/{index}",
        utf8_percent_encode(message_id, SEGMENT)
    );
    if let Some(filename) = filename {
        uri.push('/');
        uri.extend(utf8_percent_encode(filename, SEGMENT));
    }
    uri
}

/// A link's name: the last segment of the URL's path, else the URL.
fn link_name(url: &str) -> &str {
    let path = url.split(['?', '#']).next().unwrap_or(url);
    let path = path.split_once("://").map_or(path, |(_, rest)| {
        rest.split_once('/').map_or("", |(_, path)| path)
    });
    path.rsplit('/').find(|s| !s.is_empty()).unwrap_or(url)
}

/// A part in words, for a refusal: `a document part (application/pdf)`.
fn describe(part: &ContentPart) -> String {
    let (article, kind, mime_type) = match part {
        ContentPart::Text(_) => ("a", "text", None),
        ContentPart::Image(media) => ("an", "image", media_type(media)),
        ContentPart::Audio(media) => ("an", "audio", media_type(media)),
        ContentPart::Video(media) => ("a", "video", media_type(media)),
        ContentPart::Document(media) => ("a", "document", media_type(media)),
        ContentPart::Binary(binary) => ("a", "binary", Some(binary.mime_type.as_str())),
    };
    match mime_type {
        Some(mime_type) => format!("{article} {kind} part ({mime_type})"),
        None => format!("{article} {kind} part"),
    }
}

fn media_type(media: &MediaPart) -> Option<&str> {
    match &media.source {
        MediaSource::Data(data) => Some(&data.mime_type),
        MediaSource::Url(link) | MediaSource::File(link) => link.mime_type.as_deref(),
    }
}

#[cfg(test)]
mod tests;
