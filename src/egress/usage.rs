//! The usage a model bills, read from its answers as they pass through a relay: Anthropic's
//! Messages (`message_start` and `message_delta` events, or the `usage` of a whole answer)
//! and OpenAI's Responses (`response.completed`) and Chat Completions (`usage`). Read as
//! the answer streams, so a budget acts while the model is still answering.

use serde::Serialize;
use serde_json::Value;

/// Tokens a model billed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelUsage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Input read from the model's cache (counted in `input_tokens` by OpenAI, beside it by
    /// Anthropic).
    pub cache_read_tokens: u64,
    /// Input written to the model's cache (Anthropic).
    pub cache_write_tokens: u64,
    /// Everything billed: what a token budget counts.
    pub total_tokens: u64,
}

impl ModelUsage {
    pub fn add(&mut self, other: &ModelUsage) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.cache_read_tokens += other.cache_read_tokens;
        self.cache_write_tokens += other.cache_write_tokens;
        self.total_tokens += other.total_tokens;
    }

    pub fn is_zero(&self) -> bool {
        *self == ModelUsage::default()
    }

    /// What `self` (later, cumulative) adds to `before`.
    fn since(&self, before: &ModelUsage) -> ModelUsage {
        ModelUsage {
            input_tokens: self.input_tokens.saturating_sub(before.input_tokens),
            output_tokens: self.output_tokens.saturating_sub(before.output_tokens),
            cache_read_tokens: self
                .cache_read_tokens
                .saturating_sub(before.cache_read_tokens),
            cache_write_tokens: self
                .cache_write_tokens
                .saturating_sub(before.cache_write_tokens),
            total_tokens: self.total_tokens.saturating_sub(before.total_tokens),
        }
    }
}

/// The longest event line, and the largest whole answer, read for usage (the answer passes
/// through whatever its size; only its usage may go unread past these).
const MAX_LINE: usize = 1 << 20;
const MAX_BODY: usize = 8 << 20;

/// Reads one answer's usage as its bytes pass.
#[derive(Debug)]
pub struct UsageTap {
    stream: bool,
    buffer: Vec<u8>,
    overflow: bool,
    /// The answer's usage so far (cumulative), and how much of it was handed out.
    seen: ModelUsage,
    reported: ModelUsage,
    /// Bytes of generated content streamed (text, tool input, thinking), and whether the
    /// model has said its final count: a stream cut before it is billed by these bytes.
    generated: u64,
    counted: bool,
}

impl UsageTap {
    /// A tap for an answer of `content_type`.
    pub fn new(content_type: Option<&str>) -> UsageTap {
        UsageTap {
            stream: content_type.is_some_and(|t| t.starts_with("text/event-stream")),
            buffer: Vec::new(),
            overflow: false,
            seen: ModelUsage::default(),
            reported: ModelUsage::default(),
            generated: 0,
            counted: false,
        }
    }

    /// Takes the next bytes; usage newly billed, when some is.
    pub fn feed(&mut self, bytes: &[u8]) -> Option<ModelUsage> {
        if !self.stream {
            if self.buffer.len() + bytes.len() > MAX_BODY {
                self.overflow = true;
                self.buffer = Vec::new();
            } else if !self.overflow {
                self.buffer.extend_from_slice(bytes);
            }
            return None;
        }
        for &byte in bytes {
            if byte == b'\n' {
                if !self.overflow {
                    let line = std::mem::take(&mut self.buffer);
                    self.line(&line);
                }
                self.buffer.clear();
                self.overflow = false;
            } else if self.buffer.len() < MAX_LINE {
                self.buffer.push(byte);
            } else {
                self.overflow = true;
            }
        }
        self.fresh()
    }

    /// The answer ended: what is left (a whole JSON answer's usage).
    pub fn finish(&mut self) -> Option<ModelUsage> {
        if !self.stream && !self.overflow {
            if let Ok(answer) = serde_json::from_slice::<Value>(&self.buffer) {
                self.seen = read_usage(&answer["usage"], &self.seen);
            }
        } else if self.stream && !self.overflow && !self.buffer.is_empty() {
            let line = std::mem::take(&mut self.buffer);
            self.line(&line);
        }
        // Cut before the model gave its final count: what it streamed, about 4 bytes a
        // token, at least.
        if self.stream && !self.counted && self.generated > 0 {
            let estimate = self.generated.div_ceil(4);
            if estimate > self.seen.output_tokens {
                self.seen.total_tokens += estimate - self.seen.output_tokens;
                self.seen.output_tokens = estimate;
            }
        }
        self.buffer = Vec::new();
        self.fresh()
    }

    fn fresh(&mut self) -> Option<ModelUsage> {
        let new = self.seen.since(&self.reported);
        self.reported = self.seen;
        (!new.is_zero()).then_some(new)
    }

    /// One line of an event stream.
    fn line(&mut self, line: &[u8]) {
        let Some(data) = line.strip_prefix(b"data:") else {
            return;
        };
        let Ok(event) = serde_json::from_slice::<Value>(data.trim_ascii()) else {
            return;
        };
        let kind = event["type"].as_str().unwrap_or("");
        if kind == "content_block_delta" {
            let delta = &event["delta"];
            for field in ["text", "partial_json", "thinking"] {
                self.generated += delta[field].as_str().map_or(0, |t| t.len() as u64);
            }
        } else if kind == "response.output_text.delta"
            || kind == "response.function_call_arguments.delta"
        {
            self.generated += event["delta"].as_str().map_or(0, |t| t.len() as u64);
        }
        if matches!(
            kind,
            "message_delta" | "response.completed" | "response.incomplete" | "response.failed"
        ) || event.get("usage").is_some_and(Value::is_object) && kind.is_empty()
        {
            self.counted = true;
        }
        let usage = match event["type"].as_str() {
            Some("message_start") => &event["message"]["usage"],
            Some("message_delta") => &event["usage"],
            Some("response.completed" | "response.incomplete" | "response.failed") => {
                &event["response"]["usage"]
            }
            // Chat Completions: the last chunk, when the request asked for usage.
            _ => &event["usage"],
        };
        self.seen = read_usage(usage, &self.seen);
    }
}

/// `usage` (either provider's fields) over `before`: each field present replaces its
/// value (the providers' counts are cumulative within an answer).
fn read_usage(usage: &Value, before: &ModelUsage) -> ModelUsage {
    if !usage.is_object() {
        return *before;
    }
    let field = |names: &[&str], old: u64| {
        names
            .iter()
            .find_map(|name| usage[*name].as_u64())
            .unwrap_or(old)
    };
    let openai = usage.get("total_tokens").is_some()
        || usage.get("prompt_tokens").is_some()
        || usage.get("input_tokens_details").is_some();
    let mut next = ModelUsage {
        input_tokens: field(&["input_tokens", "prompt_tokens"], before.input_tokens),
        output_tokens: field(
            &["output_tokens", "completion_tokens"],
            before.output_tokens,
        ),
        cache_read_tokens: field(&["cache_read_input_tokens"], before.cache_read_tokens),
        cache_write_tokens: field(&["cache_creation_input_tokens"], before.cache_write_tokens),
        total_tokens: 0,
    };
    if openai {
        let details = usage
            .get("input_tokens_details")
            .or_else(|| usage.get("prompt_tokens_details"));
        if let Some(cached) = details.and_then(|d| d["cached_tokens"].as_u64()) {
            next.cache_read_tokens = cached;
        }
        next.total_tokens = field(&["total_tokens"], next.input_tokens + next.output_tokens);
    } else {
        next.total_tokens = next.input_tokens
            + next.output_tokens
            + next.cache_read_tokens
            + next.cache_write_tokens;
    }
    next
}
