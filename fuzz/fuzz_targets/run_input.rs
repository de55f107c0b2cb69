//! The `RunAgentInput` decoder: never panics; a body it accepts re-encodes to JSON it
//! accepts again with the same messages (compared by id and role: floats inside free-form
//! JSON need not survive a round trip bit for bit), and an error always has a message (and,
//! when it names a field, a non-empty one).
#![no_main]

use agui_serve::protocol::decode_run_input;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|body: &[u8]| {
    match decode_run_input(body) {
        Ok(input) => {
            let messages = serde_json::to_value(&input.messages).expect("messages serialize");
            let again = serde_json::json!({
                "threadId": input.thread_id,
                "runId": input.run_id,
                "messages": messages,
            });
            let decoded = decode_run_input(again.to_string().as_bytes())
                .expect("a decoded input's messages decode again");
            let shape = |messages: &[agui_serve::protocol::Message]| {
                messages
                    .iter()
                    .map(|m| (m.id().to_owned(), m.role()))
                    .collect::<Vec<_>>()
            };
            assert_eq!(shape(&decoded.messages), shape(&input.messages));
        }
        Err(error) => {
            assert!(!error.message.is_empty());
            assert!(error.field.as_deref() != Some(""));
        }
    }
});
