//! The content parts of messages that name uploads: their URLs read and rewritten, and a
//! run's uploads put in place of the links that name them.

use std::collections::HashMap;

use crate::protocol::Message;
use crate::protocol::input::{BinaryPart, Content, ContentPart, DataSource, MediaSource};

use super::Upload;

/// The uploads a run's messages name, read (see [`Uploads::resolve`]).
#[derive(Debug, Default)]
pub struct Resolved {
    /// By the URL the part gave: the upload, its bytes in base64.
    pub(super) found: HashMap<String, (Upload, std::sync::Arc<String>)>,
}

impl Resolved {
    pub fn is_empty(&self) -> bool {
        self.found.is_empty()
    }

    /// `messages` with every part that names an upload carrying its data instead.
    pub fn apply(&self, messages: &mut [Message]) {
        if self.found.is_empty() {
            return;
        }
        for part in user_parts_mut(messages) {
            let Some((upload, data)) = part_url(part).and_then(|url| self.found.get(url)) else {
                continue;
            };
            match part {
                ContentPart::Image(media)
                | ContentPart::Audio(media)
                | ContentPart::Video(media)
                | ContentPart::Document(media) => {
                    media.source = MediaSource::Data(DataSource {
                        value: data.to_string(),
                        mime_type: upload.content_type.clone(),
                    });
                    if upload.filename.is_some() && media.metadata.is_none() {
                        media.metadata = Some(serde_json::json!({"filename": upload.filename}));
                    }
                }
                ContentPart::Binary(binary) => {
                    *binary = BinaryPart {
                        mime_type: upload.content_type.clone(),
                        data: Some(data.to_string()),
                        url: None,
                        id: None,
                        filename: binary.filename.clone().or(upload.filename.clone()),
                    };
                }
                ContentPart::Text(_) => {}
            }
        }
    }
}

/// The URL a part names, if it names one.
pub(super) fn part_url(part: &ContentPart) -> Option<&str> {
    match part {
        ContentPart::Image(media)
        | ContentPart::Audio(media)
        | ContentPart::Video(media)
        | ContentPart::Document(media) => match &media.source {
            MediaSource::Url(linked) => Some(&linked.value),
            _ => None,
        },
        ContentPart::Binary(binary) if binary.data.is_none() => binary.url.as_deref(),
        _ => None,
    }
}

/// Every content part of the user messages in `messages`.
pub(super) fn user_parts_mut(messages: &mut [Message]) -> impl Iterator<Item = &mut ContentPart> {
    messages
        .iter_mut()
        .filter_map(|message| match message {
            Message::User(user) => match &mut user.content {
                Content::Parts(parts) => Some(parts.iter_mut()),
                _ => None,
            },
            _ => None,
        })
        .flatten()
}

/// The URL a part names, to change it.
pub(super) fn part_url_mut(part: &mut ContentPart) -> Option<&mut String> {
    match part {
        ContentPart::Image(media)
        | ContentPart::Audio(media)
        | ContentPart::Video(media)
        | ContentPart::Document(media) => match &mut media.source {
            MediaSource::Url(linked) => Some(&mut linked.value),
            _ => None,
        },
        ContentPart::Binary(binary) if binary.data.is_none() => binary.url.as_mut(),
        _ => None,
    }
}

/// `url` without its query and fragment.
pub(super) fn plain(url: &str) -> &str {
    url.split(['?', '#']).next().unwrap_or(url)
}

/// The top-level type a part's data must have (`None`: any).
pub(super) fn media_kind(part: &ContentPart) -> Option<&'static str> {
    match part {
        ContentPart::Image(_) => Some("image"),
        ContentPart::Audio(_) => Some("audio"),
        ContentPart::Video(_) => Some("video"),
        _ => None,
    }
}
